//! The CLI's failures, each classified once into a documented exit code.
//!
//! Commands return `anyhow::Error`; `main` looks for a [`CliError`] in it to pick the exit
//! code, and anything else is a plain error (1).

use std::path::PathBuf;

use drover_protocol::ErrorCode;
use serde_json::Value;

/// Exit codes, as documented in the README (0 is success, 2 clap's code for bad arguments).
pub mod exit {
    /// Any other failure, including a turn that failed or was cancelled.
    pub const ERROR: u8 = 1;
    /// Bad arguments: clap's code, and ours for arguments only the CLI can check.
    pub const USAGE: u8 = 2;
    pub const NOT_RUNNING: u8 = 3;
    pub const NOT_FOUND: u8 = 4;
    pub const REFUSED: u8 = 5;
    pub const TIMEOUT: u8 = 6;
    /// Ctrl-C during `drover run`: the agent keeps running.
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("no drover daemon is running for {}; start it with `drover daemon start`", home.display())]
    NotRunning { home: PathBuf },
    #[error("no drover daemon answers at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The home exists but this user may not read it: whether a daemon runs is unknown.
    #[error("cannot read `{}`: {reason}; the data directory is private to the user whose daemon keeps it (use your own with --home, or reach a daemon with --url)", path.display())]
    Unreadable { path: PathBuf, reason: String },
    #[error("no agent matches `{0}` (see `drover ls --all`)")]
    UnknownAgent(String),
    #[error("no workspace matches `{0}` (see `drover workspaces --all`)")]
    UnknownWorkspace(String),
    #[error("`{query}` matches {} {what}; use more of the id:\n{}", candidates.len(), candidates.join("\n"))]
    Ambiguous {
        query: String,
        /// `agents`, `workspaces`.
        what: &'static str,
        candidates: Vec<String>,
    },
    /// The daemon does not serve this drover's protocol: a daemon of an older drover still
    /// running after an upgrade (or of a newer one); `theirs` is its protocol, if it said.
    #[error("{}", other_protocol(*theirs, url.as_deref()))]
    OtherProtocol {
        theirs: Option<u32>,
        /// The `--url` the daemon was reached at; `None` for this home's own daemon.
        url: Option<String>,
    },
    /// A `request_error` from the daemon.
    #[error("{message}")]
    Daemon {
        code: String,
        message: String,
        details: Option<Value>,
    },
    /// An argument clap cannot check (a `--cwd` that is not a directory).
    #[error("{0}")]
    BadArgument(String),
    #[error("{0}")]
    Timeout(String),
    /// Already reported on the terminal; only the exit code is left to give.
    #[error("{message}")]
    Reported { code: u8, message: String },
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NotRunning { .. } | CliError::Unreachable { .. } => exit::NOT_RUNNING,
            CliError::UnknownAgent(_)
            | CliError::UnknownWorkspace(_)
            | CliError::Ambiguous { .. } => exit::NOT_FOUND,
            CliError::BadArgument(_) => exit::USAGE,
            CliError::Unreadable { .. } | CliError::OtherProtocol { .. } => exit::ERROR,
            CliError::Daemon { code, .. } => {
                ErrorCode::parse(code).map_or(exit::ERROR, daemon_exit)
            }
            CliError::Timeout(_) => exit::TIMEOUT,
            CliError::Reported { code, .. } => *code,
        }
    }
}

/// What to do about a daemon of protocol `theirs` (if known) that does not serve this drover:
/// stop it and start this drover's, where it runs (`url`) or here.
pub fn other_protocol(theirs: Option<u32>, url: Option<&str>) -> String {
    match url {
        Some(url) => advice(&format!("the drover daemon at {url}"), theirs, true),
        None => advice("the running drover daemon", theirs, false),
    }
}

/// [`other_protocol`] for the daemon a sentence already named (`it`), this home's.
pub fn its_other_protocol(theirs: u32) -> String {
    advice("it", Some(theirs), false)
}

fn advice(which: &str, theirs: Option<u32>, remote: bool) -> String {
    let ours = drover_protocol::PROTOCOL_VERSION;
    let (stop, start) = if remote {
        (
            "`drover daemon stop` where it runs",
            "it again there with this drover",
        )
    } else {
        (
            "`drover daemon stop`",
            "this drover's with `drover daemon start`",
        )
    };
    match theirs {
        Some(theirs) if theirs < ours => {
            let before = if remote {
                ""
            } else {
                "; it was started before an upgrade"
            };
            format!(
                "{which} is older than this drover (protocol {theirs}, this drover speaks {ours}\
                 {before}): stop it with {stop}, then start {start}"
            )
        }
        Some(theirs) => format!(
            "{which} is newer than this drover (protocol {theirs}, this drover speaks {ours}): \
             use the drover that started it, or stop it with {stop} and start {start}"
        ),
        None => format!(
            "{which} does not speak this drover's protocol {ours}: stop it with {stop}, then \
             start {start}"
        ),
    }
}

