//! What the operations ask of one agent's runtime: create and start it, deliver messages,
//! cancel, permissions, mode, model and config options, waiting until idle, its timeline.

use std::time::Duration;

use drover_core::inbox::{Delivery, Inbox, InboxMessage};
use drover_core::timeline::{Page, Timeline, TimelinePage};
use drover_core::{Agent, AgentId, AgentStatus, CancelCause, NewAgent, RegistryError};
use tokio::sync::oneshot;

use crate::actor::Command;
use crate::providers::Availability;
use crate::{AcpError, PendingPermission, PermissionAnswer, RuntimeManager};

impl RuntimeManager {
    /// Starts the agent's runtime if it is not running (an archived agent is left alone).
    pub async fn ensure_started(&self, agent: AgentId) -> Result<(), AcpError> {
        if self.known(agent)?.is_archived() {
            return Ok(());
        }
        let handle = self.handle(agent).await?;
        handle
            .commands
            .send(Command::Start)
            .await
            .map_err(|_| AcpError::Stopped(agent))
    }

    /// Looks again at what waits in the inbox of each of `agents` (a budget that held it was
    /// raised): an agent with queued messages gets its task, which delivers them if nothing
    /// holds them any more. Archived agents are left alone.
    pub async fn wake_queued(&self, agents: &[AgentId]) {
        for &agent in agents {
            if self.registry().get(agent).is_none_or(|a| a.is_archived()) {
                continue;
            }
            // A task (live or closing) owns the inbox: it is told; a cold agent's inbox is
            // read here, as at boot.
            let has_task = self.shared.actors.tasks().contains_key(&agent);
            if !has_task && !Inbox::open(&self.shared.home, agent).is_ok_and(|i| i.has_wake()) {
                continue;
            }
            if let Ok(handle) = self.handle(agent).await {
                let _ = handle.commands.send(Command::Wake).await;
            }
        }
    }

    /// After `id` (or a subagent on another host below it) spent more: the turns running in the
    /// tree of each hard budget of its lineage that is now spent are cancelled (cause `budget`,
    /// queued messages kept).
    pub async fn cancel_for_hard_budgets(&self, id: AgentId) {
        let registry = self.registry();
        let hard: Vec<AgentId> = registry
            .spent_budgets(id)
            .into_iter()
            .filter(|s| s.budget.hard)
            .map(|s| s.agent)
            .collect();
        for budgeted in hard {
            for agent in registry.tree(budgeted) {
                let running = registry
                    .get(agent)
                    .is_some_and(|a| a.status == AgentStatus::Running && !a.is_archived());
                if !running {
                    continue;
                }
                tracing::info!(agent = %agent, budgeted = %budgeted, "a hard budget is spent: cancelling the turn");
                if let Err(e) = self.cancel_turn(agent, CancelCause::Budget, true).await {
                    tracing::warn!(agent = %agent, error = %e, "cannot cancel a turn past a hard budget");
                }
            }
        }
    }

    /// Starts the agent's runtime again after a failed start, now (the user's retry): its
    /// queued messages then run.
    pub async fn restart(&self, agent: AgentId) -> Result<(), AcpError> {
        if self.known(agent)?.is_archived() {
            return Err(RegistryError::Archived { agent }.into());
        }
        let handle = self.handle(agent).await?;
        handle
            .commands
            .send(Command::Retry)
            .await
            .map_err(|_| AcpError::Stopped(agent))
    }

