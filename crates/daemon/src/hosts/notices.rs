//! A host's notices for this daemon's agents (see `drover_core::outbox`): each is queued in its
//! agent's inbox under the notice's own id, once, and only for an agent that gave that host an
//! agent, as told by an agent that host holds.
//!
//! Once: a notice the inbox or timeline already holds is only acknowledged (`Inbox::reached`);
//! one handed to a runtime that did not answer in time stays "in flight", and an offer of it
//! again waits until it is seen queued instead of handing it over a second time.

use std::sync::PoisonError;
use std::time::Duration;

use drover_acp::AcpError;
use drover_core::inbox::{Delivery, Inbox, InboxMessage};
use drover_core::{AgentId, RegistryError};
use drover_protocol::NoticeInfo;

use super::Hosts;

/// How long queueing a notice may take before it is looked at again later.
const NOTICE_WAIT: Duration = Duration::from_secs(30);

/// What became of a notice, and so what the link tells the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// Queued now or before, or never deliverable (its agent is gone or archived): the host
    /// may drop it.
    Ack,
    /// Not yet: offered again at the next ping.
    Later,
    /// Not this daemon's to take (an agent that gave that host nothing, or a sender it does
    /// not hold): neither taken nor acknowledged.
    NotMine,
}

pub(super) async fn deliver(hosts: &Hosts, host: &str, notice: NoticeInfo) -> Delivered {
    let inner = &hosts.inner;
    let (Ok(to), Ok(from)) = (notice.to.parse::<AgentId>(), notice.from.parse::<AgentId>()) else {
        tracing::warn!(%host, notice = %notice.id, "a host's notice names no agent; not taken");
        return Delivered::NotMine;
    };
    if !inner.parents.has(host, to) {
        tracing::warn!(%host, %to, "a host sent a notice for an agent that gave it nothing; not taken");
        return Delivered::NotMine;
    }
    if !hosts.link(host).is_ok_and(|link| link.holds_agent(from)) {
        tracing::warn!(%host, %from, "a host sent a notice from an agent it does not hold; not taken");
        return Delivered::NotMine;
    }
    let runtimes = &inner.runtimes;
    let home = runtimes.registry().home().to_path_buf();
    let id = notice.id.clone();
    let reached = tokio::task::spawn_blocking(move || Inbox::reached(&home, to, &id)).await;
    let in_flight = || {
        inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    };
    if reached.unwrap_or(false) {
        in_flight().remove(&notice.id);
        return Delivered::Ack;
    }
    if !in_flight().insert(notice.id.clone()) {
        return Delivered::Later;
    }
    // A notice tells; it never cancels the agent's turn (a host's `steer` is taken as a
    // followup).
    let delivery = match notice.delivery {
        Delivery::Steer => Delivery::Followup,
        other => other,
    };
    let message = InboxMessage {
        id: notice.id.clone(),
        at: jiff::Timestamp::now(),
        delivery,
        text: notice.text,
        source: format!("agent:{from}"),
        notify: None,
    };
    let outcome = match tokio::time::timeout(NOTICE_WAIT, runtimes.deliver_message(to, message))
        .await
    {
        Ok(Ok(_)) => Delivered::Ack,
        Ok(Err(AcpError::Registry(
            e @ (RegistryError::UnknownAgent(_) | RegistryError::Archived { .. }),
        ))) => {
            tracing::info!(agent = %to, %from, error = %e, "a host's notice cannot be delivered; dropped");
            Delivered::Ack
        }
        Ok(Err(error)) => {
            tracing::warn!(agent = %to, %error, "a host's notice is not delivered yet");
            Delivered::Later
        }
        // Handed over and not answered: it stays in flight until it is seen queued.
        Err(_) => return Delivered::Later,
    };
    in_flight().remove(&notice.id);
    outcome
}
