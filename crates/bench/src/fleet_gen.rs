//! A fleet of agent records written straight to disk, in the store's exact file format, for
//! benchmarks that need thousands of agents without creating them one by one
//! (`drover-bench`, `drover-bench-protocol`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use drover_core::store::cwd_dir_name;
use drover_core::{AgentStatus, PARENT_LABEL};
use jiff::Timestamp;
use serde::Serialize;
use uuid::Uuid;

/// What [`generate_fleet`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct FleetStats {
    pub agents: usize,
    pub subagents: usize,
    pub archived: usize,
    pub workspaces: usize,
    /// Bytes of agent files in all.
    pub agent_bytes: usize,
}

/// The agent file, field for field as `drover_core::store`'s `AgentDoc` writes it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AgentFile {
    version: u32,
    id: String,
    provider: &'static str,
    cwd: PathBuf,
    workspace_id: String,
    created_at: Timestamp,
    updated_at: Timestamp,
    last_activity_at: Timestamp,
    title: Option<String>,
    labels: BTreeMap<String, String>,
    last_status: AgentStatus,
    last_error: Option<String>,
    archived_at: Option<Timestamp>,
    requires_attention: bool,
    attention_reason: Option<&'static str>,
    attention_timestamp: Option<Timestamp>,
    auto_archive: bool,
    config: ConfigFile,
    resume_handle: Option<ResumeFile>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    model: Option<&'static str>,
    mode_id: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResumeFile {
    acp_session_id: String,
}

/// The workspace file, as `WorkspaceDoc` writes it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WorkspaceFile {
    version: u32,
    id: String,
    kind: &'static str,
    path: PathBuf,
    name: String,
    created_at: Timestamp,
    updated_at: Timestamp,
    archived_at: Option<Timestamp>,
}

const REPOS: [&str; 10] = [
    "billing-api",
    "web-console",
    "ingest",
    "search",
    "mobile-app",
    "auth",
    "infra",
    "docs-site",
    "data-pipeline",
    "notifications",
];
const TASKS: [&str; 8] = [
    "Fix the flaky integration test in",
    "Add pagination to the list endpoint of",
    "Upgrade dependencies and fix breakage in",
    "Investigate the memory growth in",
    "Write a migration for the new schema of",
    "Refactor error handling across",
    "Review the open pull request on",
    "Port the CLI flags parser in",
];