    /// The messages queued for the agent and not delivered yet, oldest first.
    pub async fn queued(&self, agent: AgentId) -> Result<Vec<InboxMessage>, AcpError> {
        if self.known(agent)?.is_archived() {
            return Ok(Vec::new());
        }
        let published = || {
            self.shared
                .queued
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&agent)
                .cloned()
        };
        // Published by the agent's task: no waiting for a task busy starting the agent.
        if let Some(queued) = published() {
            return Ok(queued);
        }
        let handle = self.handle(agent).await?;
        if let Some(queued) = published() {
            return Ok(queued);
        }
        let (reply, rx) = oneshot::channel();
        handle
            .commands
            .send(Command::Queued { reply })
            .await
            .map_err(|_| AcpError::Stopped(agent))?;
        rx.await.map_err(|_| AcpError::Stopped(agent))
    }

    /// Checks that the agent's provider is known and available, and fills in the provider's
    /// default model, mode and effort: what must hold before an agent is recorded.
    pub fn prepare(&self, new: &mut NewAgent) -> Result<(), AcpError> {
        let providers = self.providers()?;
        let provider = providers
            .get(&new.provider)
            .ok_or_else(|| AcpError::UnknownProvider {
                name: new.provider.clone(),
                known: providers.all().map(|p| p.name.clone()).collect(),
            })?;
        if let Availability::Unavailable { reason } = providers.availability(provider) {
            return Err(AcpError::ProviderUnavailable {
                provider: new.provider.clone(),
                reason,
            });
        }
        if new.config.model.is_none() {
            new.config.model = provider.default_model.clone();
        }
        if new.config.mode.is_none() {
            new.config.mode = provider.default_mode.clone();
        }
        if new.config.effort.is_none() {
            new.config.effort = provider.default_effort.clone();
        }
        Ok(())
    }

    /// Starts a newly recorded agent's runtime and queues `prompt` as its first message (from
    /// `source`: `user`, `agent:{id}`), telling `notify` how that turn goes.
    pub async fn start_new(
        &self,
        agent: &Agent,
        prompt: Option<String>,
        source: String,
        notify: Option<AgentId>,
    ) -> Result<(), AcpError> {
        let handle = self.handle(agent.id).await?;
        if let Some(prompt) = prompt.filter(|p| !p.trim().is_empty()) {
            let message = InboxMessage::new(Delivery::Followup, prompt, source).notifying(notify);
            handle
                .request(agent.id, |reply| Command::Deliver { message, reply })
                .await
        } else {
            let _ = handle.commands.send(Command::Start).await;
            Ok(())
        }
    }

    /// Queues a message. `followup` waits for the current turn, `steer` cancels it (keeping
    /// the inbox) and goes first, `inject` rides along with the next prompt. Returns the
    /// message id once it is durable.
    pub async fn deliver(
        &self,
        agent: AgentId,
        delivery: Delivery,
        text: String,
        source: String,
    ) -> Result<String, AcpError> {
        self.deliver_message(agent, InboxMessage::new(delivery, text, source))
            .await
    }

    /// [`RuntimeManager::deliver`] for a message built by the caller (e.g. one whose turn
    /// notifies another agent when it ends).
    pub async fn deliver_message(
        &self,
        agent: AgentId,
        message: InboxMessage,
    ) -> Result<String, AcpError> {
        let record = self.known(agent)?;
        // Archive wins: an archived agent takes no message (its task checks again, after
        // any archive that raced this one).
        if record.is_archived() {
            return Err(RegistryError::Archived { agent }.into());
        }
        let id = message.id.clone();
        // A task that is closing (its agent was just archived or closed) takes no more
        // commands: the message goes to a fresh one.
        for attempt in 0..3 {
            let handle = self.handle(agent).await?;
            let message = message.clone();
            match handle
                .request(agent, |reply| Command::Deliver { message, reply })
                .await
            {
                // It began to close after `handle`: the next `handle` waits for its end.
                Err(AcpError::Stopped(_)) if attempt < 2 => {}
                other => return other.map(|()| id),
            }
        }
        Ok(id)
    }

    /// Cancels the running turn; without `keep_inbox`, queued messages are dropped too.
    pub async fn cancel_turn(
        &self,
        agent: AgentId,
        cause: CancelCause,
        keep_inbox: bool,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        self.shared.actors.cancel(agent, cause, keep_inbox).await
    }

    pub async fn answer_permission(
        &self,
        agent: AgentId,
        answer: PermissionAnswer,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self
            .existing(agent)
            .ok_or(AcpError::NoPendingPermission(agent))?;
        handle
            .request(agent, |reply| Command::Answer { answer, reply })
            .await
    }

    pub async fn pending_permissions(
        &self,
        agent: AgentId,
    ) -> Result<Vec<PendingPermission>, AcpError> {
        self.known(agent)?;
        let Some(handle) = self.existing(agent) else {
            return Ok(Vec::new());
        };
        handle
            .request(agent, |reply| Command::Pending { reply })
            .await
    }

    /// Sets the mode (recorded, and sent to a live agent).
    pub async fn set_mode(&self, agent: AgentId, mode: String) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetMode { mode, reply })
            .await
    }

    /// Sets the model (recorded, and sent to a live agent).
    pub async fn set_model(&self, agent: AgentId, model: String) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetModel { model, reply })
            .await
    }

    /// Sets one of the agent's config options, named by its id or its category (recorded,
    /// and sent to a live agent).
    pub async fn set_config_option(
        &self,
        agent: AgentId,
        key: String,
        value: String,
    ) -> Result<(), AcpError> {
        self.known(agent)?;
        let handle = self.handle(agent).await?;
        handle
            .request(agent, |reply| Command::SetConfigOption {
                key,
                value,
                reply,
            })
            .await
    }

    /// Resolves when the agent is idle with nothing queued that would wake it, or after
    /// `timeout` (then `false`).
    pub async fn wait_idle(&self, agent: AgentId, timeout: Duration) -> Result<bool, AcpError> {
        self.known(agent)?;
        let Some(handle) = self.existing(agent) else {
            return Ok(true);
        };
        let mut busy = handle.busy.clone();
        let settled = async move {
            // Commands sent before this call (a delivery) must count.
            let (reply, rx) = oneshot::channel();
            if handle.commands.send(Command::Ping { reply }).await.is_ok() {
                let _ = rx.await;
            }
            let _ = busy.wait_for(|b| !*b).await;
        };
        Ok(tokio::time::timeout(timeout, settled).await.is_ok())
    }

    /// A page of the agent's timeline (from disk: appends are written as they happen).
    pub async fn timeline(&self, agent: AgentId, page: Page) -> Result<TimelinePage, AcpError> {
        self.known(agent)?;
        let home = self.shared.home.clone();
        Ok(
            tokio::task::spawn_blocking(move || Timeline::read_page(&home, agent, page))
                .await
                .map_err(|_| AcpError::ShuttingDown)??,
        )
    }

    /// The process id of the agent's live runtime (its process group id), if any.
    pub async fn runtime_pid(&self, agent: AgentId) -> Option<u32> {
        let handle = self.existing(agent)?;
        let (reply, rx) = oneshot::channel();
        handle.commands.send(Command::Pid { reply }).await.ok()?;
        rx.await.ok().flatten()
    }
}
