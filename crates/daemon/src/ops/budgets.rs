//! Budgets per agent tree: a budget set on an agent (tokens and/or cost) covers it and its
//! whole subtree. When a tree has spent its budget, no new turn starts in it: a message that
//! would wake an agent of the tree, and a subagent's creation under it, are refused with
//! `budget_exhausted`, listing what each agent of the tree spent. Running turns finish.

use drover_core::{AgentId, Budget, Spend};
use drover_protocol::{AgentSpendInfo, BudgetExhaustedInfo, BudgetSpendInfo};

use super::{Caller, OpError, Ops};

impl Ops {
    /// Refuses with `budget_exhausted` when the budget of `id` or of any of its ancestors is
    /// spent (every budget on the lineage applies: a subagent's own budget does not lift its
    /// root's).
    pub(crate) fn check_budget(&self, id: AgentId) -> Result<(), OpError> {
        match self.registry.spent_budget(id) {
            Some(spent) => {
                let mut info = self.exhausted(spent.agent, spent.budget, spent.tree.spend);
                if spent.upstream {
                    // The hub's agent this subagent works for (its parent, not held here).
                    info.upstream = Some(
                        self.registry
                            .get(spent.agent)
                            .and_then(|a| a.parent_id())
                            .map_or_else(String::new, |p| p.to_string()),
                    );
                }
                Err(OpError::BudgetExhausted {
                    info: Box::new(info),
                })
            }
            None => Ok(()),
        }
    }

    /// The refusal: the tree's `total`, and what each of its agents spent.
    fn exhausted(&self, id: AgentId, budget: Budget, total: Spend) -> BudgetExhaustedInfo {
        let agents = self
            .registry
            .spend_by_agent(id)
            .into_iter()
            .map(|(agent, s)| AgentSpendInfo {
                agent_id: agent.to_string(),
                tokens: s.tokens,
                cost: s.cost,
                currency: s.currency,
            })
            .collect();
        BudgetExhaustedInfo {
            agent_id: id.to_string(),
            budget,
            spend: BudgetSpendInfo {
                tokens: total.tokens,
                cost: total.cost,
                currency: total.currency,
                agents,
            },
            upstream: None,
        }
    }

    /// Sets or clears the budget of `id`'s tree. A user's request only: an agent may not
    /// raise the budget it runs under.
    pub(crate) async fn set_budget(
        &self,
        caller: Caller,
        id: AgentId,
        budget: Option<Budget>,
    ) -> Result<(), OpError> {
        if caller != Caller::User {
            return Err(OpError::NotPermitted(
                "only a user may set a budget".to_string(),
            ));
        }
        let budget = budget.map(valid_budget).transpose()?;
        self.agent(id)?;
        self.registry.set_budget(id, budget).await?;
        // What the spent budget held (drover's own notices, schedule runs) goes now, where no
        // other budget still holds it.
        self.runtimes.wake_queued(&self.registry.tree(id)).await;
        Ok(())
    }
}

/// A budget with at least one limit, each a sensible number (`None` fields: no limit).
pub(crate) fn valid_budget(budget: Budget) -> Result<Budget, OpError> {
    if budget.tokens.is_none() && budget.cost.is_none() {
        return Err(OpError::invalid("budget", "give `tokens` and/or `cost`"));
    }
    if budget.cost.is_some_and(|c| !c.is_finite() || c < 0.0) {
        return Err(OpError::invalid("budget.cost", "must be a number ≥ 0"));
    }
    Ok(budget)
}

/// The refusal's message; with `upstream`, the budget is what the hub that made this subagent
/// here let its tree spend (its parent's tree there had that left).
pub(crate) fn refusal(info: &BudgetExhaustedInfo) -> String {
    if let Some(parent) = &info.upstream {
        format!(
            "the budget of the tree agent `{parent}` belongs to on the hub is spent (its subagent `{}` here spent with its subtree {} it may spend); raise that budget on the hub",
            info.agent_id,
            summary(info)
        )
    } else {
        format!(
            "the budget of agent `{}` is spent ({}): nothing new starts in its tree until the budget is raised or cleared",
            info.agent_id,
            summary(info)
        )
    }
}

/// "120 of 100 tokens": for the refusal's message.
pub(crate) fn summary(info: &BudgetExhaustedInfo) -> String {
    let mut parts = Vec::new();
    if let Some(limit) = info.budget.tokens {
        parts.push(format!(
            "{} of {limit} tokens",
            info.spend.tokens.unwrap_or(0)
        ));
    }
    if let Some(limit) = info.budget.cost {
        parts.push(format!(
            "{:.4} of {limit:.4} cost",
            info.spend.cost.unwrap_or(0.0)
        ));
    }
    parts.join(", ")
}
