//! The CLI's failures, each classified once into a documented exit code.
//!
//! Commands return `anyhow::Error`; `main` looks for a [`CliError`] in it to pick the exit
//! code, and anything else is a plain error (1).

use std::path::PathBuf;

use serde_json::Value;

/// Exit codes, as documented in the README (0 is success, 2 clap's code for bad arguments).
pub mod exit {
    /// Any other failure, including a turn that failed or was cancelled.
    pub const ERROR: u8 = 1;
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
    #[error("no agent matches `{0}` (see `drover ls --all`)")]
    UnknownAgent(String),
    #[error("`{query}` matches {} agents; use more of the id:\n{}", candidates.len(), candidates.join("\n"))]
    Ambiguous {
        query: String,
        candidates: Vec<String>,
    },
    /// A `request_error` from the daemon.
    #[error("{message}")]
    Daemon {
        code: String,
        message: String,
        details: Option<Value>,
    },
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
            CliError::UnknownAgent(_) | CliError::Ambiguous { .. } => exit::NOT_FOUND,
            CliError::Daemon { code, .. } => match code.as_str() {
                "unknown_agent" | "unknown_workspace" | "unknown_provider" => exit::NOT_FOUND,
                "agent_active"
                | "illegal_transition"
                | "agent_archived"
                | "turn_blocked"
                | "no_such_permission"
                | "provider_unavailable"
                | "invalid_input" => exit::REFUSED,
                _ => exit::ERROR,
            },
            CliError::Timeout(_) => exit::TIMEOUT,
            CliError::Reported { code, .. } => *code,
        }
    }
}

/// The exit code for any error a command returned.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    error
        .chain()
        .find_map(|e| e.downcast_ref::<CliError>())
        .map_or(exit::ERROR, CliError::exit_code)
}
