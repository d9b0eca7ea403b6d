//! What every client command shares: the connection context (`Ctx`), finding the agent a
//! command names, answers the daemon was not expected to give, JSON output, Ctrl-C and
//! working directories. The commands themselves live in `run`, `inspect`, `agents`,
//! `providers`, `workspaces`, `jobs`, `schedules` and their siblings.

use std::path::{Path, PathBuf};

use anyhow::Context;
use drover_protocol::{AgentInfo, DaemonMessage};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::client::{Connection, Endpoint, SessionState};
use crate::error::CliError;
use crate::output::Style;
use crate::resolve::{Prefer, ShortIds, resolve};

/// What every client command needs.
#[derive(Debug)]
pub struct Ctx {
    pub endpoint: Endpoint,
    pub style: Style,
}

impl Ctx {
    /// Connects; the state lists archived agents too, so any agent can be named.
    pub(crate) async fn connect(&self) -> anyhow::Result<(Connection, SessionState)> {
        Connection::open(&self.endpoint, true).await
    }

    /// Connects and finds the agent `query` names: (connection, agent, its short name).
    pub(crate) async fn agent(
        &self,
        query: &str,
    ) -> anyhow::Result<(Connection, AgentInfo, String)> {
        self.agent_preferring(query, Prefer::Live).await
    }

    pub(crate) async fn agent_preferring(
        &self,
        query: &str,
        prefer: Prefer,
    ) -> anyhow::Result<(Connection, AgentInfo, String)> {
        let (connection, SessionState { agents, .. }) = self.connect().await?;
        let agent = resolve(&agents, query, prefer)?.clone();
        let name = ShortIds::new(&agents).get(&agent.id).to_string();
        Ok((connection, agent, name))
    }
}

pub(crate) fn unexpected(message: &DaemonMessage) -> anyhow::Error {
    anyhow::anyhow!("unexpected answer from the daemon: {message:?}")
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Ctrl-C as a stream, set up before any wait so that no press is lost.
pub(crate) fn interrupts() -> anyhow::Result<Signal> {
    signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")
}

/// `dir` made absolute, if it is a directory: the same refusal (a bad argument) whether it is
/// missing or a file.
pub(crate) fn working_directory(dir: &Path) -> Result<PathBuf, CliError> {
    let refuse = |why: String| {
        CliError::BadArgument(format!(
            "cannot use `{}` as the working directory: {why}",
            dir.display()
        ))
    };
    let canonical = std::fs::canonicalize(dir).map_err(|e| refuse(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(refuse("it is not a directory".to_string()));
    }
    Ok(canonical)
}