/// Writes `workspaces × per_workspace` agents with realistic records (subagent trees, archived
/// subtrees, attention, errors, resume handles), as the store would have written them.
// One record after another, as the store lays them out; the indices and offsets cast to i64
// are far below its range.
#[expect(clippy::too_many_lines, clippy::cast_possible_wrap)]
pub fn generate_fleet(
    home: &Path,
    workspaces: usize,
    per_workspace: usize,
    seed: u64,
) -> Result<FleetStats> {
    let mut rng = Rng(seed);
    fs::create_dir_all(home.join("agents"))?;
    fs::create_dir_all(home.join("workspaces"))?;
    let start = Timestamp::now().as_second() - 30 * 86_400;
    // Whole seconds plus nanoseconds derived from them, as `Timestamp::now()` writes them.
    let ts = |s: i64| {
        let nanos = (s.wrapping_mul(0x9e37_79b9) & 0x3fff_ffff) % 1_000_000_000;
        Timestamp::new(s, nanos as i32).map_err(|e| anyhow!("timestamp: {e}"))
    };
    let mut stats = FleetStats {
        agents: 0,
        subagents: 0,
        archived: 0,
        workspaces: 0,
        agent_bytes: 0,
    };
    for w in 0..workspaces {
        let repo = REPOS[w % REPOS.len()];
        // Repos with several worktrees each: many workspaces, one cwd per workspace.
        let cwd = PathBuf::from(format!("/home/dev/src/{repo}/wt-{:03}", w / REPOS.len()));
        let ws_id = Uuid::now_v7().to_string();
        let ws_created = start + (w as i64) * 5_000;
        let ws = WorkspaceFile {
            version: 1,
            id: ws_id.clone(),
            kind: if w % 3 == 0 {
                "local_checkout"
            } else {
                "worktree"
            },
            path: cwd.clone(),
            name: format!("wt-{:03}", w / REPOS.len()),
            created_at: ts(ws_created)?,
            updated_at: ts(ws_created)?,
            archived_at: None,
        };
        write_doc(&home.join("workspaces").join(format!("{ws_id}.json")), &ws)?;
        stats.workspaces += 1;

        let dir = home.join("agents").join(cwd_dir_name(&cwd));
        fs::create_dir_all(&dir)?;
        let mut ids: Vec<String> = Vec::with_capacity(per_workspace);
        let mut archived: Vec<bool> = Vec::with_capacity(per_workspace);
        for k in 0..per_workspace {
            let id = Uuid::now_v7().to_string();
            let is_root = k % 5 == 0;
            let parent = (!is_root).then(|| rng.below(k));
            let is_archived = match parent {
                Some(p) => archived[p] || rng.chance(10),
                None => rng.chance(30),
            };
            let created = ws_created + (k as i64) * 97;
            let updated = created + 60 + rng.below(3_600) as i64;
            let mut labels = BTreeMap::new();
            if let Some(p) = parent {
                labels.insert(PARENT_LABEL.to_string(), ids[p].clone());
            }
            if rng.chance(40) {
                labels.insert("team".to_string(), "platform".to_string());
            }
            if rng.chance(20) {
                labels.insert(
                    "ticket".to_string(),
                    format!("ENG-{}", 1000 + rng.below(9000)),
                );
            }
            let roll = rng.below(100);
            let (status, attention, error) = if is_archived {
                (AgentStatus::Closed, None, None)
            } else if is_root && roll < 5 {
                (
                    AgentStatus::Error,
                    Some("error"),
                    Some("the runtime exited with status 1".to_string()),
                )
            } else if is_root && roll < 45 {
                (AgentStatus::Idle, Some("finished"), None)
            } else if roll < 75 {
                (AgentStatus::Idle, None, None)
            } else {
                (AgentStatus::Closed, None, None)
            };
            let codex = rng.chance(50);
            let doc = AgentFile {
                version: 1,
                id: id.clone(),
                provider: if codex { "codex" } else { "claude" },
                cwd: cwd.clone(),
                workspace_id: ws_id.clone(),
                created_at: ts(created)?,
                updated_at: ts(updated)?,
                last_activity_at: ts(updated - 5)?,
                title: Some(format!(
                    "{} {repo}{}",
                    TASKS[rng.below(TASKS.len())],
                    if is_root { "" } else { " (subtask)" }
                )),
                labels,
                last_status: status,
                last_error: error,
                archived_at: if is_archived {
                    Some(ts(updated)?)
                } else {
                    None
                },
                requires_attention: attention.is_some(),
                attention_reason: attention,
                attention_timestamp: if attention.is_some() {
                    Some(ts(updated - 5)?)
                } else {
                    None
                },
                auto_archive: !is_root && rng.chance(30),
                config: ConfigFile {
                    model: Some(if codex {
                        "gpt-5.3-codex"
                    } else {
                        "claude-opus-4-5"
                    }),
                    mode_id: Some("default"),
                },
                resume_handle: Some(ResumeFile {
                    acp_session_id: Uuid::now_v7().to_string(),
                }),
            };
            stats.agent_bytes += write_doc(&dir.join(format!("{id}.json")), &doc)?;
            stats.agents += 1;
            stats.subagents += usize::from(parent.is_some());
            stats.archived += usize::from(is_archived);
            ids.push(id);
            archived.push(is_archived);
        }
    }
    Ok(stats)
}

/// Pretty JSON and a newline, like the store; returns the size.
pub fn write_doc(path: &Path, doc: &impl Serialize) -> Result<usize> {
    let mut bytes = serde_json::to_vec_pretty(doc)?;
    bytes.push(b'\n');
    fs::write(path, &bytes).with_context(|| format!("cannot write `{}`", path.display()))?;
    Ok(bytes.len())
}

/// `SplitMix64`: deterministic figures without a dependency.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    // The remainder is below `n`, a `usize`.
    #[expect(clippy::cast_possible_truncation)]
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}
