//! Workspaces: registration, the worktrees drover makes, and archiving a workspace.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use jiff::Timestamp;
use serde::Serialize;

use super::archive::ArchivePlan;
use super::{Change, Home, Inner, NewAgent, Registry, existing_dir, lock, read, write};
use crate::agent::Agent;
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::workspace::{Workspace, WorkspaceKind};
use crate::worktree::WorktreeOptions;
use crate::worktree::{self, CommandRun, WorktreeError, WorktreeRemoval, WorktreeStatusInfo};

/// A worktree made by [`Registry::create_worktree_workspace`], or the one an agent was given
/// by [`Registry::create_agent_in_worktree`].
#[derive(Debug, Clone)]
pub struct CreatedWorktree {
    /// The `worktree` workspace; its `worktree` field says where it comes from.
    pub workspace: Workspace,
    /// The project file's setup commands as they ran, with their output (none when reused).
    pub setup: Vec<CommandRun>,
    /// Not made: the worktree of that name drover made earlier for the project, which no
    /// live agent held, with its branch and what it holds (uncommitted work too).
    pub reused: bool,
}

/// What [`Registry::archive_workspace`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceArchiveOutcome {
    pub workspace_id: WorkspaceId,
    pub archived_at: Option<Timestamp>,
    /// The workspace was archived before this call, which therefore did nothing.
    pub already_archived: bool,
    /// Every agent newly archived: the workspace's agents and their cascades.
    pub agents: Vec<AgentId>,
    /// For a worktree drover made: what removing it did.
    pub worktree: Option<WorktreeRemoval>,
}

/// One unarchived worktree workspace as [`Registry::check_worktrees`] found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeCheck {
    pub workspace_id: WorkspaceId,
    pub path: PathBuf,
    /// The folder vanished outside drover.
    pub missing: bool,
}

/// Where drover makes worktrees, under the home: `worktrees/<project>/<name>`.
pub const WORKTREES_DIR: &str = "worktrees";

impl Registry {
    /// Registers a workspace for a directory (another one, if the directory has some already).
    pub async fn register_workspace(
        &self,
        path: PathBuf,
        kind: Option<WorkspaceKind>,
    ) -> Result<Workspace, RegistryError> {
        self.blocking(move |inner| {
            let path = existing_dir(&path)?;
            let _w = lock(&inner.writer);
            let ws = new_workspace(WorkspaceId::new(), &path, kind);
            inner.store.write_workspace(&ws)?;
            let mut state = write(&inner.state);
            state.workspaces.insert(ws.id, ws.clone());
            inner.emit(
                &mut state,
                Change::WorkspaceRegistered(Box::new(ws.clone())),
            );
            Ok(ws)
        })
        .await
    }

    /// Creates an agent in a new git worktree of the checkout at `source` (see
    /// [`Registry::create_worktree_workspace`]), labelled [`CREATED_WORKSPACE_LABEL`](super::CREATED_WORKSPACE_LABEL) so that
    /// its `autoArchive` takes the worktree with it. `new.cwd` and `new.workspace_id` are
    /// ignored. Everything about the agent is checked before the worktree is made, and a
    /// worktree whose agent could not be recorded is removed again (folder, branch and
    /// workspace record): a failure leaves nothing behind.
    ///
    /// A name (`options.name`) that is the worktree drover made earlier for the same project
    /// (an unarchived worktree workspace at that folder) is that worktree: when no live agent
    /// works in it, the agent gets it, as it is (its branch, its uncommitted work; no setup
    /// runs), `reused` in the answer; when one does, it is refused, naming that agent. Any
    /// other taken name is refused too (see [`worktree::create`]).
    pub async fn create_agent_in_worktree(
        &self,
        new: NewAgent,
        source: PathBuf,
        options: WorktreeOptions,
    ) -> Result<(Agent, CreatedWorktree), RegistryError> {
        self.blocking(move |inner| {
            // Checked again with the record's write; checked here so that a bad request makes
            // no worktree at all.
            inner.check_new_agent(&new)?;
            if let Some(existing) = inner.named_worktree(&source, &options)? {
                return inner.reuse_worktree(new, existing, &options);
            }
            let made = inner.make_worktree(&source, &options)?;
            let setup = made.setup.clone();
            let agent = inner.create_agent(new, Home::Worktree(&made))?;
            let workspace = inner.workspace(agent.workspace_id)?;
            Ok((
                agent,
                CreatedWorktree {
                    workspace,
                    setup,
                    reused: false,
                },
            ))
        })
        .await
    }

