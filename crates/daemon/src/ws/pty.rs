//! The client protocol's workspace terminal requests (`create_terminal`, `list_terminals`,
//! `terminal_input`, `resize_terminal`, `close_terminal`): decode, call the operation in
//! `crate::ops::pty`, encode; and the terminals a session is attached to (`attach_terminal`,
//! `detach_terminal`), whose output is pushed to it as `terminal_output`, then
//! `terminal_exit`.
//!
//! An attachment is one task reading the terminal's scrollback by offset, through the same
//! bounded push queue as the session's job follows (`super::jobs::Follows`): a slow client
//! lags behind the terminal (and skips what it lagged past the scrollback), the terminal never
//! waits for it.

use std::sync::Arc;

use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{DaemonMessage, ErrorCode};
use tokio::sync::mpsc;

use super::jobs::{Follows, Push};
use super::{encode, request_error};
use crate::ops::{Caller, OpError, Ops, parse_workspace};
use crate::ptys::Pty;
use crate::wire;

/// Every client of the protocol is the machine's user.
const CALLER: Caller = Caller::User;

/// The most bytes of output one `terminal_output` carries.
const CHUNK: usize = 32 * 1024;

/// `create_terminal`.
pub(super) async fn create_terminal(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::CreateTerminal,
) -> Result<DaemonMessage, OpError> {
    let workspace = parse_workspace(&r.workspace_id)?;
    let pty = ops
        .create_terminal(CALLER, workspace, r.cols, r.rows)
        .await?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Terminal {
            terminal: wire::terminal_info(&pty),
        },
    ))
}

/// `list_terminals`.
pub(super) fn list_terminals(
    ops: &Ops,
    request_id: Option<String>,
    r: &rq::ListTerminals,
) -> Result<DaemonMessage, OpError> {
    let workspace = r.workspace_id.as_deref().map(parse_workspace).transpose()?;
    let terminals = ops.list_terminals(CALLER, workspace)?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Terminals {
            terminals: terminals.iter().map(|t| wire::terminal_info(t)).collect(),
        },
    ))
}

/// Answers `terminal_input`, in the session's own loop: what one client types reaches the
/// terminal in the order it was typed (requests otherwise run side by side).
pub(super) fn terminal_input(
    ops: &Ops,
    request_id: Option<String>,
    r: &rq::TerminalInput,
) -> DaemonMessage {
    match ops.terminal_input(CALLER, &r.terminal_id, r.data.clone()) {
        Ok(()) => DaemonMessage::answer(request_id, answers::Ok { agent_id: None }),
        Err(e) => request_error(request_id, e.code(), e.to_string(), wire::error_details(&e)),
    }
}

/// `resize_terminal`.
pub(super) fn resize_terminal(
    ops: &Ops,
    request_id: Option<String>,
    r: &rq::ResizeTerminal,
) -> Result<DaemonMessage, OpError> {
    let pty = ops.resize_terminal(CALLER, &r.terminal_id, r.cols, r.rows)?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Terminal {
            terminal: wire::terminal_info(&pty),
        },
    ))
}

/// `close_terminal`.
pub(super) async fn close_terminal(
    ops: &Ops,
    request_id: Option<String>,
    r: rq::CloseTerminal,
) -> Result<DaemonMessage, OpError> {
    let pty = ops.close_terminal(CALLER, &r.terminal_id).await?;
    Ok(DaemonMessage::answer(
        request_id,
        answers::Terminal {
            terminal: wire::terminal_info(&pty),
        },
    ))
}

/// Answers `attach_terminal`. The answer is to be sent before the session takes the next
/// push: the first output comes after its `terminal_attached`.
pub(super) fn attach_terminal(
    follows: &mut Follows,
    request_id: Option<String>,
    r: &rq::AttachTerminal,
    ops: &Ops,
) -> DaemonMessage {
    let pty = match ops.terminal(CALLER, &r.terminal_id) {
        Ok(pty) => pty,
        Err(e) => {
            return request_error(request_id, e.code(), e.to_string(), wire::error_details(&e));
        }
    };
    let offset = r.offset.unwrap_or_else(|| pty.kept_from());
    let answer = DaemonMessage::answer(
        request_id.clone(),
        answers::TerminalAttached {
            terminal: wire::terminal_info(&pty),
            offset,
        },
    );
    let attached = follows.add(&pty.id.clone(), |follow, out| {
        tokio::spawn(push(pty, offset, follow, out))
    });
    if attached {
        answer
    } else {
        request_error(
            request_id,
            ErrorCode::TooManyRequests,
            "this connection follows too many jobs and terminals already; detach one first".into(),
            None,
        )
    }
}

/// Answers `detach_terminal`: no output of the terminal is pushed after its
/// `terminal_detached`.
pub(super) fn detach_terminal(
    follows: &mut Follows,
    request_id: Option<String>,
    r: &rq::DetachTerminal,
) -> DaemonMessage {
    DaemonMessage::answer(
        request_id,
        answers::TerminalDetached {
            terminal_id: r.terminal_id.clone(),
            attached: follows.stop(&r.terminal_id),
        },
    )
}

/// One attachment's task: waits for output, then for room in the session's queue, then reads
/// what there is (up to [`CHUNK`]) and queues it; once the terminal ended and everything was
/// sent, its `terminal_exit`.
async fn push(pty: Arc<Pty>, mut offset: u64, follow: u64, out: mpsc::Sender<Push>) {
    let mut progress = pty.progress();
    loop {
        let (end, ended) = {
            let now = progress.borrow_and_update();
            (now.end, now.ended.clone())
        };
        if offset < end {
            let Ok(permit) = out.reserve().await else {
                return; // the session ended
            };
            if let Some(chunk) = pty.read(offset, CHUNK, ended.is_some()) {
                offset = chunk.next_offset;
                if !chunk.data.is_empty() {
                    let text = encode(&DaemonMessage::TerminalOutput {
                        terminal_id: pty.id.clone(),
                        offset: chunk.offset,
                        data: chunk.data,
                        next_offset: chunk.next_offset,
                    });
                    permit.send(Push::new(follow, text, false));
                }
                continue;
            }
        }
        if let Some(ended) = ended {
            let Ok(permit) = out.reserve().await else {
                return;
            };
            let text = encode(&DaemonMessage::TerminalExit {
                terminal_id: pty.id.clone(),
                status: ended.status,
                exit_code: ended.exit_code,
            });
            permit.send(Push::new(follow, text, true));
            return;
        }
        if progress.changed().await.is_err() {
            return;
        }
    }
}
