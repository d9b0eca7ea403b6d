//! `$DROVER_HOME/schedules/{id}.json`: one file per schedule, written atomically (temp file,
//! fsync, rename, folder fsync, through `drover_core::store`), 0600 in a 0700 folder.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use drover_core::store::{StoreError, write_atomic};
use drover_core::{AgentId, PermissionPolicy, WorkspaceId};
use jiff::Timestamp;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::cadence::Cadence;

/// The document version this build writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Runs kept in a schedule's history, newest last.
pub(crate) const HISTORY: usize = 20;

/// `sched-<n>`: short enough to type, and the only form that becomes a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ScheduleId(pub(crate) u64);

impl fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sched-{}", self.0)
    }
}

impl FromStr for ScheduleId {
    type Err = String;

    fn from_str(s: &str) -> Result<ScheduleId, String> {
        s.strip_prefix("sched-")
            .filter(|n| !n.is_empty() && n.len() <= 19 && n.bytes().all(|b| b.is_ascii_digit()))
            .filter(|n| !n.starts_with('0'))
            .and_then(|n| n.parse().ok())
            .map(ScheduleId)
            .ok_or_else(|| {
                format!(
                    "`{}` is not a schedule id (such as `sched-3`)",
                    s.chars().take(80).collect::<String>()
                )
            })
    }
}

impl Serialize for ScheduleId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ScheduleId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ScheduleId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a schedule delivers its prompt to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Target {
    /// A followup to an existing agent.
    Agent {
        #[serde(rename = "agentId")]
        agent_id: AgentId,
    },
    /// A new agent each time it fires, its first message the prompt.
    NewAgent(NewAgentSpec),
}

/// The agent a schedule creates each time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NewAgentSpec {
    /// Default: the creating agent's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workspace_id: Option<WorkspaceId>,
    /// Each new agent is a subagent of this one (none: detached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent_agent_id: Option<AgentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) permission_policy: Option<PermissionPolicy>,
    #[serde(default)]
    pub(crate) auto_archive: bool,
}

/// A delivery begun and not yet recorded: written before the prompt is queued, so the next
/// boot can tell whether it got there (its message id is in the inbox or the timeline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PendingRun {
    pub(crate) due_at: Timestamp,
    pub(crate) message_id: String,
    pub(crate) started_at: Timestamp,
}

/// One time the schedule fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Run {
    /// The occurrence it ran for.
    pub(crate) due_at: Timestamp,
    /// When the prompt was durably queued (or the attempt failed).
    pub(crate) fired_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message_id: Option<String>,
    /// The agent it went to, or the one it created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) agent_id: Option<AgentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Settled at boot from a delivery a crash interrupted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) recovered: bool,
}

/// A schedule, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Schedule {
    pub(crate) version: u32,
    pub(crate) id: ScheduleId,
    pub(crate) created_at: Timestamp,
    pub(crate) updated_at: Timestamp,
    /// The agent that made it over MCP; none when a user did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) created_by: Option<AgentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) title: Option<String>,
    pub(crate) target: Target,
    pub(crate) prompt: String,
    pub(crate) cadence: Cadence,
    #[serde(default)]
    pub(crate) paused: bool,
    /// The next occurrence; `null` once a `once` schedule ran (finished).
    #[serde(default)]
    pub(crate) next_run_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pending: Option<PendingRun>,
    #[serde(default)]
    pub(crate) runs: Vec<Run>,
    /// Fields a newer drover wrote, kept as they are.
    #[serde(flatten)]
    pub(crate) unknown: serde_json::Map<String, serde_json::Value>,
}

/// Whether a schedule will fire again by itself: the protocol's `ScheduleInfo.state`.
pub(crate) use drover_protocol::ScheduleState as State;

impl Schedule {
    pub(crate) fn state(&self) -> State {
        if self.next_run_at.is_none() && self.pending.is_none() {
            State::Finished
        } else if self.paused {
            State::Paused
        } else {
            State::Active
        }
    }

    /// The agent whose activity this schedule is: the one it sends to, or the parent of the
    /// agents it creates.
    pub(crate) fn owner_agent(&self) -> Option<AgentId> {
        match &self.target {
            Target::Agent { agent_id } => Some(*agent_id),
            Target::NewAgent(spec) => spec.parent_agent_id,
        }
    }

