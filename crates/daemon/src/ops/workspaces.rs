//! Workspaces and the git worktrees drover makes: list them, make a worktree, read what it
//! holds, archive a workspace (removing its worktree).

use std::path::PathBuf;

use drover_core::{
    Agent, CreatedWorktree, Workspace, WorkspaceArchiveOutcome, WorkspaceId, WorktreeOptions,
    WorktreeStatus,
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
        options: WorktreeOptions,
    ) -> Result<CreatedWorktree, OpError> {
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
    pub(crate) async fn worktree_status(&self, id: WorkspaceId) -> Result<WorktreeStatus, OpError> {
        if self.workspace(id)?.worktree.is_none() {
            return Err(OpError::NotAWorktree(id));
        }
        Ok(self.registry.worktree_status(id).await?)
    }

    /// Archives the workspace and its agents, removing a worktree drover made (refused while
    /// it holds uncommitted or unpushed work, unless `force`). An agent may archive a
    /// workspace only when every unarchived agent in it is its own or a descendant.
    pub(crate) async fn archive_workspace(
        &self,
        caller: Caller,
        id: WorkspaceId,
        force: bool,
    ) -> Result<WorkspaceArchiveOutcome, OpError> {
        let ws = self.workspace(id)?;
        let agents: Vec<Agent> = self
            .registry
            .agents()
            .into_iter()
            .filter(|a| a.workspace_id == ws.id && !a.is_archived())
            .collect();
        for agent in &agents {
            self.controlled(caller, agent.id)?;
        }
        Ok(self.registry.archive_workspace(id, force).await?)
    }
}