/// A command whose arguments go to the daemon as they were typed (`job start`, `schedule
/// add`): the daemon's refusal of them (`invalid_input`, `invalid_message`: a missing `--cwd`,
/// a time in the past, a bad cron expression or time zone) is a bad argument (2), like the ones
/// the CLI checks itself. Any other error is kept.
pub fn arguments_refused(error: anyhow::Error) -> anyhow::Error {
    match error.downcast::<CliError>() {
        Ok(CliError::Daemon { code, message, .. })
            if matches!(
                ErrorCode::parse(&code),
                Some(ErrorCode::InvalidInput | ErrorCode::InvalidMessage)
            ) =>
        {
            CliError::BadArgument(message).into()
        }
        Ok(other) => other.into(),
        Err(error) => error,
    }
}

/// The exit code for a daemon's error code. Exhaustive, so that a new code gets a decision.
fn daemon_exit(code: ErrorCode) -> u8 {
    match code {
        ErrorCode::UnknownAgent
        | ErrorCode::UnknownWorkspace
        | ErrorCode::UnknownProvider
        | ErrorCode::InvalidId
        | ErrorCode::UnknownSchedule
        | ErrorCode::UnknownJob
        | ErrorCode::UnknownHost
        | ErrorCode::UnknownTerminal => exit::NOT_FOUND,
        ErrorCode::AgentActive
        | ErrorCode::IllegalTransition
        | ErrorCode::AgentArchived
        | ErrorCode::TurnBlocked
        | ErrorCode::NoSuchPermission
        | ErrorCode::ProviderUnavailable
        | ErrorCode::InvalidInput
        | ErrorCode::NotPermitted
        | ErrorCode::NotAWorktree
        | ErrorCode::NotAGitRepository
        | ErrorCode::WorktreeDirty
        | ErrorCode::WorktreeBusy
        | ErrorCode::BudgetExhausted
        | ErrorCode::WorkspaceArchived => exit::REFUSED,
        ErrorCode::InvalidMessage
        | ErrorCode::UnknownType
        | ErrorCode::HelloRequired
        | ErrorCode::UnsupportedVersion
        | ErrorCode::Unauthorized
        | ErrorCode::AgentStartFailed
        | ErrorCode::AgentError
        | ErrorCode::RuntimeStopped
        | ErrorCode::StoreFailed
        | ErrorCode::ShuttingDown
        | ErrorCode::TooManyRequests
        | ErrorCode::GitFailed
        | ErrorCode::InvalidProjectFile
        | ErrorCode::InvalidConfig
        | ErrorCode::WorktreeSetupFailed
        | ErrorCode::WorktreeTeardownFailed
        | ErrorCode::WorktreeIoFailed
        | ErrorCode::JobStartFailed
        | ErrorCode::TerminalStartFailed
        | ErrorCode::HostUnreachable => exit::ERROR,
    }
}

/// The exit code for any error a command returned.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    error
        .chain()
        .find_map(|e| e.downcast_ref::<CliError>())
        .map_or(exit::ERROR, CliError::exit_code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon(code: &str) -> u8 {
        CliError::Daemon {
            code: code.to_string(),
            message: String::new(),
            details: None,
        }
        .exit_code()
    }

    #[test]
    fn daemon_codes_map_to_documented_exit_codes() {
        assert_eq!(daemon("unknown_workspace"), exit::NOT_FOUND);
        assert_eq!(daemon("worktree_dirty"), exit::REFUSED);
        assert_eq!(daemon("not_a_worktree"), exit::REFUSED);
        assert_eq!(daemon("not_permitted"), exit::REFUSED);
        assert_eq!(daemon("git_failed"), exit::ERROR);
        // A newer daemon's code this drover does not know.
        assert_eq!(daemon("brand_new"), exit::ERROR);
        assert_eq!(
            CliError::BadArgument(String::new()).exit_code(),
            exit::USAGE
        );
    }

    #[test]
    fn the_daemons_refusal_of_typed_arguments_is_a_usage_error() {
        let refused = |code: &str| {
            exit_code(&arguments_refused(
                CliError::Daemon {
                    code: code.to_string(),
                    message: "m".to_string(),
                    details: None,
                }
                .into(),
            ))
        };
        assert_eq!(refused("invalid_input"), exit::USAGE);
        assert_eq!(refused("invalid_message"), exit::USAGE);
        assert_eq!(refused("agent_archived"), exit::REFUSED);
        assert_eq!(refused("unknown_agent"), exit::NOT_FOUND);
        assert_eq!(
            exit_code(&arguments_refused(anyhow::anyhow!("other"))),
            exit::ERROR
        );
    }
}
