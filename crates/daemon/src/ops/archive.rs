//! Unarchive, detach, and archiving the idle children of an agent.

use drover_core::{AgentId, BulkArchiveOutcome};

use super::{Caller, OpError, Ops};

impl Ops {
    pub(crate) async fn unarchive(&self, caller: Caller, id: AgentId) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        // A token seen before the archive stays dead; the next runtime gets a new one.
        self.agent_tokens.revoke(id);
        self.registry.unarchive(id).await?;
        // Its subagents on other hosts may take turns again.
        self.hosts.sync_gates();
        Ok(())
    }

    /// Makes a subagent a top-level agent; it keeps running.
    pub(crate) async fn detach(&self, caller: Caller, id: AgentId) -> Result<(), OpError> {
        let target = self.controlled(caller, id)?;
        if caller == Caller::Agent(target.id) {
            return Err(OpError::NotPermitted(
                "an agent cannot detach itself".to_string(),
            ));
        }
        self.registry.detach(id).await?;
        Ok(())
    }

    /// Archives the children that run nothing; reports the others.
    pub(crate) async fn archive_idle_children(
        &self,
        caller: Caller,
        id: AgentId,
    ) -> Result<BulkArchiveOutcome, OpError> {
        self.controlled(caller, id)?;
        let mut outcome = self.registry.archive_idle_children(id).await?;
        if self.hosts.any() {
            self.archive_idle_remote_children(id, &mut outcome).await?;
        }
        Ok(outcome)
    }
}
