//! The agents' tasks: the table of their handles, the commands every task takes from the
//! manager and the registry (cancel, close, shutdown), and `Runtimes`, the registry's weak
//! `RuntimeControl` onto them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use drover_core::inbox::Inbox;
use drover_core::{AgentId, BoxFuture, CancelCause, Registry, RuntimeControl, RuntimeError};
use tokio::sync::{mpsc, oneshot, watch};

use crate::actor::Command;
use crate::{AcpError, warm};

/// Asks agent `agent`'s task to hibernate its idle runtime (its task checks it still is).
pub(crate) fn ask_to_hibernate(actors: &Weak<Actors>, agent: AgentId) {
    let Some(handle) = actors.upgrade().and_then(|a| a.existing(agent)) else {
        return;
    };
    if let Err(mpsc::error::TrySendError::Full(command)) =
        handle.commands.try_send(Command::Hibernate)
    {
        // A full channel means the task is busy: it asks again when idle; sending later is
        // enough, and never blocks whoever freed or asked for a slot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = handle.commands.send(command).await;
            });
        }
    }
}

#[derive(Clone)]
pub(crate) struct ActorHandle {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) busy: watch::Receiver<bool>,
    /// Its sender is dropped when the task has ended (see [`ActorHandle::ended`]).
    pub(crate) ended: watch::Receiver<()>,
    pub(crate) generation: u64,
}

impl ActorHandle {
    /// Resolves once the task has ended: its files are closed and it left the task table.
    pub(crate) async fn ended(&self) {
        // Nothing is ever sent: `changed` returns (an error) when the sender is dropped.
        let _ = self.ended.clone().changed().await;
    }

    /// Sends the command `command` builds around a reply channel and awaits the reply.
    pub(crate) async fn request<T>(
        &self,
        agent: AgentId,
        command: impl FnOnce(oneshot::Sender<Result<T, AcpError>>) -> Command,
    ) -> Result<T, AcpError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| AcpError::Stopped(agent))?;
        rx.await.map_err(|_| AcpError::Stopped(agent))?
    }
}

/// The agents' tasks. The manager starts them; the registry reaches them (cancel, close,
/// shutdown) through [`Runtimes`], without the rest of the manager.
pub(crate) struct Actors {
    pub(crate) home: PathBuf,
    /// Set once the registry is open: whether a closed agent is archived (its inbox goes).
    /// The registry holds the actors weakly, so this makes no cycle.
    pub(crate) registry: std::sync::OnceLock<Registry>,
    pub(crate) tasks: Mutex<HashMap<AgentId, ActorHandle>>,
    /// The providers' warm spares (they end first when the daemon stops).
    pub(crate) spares: Arc<warm::Spares>,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) generation: AtomicU64,
}

impl Actors {
    pub(crate) fn tasks(&self) -> MutexGuard<'_, HashMap<AgentId, ActorHandle>> {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn archived(&self, agent: AgentId) -> bool {
        self.registry
            .get()
            .and_then(|r| r.get(agent))
            .is_some_and(|a| a.is_archived())
    }

    pub(crate) fn existing(&self, agent: AgentId) -> Option<ActorHandle> {
        self.tasks().get(&agent).cloned()
    }

    pub(crate) fn forget(&self, id: AgentId, generation: u64) {
        let mut tasks = self.tasks();
        if tasks.get(&id).is_some_and(|h| h.generation == generation) {
            tasks.remove(&id);
        }
    }

    /// Cancels the agent's turn; without `keep_inbox` its queued messages go too, also from
    /// the disk of an agent with no task.
    pub(crate) async fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> Result<(), AcpError> {
        let Some(handle) = self.existing(agent) else {
            if !keep_inbox {
                // A cold agent may still hold queued messages on disk.
                let home = self.home.clone();
                tokio::task::spawn_blocking(move || {
                    Inbox::open(&home, agent).and_then(|mut i| i.discard_all())
                })
                .await
                .map_err(|_| AcpError::ShuttingDown)??;
            }
            return Ok(());
        };
        handle
            .request(agent, |reply| Command::Cancel {
                cause,
                keep_inbox,
                reply,
            })
            .await
    }

    pub(crate) async fn close(&self, agent: AgentId, cause: CancelCause) {
        let Some(handle) = self.existing(agent) else {
            self.discard_cold_inbox(agent);
            return;
        };
        let (reply, rx) = oneshot::channel();
        if handle
            .commands
            .send(Command::Close { cause, reply })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        // The task may have been closing already (another close, or it is ending): whoever
        // closed it, nothing of it runs once this returns. An unarchive that follows an
        // archive therefore finds the inbox the archive's close discarded, not one a task
        // still ending left behind (the task decides to discard at its very end).
        handle.ended().await;
        self.discard_cold_inbox(agent);
    }

    /// If the agent is archived and has no task: what its inbox held never runs (archive wins), and the
    /// file goes. Done under the task table's lock, so no task of this agent opens the inbox
    /// meanwhile (a task starts under it); the work is one read, one fsynced line, one unlink.
    pub(crate) fn discard_cold_inbox(&self, agent: AgentId) {
        let tasks = self.tasks();
        // Not archived (any more): nothing to discard. A task took it over: its close discards.
        if !self.archived(agent) || tasks.contains_key(&agent) {
            return;
        }
        let discarded = Inbox::open(&self.home, agent)
            .and_then(|mut inbox| inbox.discard_all())
            .and_then(|dropped| Inbox::remove(&self.home, agent).map(|()| dropped));
        drop(tasks);
        match discarded {
            Ok(dropped) if !dropped.is_empty() => {
                tracing::info!(%agent, count = dropped.len(), "archive dropped the queued messages of a cold agent");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%agent, error = %e, "cannot discard the inbox of an archived agent; boot removes it");
            }
        }
    }

    /// Stops every runtime and takes no new work.
    pub(crate) async fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.spares.shutdown().await;
        let handles: Vec<ActorHandle> = self.tasks().values().cloned().collect();
        let mut closing = tokio::task::JoinSet::new();
        for handle in handles {
            closing.spawn(async move {
                let (reply, rx) = oneshot::channel();
                if handle
                    .commands
                    .send(Command::Shutdown { reply })
                    .await
                    .is_ok()
                {
                    let _ = rx.await;
                }
            });
        }
        while closing.join_next().await.is_some() {}
    }
}

/// A runtime's failure as the registry's `RuntimeError`.
fn registry_error(agent: AgentId, error: &AcpError) -> RuntimeError {
    RuntimeError {
        agent,
        message: error.to_string(),
    }
}

/// The runtimes as the registry sees them. It holds the actors weakly: the actors hold the
/// registry, and ownership runs from the manager to the registry, never back. Once the
/// manager is gone there is nothing left to cancel or close.
pub(crate) struct Runtimes(pub(crate) Weak<Actors>);

impl RuntimeControl for Runtimes {
    fn cancel(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            let Some(actors) = actors else { return Ok(()) };
            actors
                .cancel(agent, cause, keep_inbox)
                .await
                .map_err(|e| registry_error(agent, &e))
        })
    }

    fn close(
        &self,
        agent: AgentId,
        cause: CancelCause,
    ) -> BoxFuture<'static, Result<(), RuntimeError>> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            if let Some(actors) = actors {
                actors.close(agent, cause).await;
            }
            Ok(())
        })
    }

    fn shutdown(&self) -> BoxFuture<'static, ()> {
        let actors = self.0.upgrade();
        Box::pin(async move {
            if let Some(actors) = actors {
                actors.shutdown().await;
            }
        })
    }
}
