//! Answers to an agent's permission requests.

use drover_acp::{PermissionAnswer, PermissionChoice};
use drover_core::AgentId;

use super::{Caller, OpError, Ops};

impl Ops {
    /// Answers the permission request `seq` (the oldest pending one when `None`) with exactly
    /// one of an option kind, an option id, or a cancellation.
    pub(crate) async fn answer_permission(
        &self,
        caller: Caller,
        id: AgentId,
        seq: Option<u64>,
        kind: Option<String>,
        option_id: Option<String>,
        cancel: bool,
    ) -> Result<(), OpError> {
        self.controlled(caller, id)?;
        let choice = match (kind, option_id, cancel) {
            (Some(kind), None, false) => PermissionChoice::Kind(kind),
            (None, Some(option), false) => PermissionChoice::OptionId(option),
            (None, None, true) => PermissionChoice::Cancel,
            _ => {
                return Err(OpError::invalid(
                    "kind",
                    "give exactly one of `kind`, `optionId` or `cancel: true`",
                ));
            }
        };
        let answer = PermissionAnswer {
            request: seq,
            choice,
        };
        Ok(self.runtimes.answer_permission(id, answer).await?)
    }
}