    /// Makes a git worktree of the checkout at `source` under
    /// `$DROVER_HOME/worktrees/<project>/<name>` on a new branch (see [`WorktreeOptions`]),
    /// copies the project file's untracked files into it, runs its setup, and registers it as
    /// a `worktree` workspace. A failing setup fails the creation with its output and leaves
    /// nothing behind: no folder, no branch, no record. Git and setup run outside the writer
    /// lock; only the record's write is serialized.
    pub async fn create_worktree_workspace(
        &self,
        source: PathBuf,
        options: WorktreeOptions,
    ) -> Result<CreatedWorktree, RegistryError> {
        self.blocking(move |inner| {
            if let Some(existing) = inner.named_worktree(&source, &options)? {
                return Err(RegistryError::invalid(
                    "name",
                    format!(
                        "worktree `{}` of this project exists already (workspace {}, `{}`): \
                         create agents in it with its folder as their `cwd`, or name another",
                        existing.name,
                        existing.id,
                        existing.path.display()
                    ),
                ));
            }
            let made = inner.make_worktree(&source, &options)?;
            let ws = worktree_workspace(&made);
            let written = {
                let _w = lock(&inner.writer);
                let written = inner.store.write_workspace(&ws);
                if written.is_ok() {
                    let mut state = write(&inner.state);
                    state.workspaces.insert(ws.id, ws.clone());
                    inner.emit(
                        &mut state,
                        Change::WorkspaceRegistered(Box::new(ws.clone())),
                    );
                }
                written
            };
            if let Err(e) = written {
                // No record, so no worktree either.
                worktree::discard(&made);
                return Err(e.into());
            }
            tracing::info!(workspace = %ws.id, path = %ws.path.display(), branch = %made.info.branch,
                "worktree created");
            Ok(CreatedWorktree {
                workspace: ws,
                setup: made.setup,
                reused: false,
            })
        })
        .await
    }

    /// What the worktree of a workspace drover made holds that exists nowhere else:
    /// uncommitted changes, unpushed commits, or whether its folder vanished.
    pub async fn worktree_status(
        &self,
        id: WorkspaceId,
    ) -> Result<WorktreeStatusInfo, RegistryError> {
        self.blocking(move |inner| {
            let ws = inner.workspace(id)?;
            let info = made_worktree(&ws)?;
            Ok(worktree::status(&ws.path, info)?)
        })
        .await
    }

    /// Archives a workspace: for a worktree drover made, refuses (`worktree_dirty`, naming what
    /// is uncommitted or unpushed) unless `force`, runs the project's teardown, removes the
    /// worktree (pruning it when its folder vanished) and deletes its branch only if merged.
    /// Then every unarchived agent of the workspace is archived with `stopActivity` (cascades
    /// included) and the workspace gets `archivedAt`. Records are kept, never deleted. A
    /// refusal or a failed git command changes no record.
    pub async fn archive_workspace(
        &self,
        id: WorkspaceId,
        force: bool,
    ) -> Result<WorkspaceArchiveOutcome, RegistryError> {
        let (result, plans) = self
            .blocking(move |inner| {
                let ws = inner.workspace(id)?;
                if ws.archived_at.is_some() {
                    let outcome = WorkspaceArchiveOutcome {
                        workspace_id: id,
                        archived_at: ws.archived_at,
                        already_archived: true,
                        agents: Vec::new(),
                        worktree: None,
                    };
                    return Ok((Ok(outcome), Vec::new()));
                }
                let _claim = Claim::take(&inner.archiving, id)?;
                let removal = match &ws.worktree {
                    Some(info) => Some(worktree::remove(&ws.path, info, force)?),
                    None => None,
                };
                lock(&inner.missing_reported).remove(&id);
                let _w = lock(&inner.writer);
                let mut plans = Vec::new();
                let result = inner
                    .archive_workspace_records(id, &mut plans)
                    .map(|(ws, agents)| WorkspaceArchiveOutcome {
                        workspace_id: id,
                        archived_at: ws.archived_at,
                        already_archived: false,
                        agents,
                        worktree: removal,
                    });
                Ok((result, plans))
            })
            .await?;
        // Whatever was archived before a failure still gets its stops and closes.
        for plan in plans {
            self.dispatch(plan);
        }
        result
    }

