//! Workspace terminals (`crate::ptys`): open one in a workspace, list them, type into one,
//! resize it, close it. Only people open them: an agent runs commands as jobs.

use std::sync::Arc;

use drover_core::WorkspaceId;

use super::{Caller, OpError, Ops};
use crate::ptys::{Launch, MAX_INPUT, Pty};

/// What a terminal is opened with when the client does not say.
const DEFAULT_SIZE: (u16, u16) = (80, 24);

impl Ops {
    /// Opens a terminal in `workspace`'s directory: the user's shell with what agents inherit
    /// of the daemon's environment (no token, no provider key) and `TERM=xterm-256color`.
    pub(crate) async fn create_terminal(
        &self,
        caller: Caller,
        workspace: WorkspaceId,
        cols: Option<u16>,
        rows: Option<u16>,
    ) -> Result<Arc<Pty>, OpError> {
        only_people(caller)?;
        let ws = self.workspace(workspace)?;
        if ws.archived_at.is_some() {
            return Err(OpError::WorkspaceArchived(workspace));
        }
        let mut env = drover_acp::process::inherited_env();
        env.insert("TERM".into(), "xterm-256color".into());
        env.insert("COLORTERM".into(), "truecolor".into());
        let shell = crate::ptys::shell_of(&env);
        let launch = Launch {
            workspace,
            cwd: ws.path,
            shell,
            env,
            cols: size(cols, DEFAULT_SIZE.0, "cols")?,
            rows: size(rows, DEFAULT_SIZE.1, "rows")?,
        };
        Ok(self.ptys.open(launch).await?)
    }

    /// The running terminals, of `workspace` or of all.
    pub(crate) fn list_terminals(
        &self,
        caller: Caller,
        workspace: Option<WorkspaceId>,
    ) -> Result<Vec<Arc<Pty>>, OpError> {
        only_people(caller)?;
        Ok(self.ptys.list(workspace))
    }

    /// The running terminal `id`.
    pub(crate) fn terminal(&self, caller: Caller, id: &str) -> Result<Arc<Pty>, OpError> {
        only_people(caller)?;
        Ok(self.ptys.get(id)?)
    }

    /// Types `data` into terminal `id` (queued in order for its writer).
    pub(crate) fn terminal_input(
        &self,
        caller: Caller,
        id: &str,
        data: String,
    ) -> Result<(), OpError> {
        let pty = self.terminal(caller, id)?;
        if data.len() > MAX_INPUT {
            return Err(OpError::invalid(
                "data",
                format!("at most {MAX_INPUT} bytes at once"),
            ));
        }
        Ok(pty.write(data.into_bytes())?)
    }

    /// Sets terminal `id`'s size.
    pub(crate) fn resize_terminal(
        &self,
        caller: Caller,
        id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<Arc<Pty>, OpError> {
        let pty = self.terminal(caller, id)?;
        let (cols, rows) = (size(Some(cols), 0, "cols")?, size(Some(rows), 0, "rows")?);
        pty.resize(cols, rows)
            .map_err(|source| crate::ptys::PtyError::Io {
                id: pty.id.clone(),
                source,
            })?;
        self.ptys.changed(&pty);
        Ok(pty)
    }

    /// Ends terminal `id` (its shell and everything it started); answers once it ended.
    pub(crate) async fn close_terminal(
        &self,
        caller: Caller,
        id: &str,
    ) -> Result<Arc<Pty>, OpError> {
        let pty = self.terminal(caller, id)?;
        self.ptys.close(&pty).await;
        Ok(pty)
    }
}

impl Ops {
    /// Ends the terminals of every workspace that gets archived, however it is (an agent's
    /// `autoArchive` too), from now on. The terminals, for the daemon to end at its stop.
    pub(crate) fn end_terminals_with_their_workspace(&self) -> crate::ptys::Ptys {
        let mut changes = self.subscribe_changes();
        let ops = self.clone();
        tokio::spawn(async move {
            loop {
                let archived: Vec<WorkspaceId> = match changes.recv().await {
                    Ok(event) => match &event.change {
                        drover_core::Change::WorkspaceRegistered(ws)
                            if ws.archived_at.is_some() =>
                        {
                            vec![ws.id]
                        }
                        _ => continue,
                    },
                    // Missed events: every terminal's workspace is looked at.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => ops
                        .ptys
                        .list(None)
                        .iter()
                        .map(|t| t.workspace)
                        .filter(|id| ops.workspace(*id).is_ok_and(|w| w.archived_at.is_some()))
                        .collect(),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                for id in archived {
                    if !ops.ptys.list(Some(id)).is_empty() {
                        let ptys = ops.ptys.clone();
                        tokio::spawn(async move { ptys.close_workspace(id).await });
                    }
                }
            }
        });
        self.ptys.clone()
    }
}

fn only_people(caller: Caller) -> Result<(), OpError> {
    match caller {
        Caller::User => Ok(()),
        Caller::Agent(_) => Err(OpError::NotPermitted(
            "workspace terminals are for people; an agent runs commands as jobs".into(),
        )),
    }
}

/// A terminal dimension: 1 to 1000 (`default` when absent).
fn size(value: Option<u16>, default: u16, field: &'static str) -> Result<u16, OpError> {
    match value.unwrap_or(default) {
        n @ 1..=1000 => Ok(n),
        n => Err(OpError::invalid(
            field,
            format!("{n} is not between 1 and 1000"),
        )),
    }
}
