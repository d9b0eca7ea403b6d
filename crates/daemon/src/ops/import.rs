//! Adopting existing work: a Paseo home's agent records become drover agents.
//!
//! Paseo keeps one JSON file per agent in `$PASEO_HOME/agents/{cwd-with-dashes}/{id}.json`.
//! Each record that can run here becomes an agent with a new id, keeping its provider, cwd,
//! times, title, labels, status, attention, archive, mode and model, its parent (Paseo's
//! `paseo.parent-agent-id` label) and its session as the resume handle when the session is the
//! provider's own. Records of one Paseo workspace share one new drover workspace; records
//! without one join their cwd's. The source is only read. Imported agents carry the label
//! `paseo.agent-id`, so an import run again skips them: it is idempotent. A dry run (the
//! default) reports the same without writing anything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use drover_core::{
    AgentId, AgentStatus, Attention, AttentionReason, CREATED_WORKSPACE_LABEL, ImportWorkspace,
    ImportedAgent, PARENT_LABEL, ProviderConfig, ResumeHandle, WorkspaceId,
};
use jiff::Timestamp;
use serde::Deserialize;

use super::{OpError, Ops};

/// The label an imported agent keeps its Paseo id in.
pub(crate) const PASEO_AGENT_LABEL: &str = "paseo.agent-id";
/// The label an imported agent keeps its Paseo workspace id in.
pub(crate) const PASEO_WORKSPACE_LABEL: &str = "paseo.workspace-id";
/// Paseo's parent label, replaced by drover's.
const PASEO_PARENT_LABEL: &str = "paseo.parent-agent-id";
/// Records read at most: a home is read whole into one answer.
const MAX_RECORDS: usize = 10_000;

/// What an import did, or would do in a dry run (of a Paseo home, or of a provider's sessions:
/// `sessions.rs`).
#[derive(Debug, Default)]
pub(crate) struct ImportReport {
    pub(crate) dry_run: bool,
    pub(crate) imported: Vec<Imported>,
    pub(crate) skipped: Vec<Skipped>,
}

/// A record that became (or would become) an agent.
#[derive(Debug)]
pub(crate) struct Imported {
    /// Where it came from: the record's file, or the session's id.
    pub(crate) source: String,
    /// Its id there.
    pub(crate) source_id: String,
    /// `None` in a dry run.
    pub(crate) agent_id: Option<AgentId>,
    pub(crate) provider: String,
    pub(crate) cwd: PathBuf,
    pub(crate) title: Option<String>,
    pub(crate) status: AgentStatus,
    pub(crate) archived: bool,
    /// The Paseo id of its parent, when it comes in as a subagent.
    pub(crate) parent: Option<String>,
    /// Whether its next message continues the provider's session (`session/load`).
    pub(crate) resumes: bool,
    /// Anything the user should know about how it came in.
    pub(crate) note: Option<String>,
}

/// A record left alone, and why.
#[derive(Debug)]
pub(crate) struct Skipped {
    pub(crate) source: String,
    pub(crate) source_id: Option<String>,
    pub(crate) reason: String,
}

