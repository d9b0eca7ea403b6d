//! Workspaces and the git worktrees drover makes: list them, make a worktree, read what it
//! holds, archive a workspace (removing its worktree).

use std::path::PathBuf;

use drover_core::{
    Agent, CreatedWorktree, Workspace, WorkspaceArchiveOutcome, WorkspaceId, WorktreeOptions,
    WorktreeStatusInfo,
};

use super::{Caller, OpError, Ops};

impl Ops {
    /// Every workspace, archived ones too if asked.
    pub(crate) fn list_workspaces(&self, include_archived: bool) -> Vec<Workspace> {
        self.registry
            .workspaces()
            .into_iter()
            .filter(|w| include_archived || w.archived_at.is_none())
            .collect()
    }

    /// Makes a git worktree of the checkout at `source` (the calling agent's cwd when absent)
    /// and registers it as a workspace; a failing setup leaves nothing behind.
    pub(crate) async fn create_worktree(
        &self,
        caller: Caller,
        source: Option<PathBuf>,
        mut options: WorktreeOptions,
    ) -> Result<CreatedWorktree, OpError> {
        options.created_by = caller.agent();
        let source = match (source, caller) {
            (Some(source), _) => source,
            (None, Caller::Agent(me)) => self.agent(me)?.cwd,
            (None, Caller::User) => {
                return Err(OpError::invalid("repository", "name the checkout"));
            }
        };
        Ok(self
            .registry
            .create_worktree_workspace(source, options)
            .await?)
    }

    /// What the worktree holds that exists nowhere else.
    pub(crate) async fn worktree_status(
        &self,
        id: WorkspaceId,
    ) -> Result<WorktreeStatusInfo, OpError> {
        if self.workspace(id)?.worktree.is_none() {
            return Err(OpError::NotAWorktree(id));
        }
        Ok(self.registry.worktree_status(id).await?)
    }

    /// Archives the workspace and its agents, removing a worktree drover made (refused while
    /// it holds uncommitted or unpushed work, unless `force`). Only by its owner (see
    /// [`Ops::owned_workspace`]).
    pub(crate) async fn archive_workspace(
        &self,
        caller: Caller,
        id: WorkspaceId,
        force: bool,
    ) -> Result<WorkspaceArchiveOutcome, OpError> {
        self.owned_workspace(caller, id)?;
        let outcome = self.registry.archive_workspace(id, force).await?;
        // Its terminals end with it (`crate::ptys`); the ones an archive by another path
        // leaves are ended by the daemon's watch on workspaces.
        self.ptys.close_workspace(id).await;
        Ok(outcome)
    }

    /// The workspace `id`, if `caller` may change it. A user may change any. An agent may
    /// change a worktree that it or one of its descendants made, or a workspace that holds
    /// agents (archived ones count) all of which it controls; a workspace nobody's agents
    /// are in, made by a user or another lineage, is not an agent's to change.
    pub(crate) fn owned_workspace(
        &self,
        caller: Caller,
        id: WorkspaceId,
    ) -> Result<Workspace, OpError> {
        let ws = self.workspace(id)?;
        let Caller::Agent(me) = caller else {
            return Ok(ws);
        };
        let made_by = ws.worktree.as_ref().and_then(|w| w.created_by);
        if let Some(maker) = made_by
            && (maker == me || self.registry.ancestors(maker).contains(&me))
        {
            return Ok(ws);
        }
        let agents: Vec<Agent> = self
            .registry
            .agents()
            .into_iter()
            .filter(|a| a.workspace_id == ws.id)
            .collect();
        let foreign = agents
            .iter()
            .find(|a| self.controlled(caller, a.id).is_err());
        match (agents.is_empty(), foreign) {
            (false, None) => Ok(ws),
            (_, Some(other)) => Err(OpError::NotPermitted(format!(
                "workspace `{id}` holds agent `{}`, which is not yours: an agent may change only workspaces it made or whose agents are all its own",
                other.id
            ))),
            (true, None) => Err(OpError::NotPermitted(format!(
                "workspace `{id}` was not made by you or your subagents and holds none of your agents"
            ))),
        }
    }
}
