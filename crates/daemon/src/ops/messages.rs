//! Messages to agents (followup, steer, inject) and cancelling their turns.

use drover_core::inbox::{Delivery, InboxMessage};
use drover_core::{AgentId, CancelCause};

use super::{Caller, OpError, Ops};

impl Ops {
    /// Queues `text` for the agent; returns the message id once it is durable. When an agent
    /// sends a message that wakes another agent, it is told how that turn goes unless
    /// `notify_sender` is false.
    pub(crate) async fn send_message(
        &self,
        caller: Caller,
        id: AgentId,
        text: String,
        delivery: Delivery,
        notify_sender: bool,
    ) -> Result<SentMessage, OpError> {
        let target = self.controlled(caller, id)?;
        if text.trim().is_empty() {
            return Err(OpError::invalid("text", "must not be empty"));
        }
        let notify = match caller {
            Caller::Agent(me) if notify_sender && me != target.id && delivery.wakes() => Some(me),
            _ => None,
        };
        let message = InboxMessage::new(delivery, text, caller.source()).notifying(notify);
        let message_id = self
            .queue_message(caller, target.id, message, WhenSpent::Refuse)
            .await?;
        Ok(SentMessage {
            message_id,
            notify: notify.is_some(),
        })
    }

    /// Queues `text` from the hub's agent that created this one over a link (its upstream),
    /// which is told how the turn it wakes goes (through the outbox, see
    /// `drover_core::outbox`).
    pub(crate) async fn send_from_upstream(
        &self,
        id: AgentId,
        text: String,
        delivery: Delivery,
    ) -> Result<SentMessage, OpError> {
        let target = self.agent(id)?;
        if text.trim().is_empty() {
            return Err(OpError::invalid("text", "must not be empty"));
        }
        // An agent below the one the hub made has no upstream of its own: nobody is told.
        let upstream = target.upstream_id();
        let notify = upstream.filter(|_| delivery.wakes());
        let source = upstream.map_or_else(|| Caller::User.source(), |u| format!("agent:{u}"));
        let message = InboxMessage::new(delivery, text, source).notifying(notify);
        let message_id = self
            .queue_message(Caller::User, id, message, WhenSpent::Refuse)
            .await?;
        Ok(SentMessage {
            message_id,
            notify: notify.is_some(),
        })
    }

    /// Queues a message the caller built for `id` (whom `caller` controls); returns its id
    /// once it is durable. A schedule's run is one: it chose the id and recorded it first.
    pub(crate) async fn queue_message(
        &self,
        caller: Caller,
        id: AgentId,
        message: InboxMessage,
        when_spent: WhenSpent,
    ) -> Result<String, OpError> {
        let target = self.controlled(caller, id)?;
        if when_spent == WhenSpent::Refuse && message.delivery.wakes() {
            self.check_budget(target.id)?;
        }
        let delivery = match message.delivery {
            Delivery::Followup => "followup",
            Delivery::Steer => "steer",
            Delivery::Inject => "inject",
        };
        let message_id = self.runtimes.deliver_message(target.id, message).await?;
        tracing::info!(agent = %target.id, %message_id, delivery,
            by = caller.agent().map(tracing::field::display), "message queued");
        Ok(message_id)
    }

    /// Cancels the running turn; without `keep_inbox`, queued messages are dropped too.
    pub(crate) async fn cancel(
        &self,
        caller: Caller,
        id: AgentId,
        keep_inbox: bool,
    ) -> Result<(), OpError> {
        let target = self.controlled(caller, id)?;
        let cause = match caller {
            Caller::Agent(me) if me != target.id => CancelCause::Parent,
            _ => CancelCause::User,
        };
        Ok(self
            .runtimes
            .cancel_turn(target.id, cause, keep_inbox)
            .await?)
    }
}

/// What queueing does with a message that would wake an agent whose tree's budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhenSpent {
    /// Refuses it: what a client or an agent sends.
    Refuse,
    /// Queues it held in the inbox until the budget is raised: what drover queues itself for
    /// a spent tree (a schedule's run).
    Hold,
}

/// A queued message.
#[derive(Debug)]
pub(crate) struct SentMessage {
    pub(crate) message_id: String,
    /// The sender will be told how the turn goes.
    pub(crate) notify: bool,
}
