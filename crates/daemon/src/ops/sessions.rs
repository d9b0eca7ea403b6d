//! Adopting a provider's own sessions: what its agent lists through ACP `session/list` (see
//! `drover_acp::RuntimeManager::provider_sessions`) becomes drover agents whose next message
//! continues the session. Imported agents carry the label `acp.session-id`; a session imported
//! before, or already an agent's own (one drover started), is skipped, so an import run again
//! is harmless. A dry run (the default) reports the same without writing anything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use drover_acp::ProviderSession;
use drover_core::{
    AgentId, AgentStatus, ImportWorkspace, ImportedAgent, ProviderConfig, ResumeHandle,
};
use jiff::Timestamp;

use super::import::{ImportReport, Imported, Skipped};
use super::{OpError, Ops};

/// The label an imported agent keeps its provider's session id in.
pub(crate) const SESSION_LABEL: &str = "acp.session-id";

impl Ops {
    /// Imports the sessions `provider`'s agent lists (those in `cwd` when given; only the ids
    /// in `only` when it is not empty); with `apply` false, reports what it would import and
    /// writes nothing.
    pub(crate) async fn import_sessions(
        &self,
        provider: &str,
        cwd: Option<&Path>,
        only: &[String],
        apply: bool,
    ) -> Result<ImportReport, OpError> {
        if let Some(cwd) = cwd
            && !cwd.is_absolute()
        {
            return Err(OpError::invalid(
                "cwd",
                format!("`{}` is not an absolute path", cwd.display()),
            ));
        }
        let listed = self.runtimes.provider_sessions(provider, cwd).await?;
        let _one_at_a_time = self.imports.lock().await;
        let taken = self.sessions_taken(provider);
        let wanted: HashSet<&str> = only.iter().map(String::as_str).collect();
        let mut report = ImportReport {
            dry_run: !apply,
            ..ImportReport::default()
        };
        for session in &listed {
            if !wanted.is_empty() && !wanted.contains(session.session_id.as_str()) {
                continue;
            }
            let skip = |reason: String| Skipped {
                source: session.session_id.clone(),
                source_id: Some(session.session_id.clone()),
                reason,
            };
            if let Some((agent, imported)) = taken.get(&session.session_id) {
                report.skipped.push(skip(if *imported {
                    format!("already imported as {agent}")
                } else {
                    format!("already the session of agent {agent}")
                }));
                continue;
            }
            let Some(dir) = &session.cwd else {
                report
                    .skipped
                    .push(skip("the agent did not say its directory".to_string()));
                continue;
            };
            if !dir.is_absolute() {
                report.skipped.push(skip(format!(
                    "the agent gave its directory as `{}`, not an absolute path",
                    dir.display()
                )));
                continue;
            }
            if !dir.is_dir() {
                report.skipped.push(skip(format!(
                    "its directory `{}` does not exist any more",
                    dir.display()
                )));
                continue;
            }
            let new = imported_agent(provider, session, dir.clone());
            let mut view = Imported {
                source: session.session_id.clone(),
                source_id: session.session_id.clone(),
                agent_id: None,
                provider: provider.to_string(),
                cwd: dir.clone(),
                title: new.title.clone(),
                status: new.status,
                archived: false,
                parent: None,
                resumes: true,
                note: None,
            };
            if apply {
                match self.registry.import_agent(new).await {
                    Ok(agent) => view.agent_id = Some(agent.id),
                    Err(e) => {
                        report
                            .skipped
                            .push(skip(format!("drover could not record it: {e}")));
                        continue;
                    }
                }
            }
            report.imported.push(view);
        }
        let listed_ids: HashSet<&str> = listed.iter().map(|s| s.session_id.as_str()).collect();
        let mut missing: Vec<&String> = only
            .iter()
            .filter(|id| !listed_ids.contains(id.as_str()))
            .collect();
        missing.sort();
        missing.dedup();
        for id in missing {
            let place = cwd.map_or_else(String::new, |c| format!(" in `{}`", c.display()));
            report.skipped.push(Skipped {
                source: id.clone(),
                source_id: Some(id.clone()),
                reason: format!("the agent of provider `{provider}` lists no such session{place}"),
            });
        }
        Ok(report)
    }
}

impl Ops {
    /// The sessions of `provider` drover has already, with their agent: imported (`true`, by
    /// label), or its own agents' sessions (`false`).
    fn sessions_taken(&self, provider: &str) -> HashMap<String, (AgentId, bool)> {
        let mut taken = HashMap::new();
        for agent in self.registry.agents() {
            if agent.provider != provider {
                continue;
            }
            if let Some(resume) = &agent.resume {
                taken.insert(resume.acp_session_id.clone(), (agent.id, false));
            }
            if let Some(session) = agent.labels.get(SESSION_LABEL) {
                taken.insert(session.clone(), (agent.id, true));
            }
        }
        taken
    }
}

/// The agent a listed session becomes: idle, in the session's directory (its cwd's
/// workspace), titled as listed, continuing the session.
fn imported_agent(provider: &str, session: &ProviderSession, cwd: PathBuf) -> ImportedAgent {
    let now = Timestamp::now();
    let updated_at = session
        .updated_at
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
        .filter(|t| *t <= now)
        .unwrap_or(now);
    ImportedAgent {
        provider: provider.to_string(),
        cwd,
        workspace: ImportWorkspace::OfCwd,
        title: session.title.clone(),
        labels: BTreeMap::from([(SESSION_LABEL.to_string(), session.session_id.clone())]),
        parent: None,
        status: AgentStatus::Idle,
        last_error: None,
        attention: None,
        created_at: updated_at,
        updated_at,
        last_activity_at: updated_at,
        archived_at: None,
        config: ProviderConfig::default(),
        resume: Some(ResumeHandle {
            acp_session_id: session.session_id.clone(),
        }),
    }
}