    /// Every unarchived `worktree` workspace, with whether its folder vanished outside drover.
    /// A newly vanished one is logged once; nothing is retried (archive it to prune it).
    pub async fn check_worktrees(&self) -> Result<Vec<WorktreeCheck>, RegistryError> {
        self.blocking(|inner| {
            let candidates: Vec<(WorkspaceId, PathBuf)> = {
                let state = read(&inner.state);
                let mut all: Vec<(WorkspaceId, PathBuf)> = state
                    .workspaces
                    .values()
                    .filter(|w| is_live_worktree(w))
                    .map(|w| (w.id, w.path.clone()))
                    .collect();
                all.sort();
                all
            };
            let mut reported = lock(&inner.missing_reported);
            Ok(candidates
                .into_iter()
                .map(|(id, path)| {
                    let missing = worktree::is_missing(&path);
                    if !missing {
                        reported.remove(&id);
                    } else if reported.insert(id) {
                        tracing::warn!(workspace = %id, path = %path.display(),
                            "the worktree's folder vanished outside drover; archive the workspace to prune it");
                    }
                    WorktreeCheck {
                        workspace_id: id,
                        path,
                        missing,
                    }
                })
                .collect())
        })
        .await
    }
}

impl Inner {
    pub(super) fn workspace(&self, id: WorkspaceId) -> Result<Workspace, RegistryError> {
        read(&self.state)
            .workspaces
            .get(&id)
            .cloned()
            .ok_or_else(|| RegistryError::UnknownWorkspace(id.to_string()))
    }

    /// Archives every unarchived agent of workspace `id` (with `stopActivity`, each with its
    /// cascade; the plans go to `plans` for the caller to dispatch), then the workspace
    /// itself: agents first, so a crash in between leaves a workspace that archives again
    /// cleanly. The caller holds the writer.
    pub(super) fn archive_workspace_records(
        &self,
        id: WorkspaceId,
        plans: &mut Vec<ArchivePlan>,
    ) -> Result<(Workspace, Vec<AgentId>), RegistryError> {
        let mut members: Vec<AgentId> = read(&self.state)
            .agents
            .values()
            .filter(|a| a.workspace_id == id && !a.is_archived())
            .map(|a| a.id)
            .collect();
        // Oldest first: parents before the subagents they made, so one cascade covers both.
        members.sort();
        let mut archived = Vec::new();
        for agent in members {
            let plan = self.archive(agent, true)?;
            archived.extend(plan.archived.iter().copied());
            plans.push(plan);
        }
        let mut ws = self.workspace(id)?;
        let now = Timestamp::now();
        ws.archived_at = Some(now);
        ws.updated_at = now;
        self.store.write_workspace(&ws)?;
        let mut state = write(&self.state);
        state.workspaces.insert(id, ws.clone());
        self.emit(
            &mut state,
            Change::WorkspaceRegistered(Box::new(ws.clone())),
        );
        Ok((ws, archived))
    }
}

pub(super) fn new_workspace(
    id: WorkspaceId,
    path: &Path,
    kind: Option<WorkspaceKind>,
) -> Workspace {
    let now = Timestamp::now();
    Workspace {
        id,
        kind: kind.unwrap_or_else(|| WorkspaceKind::detect(path)),
        path: path.to_path_buf(),
        name: path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        created_at: now,
        updated_at: now,
        archived_at: None,
        worktree: None,
        unknown: serde_json::Map::new(),
    }
}

/// An unarchived workspace that is a linked git worktree.
pub(super) fn is_live_worktree(ws: &Workspace) -> bool {
    ws.kind == WorkspaceKind::Worktree && ws.archived_at.is_none()
}

/// The worktree drover made for `ws`.
fn made_worktree(ws: &Workspace) -> Result<&worktree::WorktreeInfo, RegistryError> {
    ws.worktree.as_ref().ok_or_else(|| {
        RegistryError::invalid(
            "workspaceId",
            format!("workspace `{}` is not a worktree drover made", ws.id),
        )
    })
}

/// A workspace marked as being archived, unmarked when dropped.
struct Claim<'a> {
    set: &'a Mutex<HashSet<WorkspaceId>>,
    id: WorkspaceId,
}

impl<'a> Claim<'a> {
    fn take(set: &'a Mutex<HashSet<WorkspaceId>>, id: WorkspaceId) -> Result<Self, RegistryError> {
        if !lock(set).insert(id) {
            return Err(WorktreeError::Busy(id.to_string()).into());
        }
        Ok(Claim { set, id })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.id);
    }
}

impl Inner {
    /// The checkout at `source` (a directory, its canonical path) and the folder drover's
    /// worktrees go in.
    fn worktree_source(&self, source: &Path) -> Result<(PathBuf, PathBuf), RegistryError> {
        let source = existing_dir(source).map_err(|e| match e {
            RegistryError::InvalidInput { message, .. } => {
                RegistryError::invalid("source", message)
            }
            e => e,
        })?;
        Ok((source, self.store.home().join(WORKTREES_DIR)))
    }

