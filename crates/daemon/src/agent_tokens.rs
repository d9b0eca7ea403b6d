//! Agents' credentials for drover's MCP server: each agent reaches it at `/mcp/<token>`, with a
//! token nobody else knows that says which agent calls.
//!
//! A token is minted (from the operating system's CSPRNG) when an agent's runtime first asks
//! for its URL and lives in memory only, so a restart kills every token. The agent's archive
//! kills it too: an archived agent's token is refused and forgotten, and unarchiving forgets it
//! as well, so a token seen before an archive never works again; the next runtime gets a new
//! one.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use drover_core::AgentId;

#[derive(Debug, Default)]
pub(crate) struct AgentTokens {
    inner: Mutex<Maps>,
}

#[derive(Debug, Default)]
struct Maps {
    by_token: HashMap<String, AgentId>,
    by_agent: HashMap<AgentId, String>,
}

impl AgentTokens {
    /// The agent's token, minted at first need.
    pub(crate) fn token_for(&self, agent: AgentId) -> String {
        let mut maps = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = maps.by_agent.get(&agent) {
            return token.clone();
        }
        let token = crate::lock::new_secret();
        maps.by_agent.insert(agent, token.clone());
        maps.by_token.insert(token.clone(), agent);
        token
    }

    /// Which agent `token` stands for, if any.
    pub(crate) fn agent(&self, token: &str) -> Option<AgentId> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_token
            .get(token)
            .copied()
    }

    /// Forgets the agent's token: whoever holds it is refused from now on.
    pub(crate) fn revoke(&self, agent: AgentId) {
        let mut maps = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = maps.by_agent.remove(&agent) {
            maps.by_token.remove(&token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_token_names_no_one_and_the_next_one_differs() {
        let tokens = AgentTokens::default();
        let agent = AgentId::new();
        let first = tokens.token_for(agent);
        assert_eq!(tokens.token_for(agent), first, "one token per agent");
        assert_eq!(first.len(), 64);
        assert_eq!(tokens.agent(&first), Some(agent));
        tokens.revoke(agent);
        assert_eq!(tokens.agent(&first), None);
        let second = tokens.token_for(agent);
        assert_ne!(second, first);
        assert_eq!(tokens.agent(&second), Some(agent));
    }
}