    pub(crate) fn push_run(&mut self, run: Run) {
        self.runs.push(run);
        if self.runs.len() > HISTORY {
            let extra = self.runs.len() - HISTORY;
            self.runs.drain(..extra);
        }
    }
}

pub(crate) fn dir(home: &Path) -> PathBuf {
    home.join("schedules")
}

pub(crate) fn path(home: &Path, id: ScheduleId) -> PathBuf {
    dir(home).join(format!("{id}.json"))
}

/// Writes the schedule's file (the folder made 0700 first if missing).
pub(crate) fn write(home: &Path, schedule: &Schedule) -> Result<(), StoreError> {
    let dir = dir(home);
    drover_core::private::create_dir_all(&dir).map_err(StoreError::io("create", &dir))?;
    let path = path(home, schedule.id);
    let bytes = serde_json::to_vec_pretty(schedule).map_err(|source| StoreError::Encode {
        path: path.clone(),
        source,
    })?;
    write_atomic(&path, &bytes)
}

/// `schedules/last-id`: the highest id given, written when a schedule is deleted (the files
/// say it otherwise), so that no id is ever given twice.
const LAST_ID: &str = "last-id";

/// Records `n` as the highest id given.
pub(crate) fn write_last_id(home: &Path, n: u64) -> Result<(), StoreError> {
    let dir = dir(home);
    drover_core::private::create_dir_all(&dir).map_err(StoreError::io("create", &dir))?;
    write_atomic(&dir.join(LAST_ID), format!("{n}\n").as_bytes())
}

/// Removes the schedule's file (gone already is fine), then syncs the folder.
pub(crate) fn remove(home: &Path, id: ScheduleId) -> Result<(), StoreError> {
    let path = path(home, id);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StoreError::io("remove", &path)(source));
        }
    }
    let dir = dir(home);
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io("sync", &dir))
}

/// What [`load`] found.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) schedules: Vec<Schedule>,
    /// The highest id any file in the folder is named after or names, those left alone
    /// included: a new schedule's id is past it, so no file is ever taken over.
    pub(crate) highest_id: u64,
}

/// Every schedule on disk. A file that cannot be read or parsed, or whose name is not its
/// id, is logged and left where it is (it is never rewritten); one written by a newer drover
/// is left alone too. Temp files a crash left are removed.
pub(crate) fn load(home: &Path) -> Loaded {
    let dir = dir(home);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Loaded::default();
    };
    let mut out = Vec::new();
    let last_id = dir.join(LAST_ID);
    let mut highest_id = match std::fs::read_to_string(&last_id) {
        Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|e| {
            tracing::error!(path = %last_id.display(), error = %e, "cannot read the last schedule id; left in place");
            0
        }),
        Err(_) => 0,
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with('.') && name.contains(".tmp-") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(id) = name
            .strip_suffix(".json")
            .and_then(|s| s.parse::<ScheduleId>().ok())
        else {
            continue;
        };
        highest_id = highest_id.max(id.0);
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                serde_json::from_slice::<serde_json::Value>(&b).map_err(|e| e.to_string())
            });
        let value = match parsed {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot read a schedule; left in place");
                continue;
            }
        };
        if value
            .get("version")
            .and_then(serde_json::Value::as_u64)
            .is_some_and(|v| v > u64::from(VERSION))
        {
            tracing::warn!(path = %path.display(), "left alone a schedule written by a newer drover");
            continue;
        }
        match serde_json::from_value::<Schedule>(value) {
            Ok(s) if s.id == id => out.push(s),
            Ok(s) => {
                highest_id = highest_id.max(s.id.0);
                tracing::error!(path = %path.display(), id = %s.id, "a schedule file names another id; left in place");
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot parse a schedule; left in place");
            }
        }
    }
    out.sort_by_key(|s| s.id);
    Loaded {
        schedules: out,
        highest_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_only_their_own_form() {
        assert_eq!("sched-12".parse::<ScheduleId>(), Ok(ScheduleId(12)));
        for bad in [
            "sched-",
            "sched-01",
            "sched-1/..",
            "12",
            "sched--1",
            "SCHED-1",
        ] {
            let e = bad.parse::<ScheduleId>().expect_err(bad);
            assert!(e.contains("schedule id"), "{e}");
        }
    }
}