/// The fields of a Paseo agent record drover reads; the others are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaseoAgent {
    id: String,
    provider: String,
    cwd: PathBuf,
    #[serde(default)]
    workspace_id: Option<String>,
    created_at: Timestamp,
    #[serde(default)]
    updated_at: Option<Timestamp>,
    #[serde(default)]
    last_activity_at: Option<Timestamp>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    last_status: Option<String>,
    #[serde(default)]
    last_mode_id: Option<String>,
    #[serde(default)]
    config: Option<PaseoConfig>,
    #[serde(default)]
    persistence: Option<PaseoPersistence>,
    #[serde(default)]
    last_error: Option<String>,
    #[serde(default)]
    requires_attention: Option<bool>,
    #[serde(default)]
    attention_reason: Option<String>,
    #[serde(default)]
    attention_timestamp: Option<Timestamp>,
    #[serde(default)]
    internal: Option<bool>,
    #[serde(default)]
    archived_at: Option<Timestamp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaseoConfig {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    mode_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PaseoPersistence {
    provider: String,
    session_id: String,
}

impl Ops {
    /// Imports the agent records of the Paseo home at `home` (absolute); with `apply` false,
    /// reports what it would import and writes nothing.
    pub(crate) async fn import_paseo(
        &self,
        home: &Path,
        apply: bool,
    ) -> Result<ImportReport, OpError> {
        if !home.is_absolute() {
            return Err(OpError::invalid(
                "path",
                format!("`{}` is not an absolute path", home.display()),
            ));
        }
        let _one_at_a_time = self.imports.lock().await;
        let agents_dir = home.join("agents");
        if !agents_dir.is_dir() {
            return Err(OpError::invalid(
                "path",
                format!(
                    "`{}` holds no `agents` directory: give a Paseo home (by default ~/.paseo)",
                    home.display()
                ),
            ));
        }
        let (records, mut skipped) = tokio::task::spawn_blocking(move || read_records(&agents_dir))
            .await
            .map_err(|e| OpError::invalid("path", format!("reading the records failed: {e}")))?;
        let providers = self.runtimes.providers()?;
        let mut seen = Seen {
            providers: providers.all().map(|p| p.name.clone()).collect(),
            ..Seen::default()
        };
        // What earlier imports brought in: their agents by Paseo id, workspaces by Paseo's.
        for agent in self.registry.agents() {
            if let Some(paseo) = agent.labels.get(PASEO_AGENT_LABEL) {
                seen.agents.insert(paseo.clone(), agent.id);
            }
            if let Some(paseo) = agent.labels.get(PASEO_WORKSPACE_LABEL) {
                seen.workspaces
                    .entry(paseo.clone())
                    .or_insert(agent.workspace_id);
            }
        }
        let in_home: HashSet<&str> = records.iter().map(|(_, r)| r.id.as_str()).collect();
        let mut report = ImportReport {
            dry_run: !apply,
            ..ImportReport::default()
        };
        for (depth, source, record) in parents_first(&records) {
            let (parent, note) = match (depth, parent_of(record)) {
                (None, _) => (
                    None,
                    Some("its parent chain loops back to it: it comes in as a root agent"),
                ),
                (_, None) => (None, None),
                (_, Some(p)) => match seen.agents.get(p) {
                    Some(parent) => (Some((p.to_string(), Some(*parent))), None),
                    None if seen.taken.contains(p) => (Some((p.to_string(), None)), None),
                    None if in_home.contains(p) => (
                        None,
                        Some("its parent was skipped: it comes in as a root agent"),
                    ),
                    None => (
                        None,
                        Some("its parent is not in this home: it comes in as a root agent"),
                    ),
                },
            };
            match self
                .import_one(source, record, parent, &mut seen, apply)
                .await
            {
                Ok(mut imported) => {
                    imported.note = note.map(str::to_string);
                    seen.taken.insert(record.id.clone());
                    report.imported.push(imported);
                }
                Err(reason) => skipped.push(Skipped {
                    source: source.display().to_string(),
                    source_id: Some(record.id.clone()),
                    reason,
                }),
            }
        }
        skipped.sort_by(|a, b| Path::new(&a.source).cmp(Path::new(&b.source)));
        report.skipped = skipped;
        Ok(report)
    }

    /// Imports one record (or, in a dry run, says it would), or says why not. `parent`: the
    /// Paseo id of its parent and, unless a dry run only pretends to have imported it, the
    /// parent's drover id.
    async fn import_one(
        &self,
        source: &Path,
        record: &PaseoAgent,
        parent: Option<(String, Option<AgentId>)>,
        seen: &mut Seen,
        apply: bool,
    ) -> Result<Imported, String> {
        if let Some(agent) = seen.agents.get(&record.id) {
            return Err(format!("already imported as {agent}"));
        }
        if record.internal == Some(true) {
            return Err("one of Paseo's internal agents (a loop worker)".to_string());
        }
        if !seen.providers.contains(&record.provider) {
            return Err(format!(
                "provider `{0}` is not configured in drover: add [providers.{0}] to config.toml \
                 and import again",
                record.provider
            ));
        }
        // A relative one would be read against the daemon's own directory.
        if !record.cwd.is_absolute() {
            return Err(format!(
                "its directory `{}` is not an absolute path",
                record.cwd.display()
            ));
        }
        if !record.cwd.is_dir() {
            return Err(format!(
                "its directory `{}` does not exist any more",
                record.cwd.display()
            ));
        }
        let imported = imported_agent(
            record,
            parent.as_ref().and_then(|(_, id)| *id),
            &seen.workspaces,
        );
        let mut view = Imported {
            source: source.display().to_string(),
            source_id: record.id.clone(),
            agent_id: None,
            provider: imported.provider.clone(),
            cwd: record.cwd.clone(),
            title: imported.title.clone(),
            status: imported.status,
            archived: imported.archived_at.is_some(),
            parent: parent.map(|(p, _)| p),
            resumes: imported.resume.is_some(),
            note: None,
        };
        if apply {
            let agent = self
                .registry
                .import_agent(imported)
                .await
                .map_err(|e| format!("drover could not record it: {e}"))?;
            seen.agents.insert(record.id.clone(), agent.id);
            if let Some(ws) = &record.workspace_id {
                seen.workspaces
                    .entry(ws.clone())
                    .or_insert(agent.workspace_id);
            }
            view.agent_id = Some(agent.id);
        }
        Ok(view)
    }
}

/// What an import run knows besides the records: the providers drover has, the agents and
/// workspaces imported before or in this run (by Paseo id), and the Paseo ids this run takes
/// (in a dry run, would take).
#[derive(Default)]
struct Seen {
    providers: HashSet<String>,
    agents: HashMap<String, AgentId>,
    workspaces: HashMap<String, WorkspaceId>,
    taken: HashSet<String>,
}

/// The records parents first, by depth in the home's own parent chains (`None`: a chain that
/// loops, in damaged records; those come last and in as roots), then by path.
fn parents_first(records: &[(PathBuf, PaseoAgent)]) -> Vec<(Option<usize>, &PathBuf, &PaseoAgent)> {
    let by_id: HashMap<&str, &PaseoAgent> =
        records.iter().map(|(_, r)| (r.id.as_str(), r)).collect();
    let depth = |record: &PaseoAgent| -> Option<usize> {
        let mut depth = 0;
        let mut current = parent_of(record);
        while let Some(p) = current {
            let Some(parent) = by_id.get(p) else { break };
            depth += 1;
            if depth > by_id.len() {
                return None;
            }
            current = parent_of(parent);
        }
        Some(depth)
    };
    let mut ordered: Vec<(Option<usize>, &PathBuf, &PaseoAgent)> = records
        .iter()
        .map(|(path, r)| (depth(r), path, r))
        .collect();
    ordered.sort_by(|a, b| (a.0.unwrap_or(usize::MAX), a.1).cmp(&(b.0.unwrap_or(usize::MAX), b.1)));
    ordered
}

/// Every `agents/*/*.json` file under `dir`, parsed, in path order; the files that are not
/// agent records are skipped, saying why.
fn read_records(dir: &Path) -> (Vec<(PathBuf, PaseoAgent)>, Vec<Skipped>) {
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    let listed = |dir: &Path| -> std::io::Result<Vec<PathBuf>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        paths.sort();
        Ok(paths)
    };
    match listed(dir) {
        Ok(groups) => {
            for group in groups.into_iter().filter(|g| g.is_dir()) {
                match listed(&group) {
                    Ok(paths) => files.extend(
                        paths
                            .into_iter()
                            .filter(|p| p.extension().is_some_and(|e| e == "json")),
                    ),
                    Err(e) => skipped.push(Skipped {
                        source: group.display().to_string(),
                        source_id: None,
                        reason: format!("cannot read the directory: {e}"),
                    }),
                }
            }
        }
        Err(e) => skipped.push(Skipped {
            source: dir.display().to_string(),
            source_id: None,
            reason: format!("cannot read the directory: {e}"),
        }),
    }
    let mut records = Vec::new();
    for path in files {
        if records.len() >= MAX_RECORDS {
            skipped.push(Skipped {
                source: path.display().to_string(),
                source_id: None,
                reason: format!("more than {MAX_RECORDS} records: import the rest again"),
            });
            continue;
        }
        let parsed = std::fs::read(&path)
            .map_err(|e| format!("cannot read it: {e}"))
            .and_then(|bytes| {
                serde_json::from_slice::<PaseoAgent>(&bytes)
                    .map_err(|e| format!("not a Paseo agent record: {e}"))
            });
        match parsed {
            Ok(record) => records.push((path, record)),
            Err(reason) => skipped.push(Skipped {
                source: path.display().to_string(),
                source_id: None,
                reason,
            }),
        }
    }
    (records, skipped)
}

