//! The seam between the registry and agent runtimes (live processes and ACP sessions).
//!
//! The registry decides; runtimes carry it out. The registry never waits on a runtime while it
//! holds its own state, and never learns how a runtime is implemented.

use std::future::Future;
use std::pin::Pin;

use crate::ids::AgentId;

/// A boxed future, so runtimes and families can be trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who cancels a turn: the protocol's `cause` of a `turn_canceled`, recorded with the
/// cancellation so timelines can say why.
pub use drover_protocol::CancelCause;

/// A runtime operation that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("runtime of agent `{agent}`: {message}")]
pub struct RuntimeError {
    pub agent: AgentId,
    pub message: String,
}

/// What the registry asks of the runtimes. Every method is safe to call for an agent without a
/// live runtime (it has nothing to do and succeeds).
pub trait RuntimeControl: Send + Sync + 'static {
    /// Cancels the agent's running turn; with `keep_inbox` queued messages stay for later.
    /// Resolves when the cancel is issued, not when the turn has settled.
    fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>>;

    /// Closes the agent's runtime (ends its process group). The agent stays, cold. A turn the
    /// close cuts off ends canceled with `cause`, unless a cancel already gave it one.
    fn close(
        &self,
        agent: AgentId,
        cause: CancelCause,
    ) -> BoxFuture<'static, Result<(), RuntimeError>>;

    /// Closes every runtime, for daemon shutdown.
    fn shutdown(&self) -> BoxFuture<'static, ()>;
}

/// The runtimes of a daemon that starts no agent process: every agent is cold, so there is
/// never anything to cancel or close.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoRuntimes;

impl RuntimeControl for NoRuntimes {
    fn cancel(
        &self,
        _: AgentId,
        _: CancelCause,
        _: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        Box::pin(async { Ok(()) })
    }

    fn close(&self, _: AgentId, _: CancelCause) -> BoxFuture<'static, Result<(), RuntimeError>> {
        Box::pin(async { Ok(()) })
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}
