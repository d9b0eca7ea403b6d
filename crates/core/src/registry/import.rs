//! Agents brought in from another tool's records (`drover import`): each gets a new drover id
//! and keeps what its record says of it (times, title, labels, status, archive, resume handle).

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::Timestamp;

use super::{CREATED_WORKSPACE_LABEL, Inner, existing_dir, lock, new_workspace, read};
use crate::agent::{Agent, PARENT_LABEL, ProviderConfig, ResumeHandle};
use crate::error::RegistryError;
use crate::ids::{AgentId, WorkspaceId};
use crate::lifecycle::{AgentStatus, Attention};

/// What an imported agent is made of. Its status is never busy: nothing of it runs here yet.
#[derive(Debug, Clone)]
pub struct ImportedAgent {
    pub provider: String,
    /// Must be an existing directory; stored canonical.
    pub cwd: PathBuf,
    pub workspace: ImportWorkspace,
    pub title: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// An agent already in the registry (imported earlier in the same run, or before).
    pub parent: Option<AgentId>,
    pub status: AgentStatus,
    pub last_error: Option<String>,
    pub attention: Option<Attention>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub last_activity_at: Timestamp,
    pub archived_at: Option<Timestamp>,
    pub config: ProviderConfig,
    pub resume: Option<ResumeHandle>,
}

/// Which workspace an imported agent joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportWorkspace {
    /// The first unarchived workspace registered for its cwd, or a new one.
    OfCwd,
    /// A workspace already registered (the one an earlier import made for its group).
    Existing(WorkspaceId),
    /// A new workspace for its cwd, as its record had one of its own.
    New,
}

impl Inner {
    pub(super) fn import_agent(&self, new: ImportedAgent) -> Result<Agent, RegistryError> {
        if new.provider.trim().is_empty() {
            return Err(RegistryError::invalid("provider", "must not be empty"));
        }
        if new.status.is_busy() {
            return Err(RegistryError::invalid(
                "status",
                format!("an imported agent cannot be `{}`", new.status),
            ));
        }
        for reserved in [PARENT_LABEL, CREATED_WORKSPACE_LABEL] {
            if new.labels.contains_key(reserved) {
                return Err(RegistryError::invalid(
                    "labels",
                    format!("`{reserved}` is set by drover, not as a label"),
                ));
            }
        }
        let cwd = existing_dir(&new.cwd)?;
        let _w = lock(&self.writer);
        if let Some(parent) = new.parent {
            self.agent(parent)?;
        }
        let (workspace, registered) = {
            let state = read(&self.state);
            let of_cwd = || {
                state
                    .workspaces
                    .values()
                    .filter(|w| w.archived_at.is_none() && w.path == cwd)
                    .min_by_key(|w| w.id)
                    .cloned()
            };
            match new.workspace {
                ImportWorkspace::Existing(id) => match state.workspaces.get(&id) {
                    Some(ws) => (ws.clone(), false),
                    None => return Err(RegistryError::UnknownWorkspace(id.to_string())),
                },
                ImportWorkspace::OfCwd => match of_cwd() {
                    Some(ws) => (ws, false),
                    None => (new_workspace(WorkspaceId::new(), &cwd, None), true),
                },
                ImportWorkspace::New => (new_workspace(WorkspaceId::new(), &cwd, None), true),
            }
        };
        let mut labels = new.labels;
        if let Some(parent) = new.parent {
            labels.insert(PARENT_LABEL.to_string(), parent.to_string());
        }
        let agent = Agent {
            id: AgentId::new(),
            provider: new.provider.trim().to_string(),
            cwd,
            workspace_id: workspace.id,
            created_at: new.created_at,
            updated_at: new.updated_at,
            last_activity_at: new.last_activity_at,
            title: new
                .title
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()),
            labels,
            status: new.status,
            last_error: new.last_error,
            archived_at: new.archived_at,
            attention: new.attention,
            auto_archive: false,
            config: new.config,
            resume: new.resume,
            start_failure: None,
            limited: None,
            spend: crate::Spend::default(),
            budget: None,
            unknown: serde_json::Map::new(),
        };
        self.record_new_agent(registered.then_some(workspace), &agent)?;
        Ok(agent)
    }
}