fn parent_of(record: &PaseoAgent) -> Option<&str> {
    record
        .labels
        .get(PASEO_PARENT_LABEL)
        .map(String::as_str)
        .filter(|p| !p.is_empty() && *p != record.id)
}

/// The drover agent a record becomes. A record that was busy when Paseo stopped comes in
/// `idle` with attention `interrupted`, as a crash leaves drover's own; an archived one
/// `closed`; a pending permission is dropped (nothing can answer it).
fn imported_agent(
    record: &PaseoAgent,
    parent: Option<AgentId>,
    workspaces: &HashMap<String, WorkspaceId>,
) -> ImportedAgent {
    let updated_at = record.updated_at.unwrap_or(record.created_at);
    let mut status = match record.last_status.as_deref() {
        Some("error") => AgentStatus::Error,
        Some("closed") => AgentStatus::Closed,
        _ => AgentStatus::Idle,
    };
    let busy = matches!(
        record.last_status.as_deref(),
        Some("running" | "initializing")
    );
    let at = record.attention_timestamp.unwrap_or(updated_at);
    let mut attention = match (
        record.requires_attention,
        record.attention_reason.as_deref(),
    ) {
        (Some(true), Some("finished")) => Some(AttentionReason::Finished),
        (Some(true), Some("error")) => Some(AttentionReason::Error),
        _ => None,
    }
    .map(|reason| Attention { reason, at });
    if busy {
        attention = Some(Attention {
            reason: AttentionReason::Interrupted,
            at: updated_at,
        });
    }
    if record.archived_at.is_some() {
        status = AgentStatus::Closed;
    }
    let mut labels: BTreeMap<String, String> = record
        .labels
        .iter()
        .filter(|(k, _)| {
            ![PASEO_PARENT_LABEL, PARENT_LABEL, CREATED_WORKSPACE_LABEL].contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(PASEO_AGENT_LABEL.to_string(), record.id.clone());
    let workspace = match &record.workspace_id {
        Some(ws) => {
            labels.insert(PASEO_WORKSPACE_LABEL.to_string(), ws.clone());
            workspaces
                .get(ws)
                .map_or(ImportWorkspace::New, |id| ImportWorkspace::Existing(*id))
        }
        None => ImportWorkspace::OfCwd,
    };
    let config = record.config.as_ref();
    ImportedAgent {
        provider: record.provider.clone(),
        cwd: record.cwd.clone(),
        workspace,
        title: record
            .title
            .clone()
            .or_else(|| config.and_then(|c| c.title.clone())),
        labels,
        parent,
        status,
        last_error: record.last_error.clone(),
        attention,
        created_at: record.created_at,
        updated_at,
        last_activity_at: record.last_activity_at.unwrap_or(updated_at),
        archived_at: record.archived_at,
        config: ProviderConfig {
            model: config.and_then(|c| c.model.clone()),
            mode: config
                .and_then(|c| c.mode_id.clone())
                .or_else(|| record.last_mode_id.clone()),
            ..ProviderConfig::default()
        },
        resume: record
            .persistence
            .as_ref()
            .filter(|p| p.provider == record.provider && !p.session_id.is_empty())
            .map(|p| ResumeHandle {
                acp_session_id: p.session_id.clone(),
            }),
    }
}