    /// The unarchived workspace at the folder the worktree `options.name` of the checkout at
    /// `source` has (see [`worktree::planned_path`]); `None` without a name or such a workspace.
    fn named_worktree(
        &self,
        source: &Path,
        options: &WorktreeOptions,
    ) -> Result<Option<Workspace>, RegistryError> {
        let Some(name) = options.name.as_deref() else {
            return Ok(None);
        };
        let (source, root) = self.worktree_source(source)?;
        let path = worktree::planned_path(&root, &source, name)?;
        Ok(read(&self.state)
            .workspaces
            .values()
            .find(|w| w.archived_at.is_none() && w.path == path)
            .cloned())
    }

    /// Gives `new` the worktree `ws` drover made earlier (see
    /// [`Registry::create_agent_in_worktree`]): refused while a live agent works in it, when
    /// drover did not make it, when its folder vanished, or for another branch than its own.
    fn reuse_worktree(
        &self,
        mut new: NewAgent,
        ws: Workspace,
        options: &WorktreeOptions,
    ) -> Result<(Agent, CreatedWorktree), RegistryError> {
        let taken = |why: String| RegistryError::invalid("name", why);
        let Some(info) = &ws.worktree else {
            return Err(taken(format!(
                "the folder of worktree `{}` (`{}`) is a workspace drover did not make: name \
                 another worktree",
                ws.name,
                ws.path.display()
            )));
        };
        self.check_worktree_free(&ws)?;
        if let Some(branch) = options.branch.as_deref()
            && branch != info.branch
        {
            return Err(taken(format!(
                "worktree `{}` exists on branch `{}`, not `{branch}`: name another worktree",
                ws.name, info.branch
            )));
        }
        if worktree::is_missing(&ws.path) {
            return Err(taken(format!(
                "the folder of worktree `{}` vanished (`{}`): archive its workspace {} to prune \
                 it, or name another worktree",
                ws.name,
                ws.path.display(),
                ws.id
            )));
        }
        new.workspace_id = Some(ws.id);
        new.cwd.clone_from(&ws.path);
        let agent = self.create_agent(new, Home::ReusedWorktree)?;
        tracing::info!(workspace = %ws.id, path = %ws.path.display(), branch = %info.branch,
            "worktree reused");
        Ok((
            agent,
            CreatedWorktree {
                workspace: ws,
                setup: Vec::new(),
                reused: true,
            },
        ))
    }

    /// Refuses a worktree a live (unarchived) agent works in, naming it and what to do. Checked
    /// before, and again under the writer lock as the reusing agent is recorded, so that of two
    /// agents asking at once for one free worktree only one gets it.
    pub(super) fn check_worktree_free(&self, ws: &Workspace) -> Result<(), RegistryError> {
        let holder = read(&self.state)
            .agents
            .values()
            .filter(|a| a.workspace_id == ws.id && !a.is_archived())
            .min_by_key(|a| a.id)
            .cloned();
        let Some(holder) = holder else {
            return Ok(());
        };
        let title = holder
            .title
            .as_deref()
            .map(|t| format!(" (`{t}`)"))
            .unwrap_or_default();
        Err(RegistryError::invalid(
            "name",
            format!(
                "worktree `{}` is in use by agent {}{title}: name another worktree, or start \
                 the agent beside it in that folder (`cwd` `{}` without `worktree`; `drover run \
                 --cwd`)",
                ws.name,
                holder.id,
                ws.path.display()
            ),
        ))
    }

    /// Makes a git worktree of `source` under `$DROVER_HOME/worktrees`, with its setup run.
    /// Git and setup run outside the writer lock.
    fn make_worktree(
        &self,
        source: &Path,
        options: &WorktreeOptions,
    ) -> Result<worktree::Created, RegistryError> {
        let (source, root) = self.worktree_source(source)?;
        // A vanished worktree's folder stays its workspace's until that is archived.
        let reserved: HashSet<PathBuf> = read(&self.state)
            .workspaces
            .values()
            .filter(|w| w.archived_at.is_none())
            .map(|w| w.path.clone())
            .collect();
        Ok(worktree::create(&root, &source, options, &reserved)?)
    }
}

/// The record of a worktree drover just made.
pub(super) fn worktree_workspace(made: &worktree::Created) -> Workspace {
    let now = Timestamp::now();
    Workspace {
        id: WorkspaceId::new(),
        kind: WorkspaceKind::Worktree,
        path: made.path.clone(),
        name: made.name.clone(),
        created_at: now,
        updated_at: now,
        archived_at: None,
        worktree: Some(made.info.clone()),
        unknown: serde_json::Map::new(),
    }
}
