//! Notifications: what a client shows (so nothing is sent about it), the sinks' status, and
//! a sample sent on request. The notifier itself is `crate::notify`.

use super::{OpError, Ops, parse_agent};
use crate::notify::SinkReport;

impl Ops {
    /// Session `session` shows the agent `agent` now (`None`: nothing, or its page is hidden).
    pub(crate) fn set_watching(&self, session: &str, agent: Option<&str>) -> Result<(), OpError> {
        let agent = match agent {
            Some(raw) => Some(self.agent(parse_agent(raw)?)?.id),
            None => None,
        };
        self.notifier.set_watching(session, agent);
        Ok(())
    }

    /// The session is gone: it shows nothing any more.
    pub(crate) fn forget_session(&self, session: &str) {
        self.notifier.set_watching(session, None);
    }

    /// Every sink and how its deliveries went.
    pub(crate) fn notify_status(&self) -> Vec<SinkReport> {
        self.notifier.report()
    }

    /// Sends a sample to the sink `sink` (or every sink) and waits for each outcome.
    pub(crate) async fn notify_test(
        &self,
        sink: Option<&str>,
    ) -> Result<Vec<(String, Result<(), String>)>, OpError> {
        self.notifier
            .test(sink)
            .await
            .map_err(|e| OpError::invalid("sink", e))
    }
}
