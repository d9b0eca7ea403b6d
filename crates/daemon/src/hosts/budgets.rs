//! Budgets across hosts: a subagent on a host counts in its hub parent's budgets.
//!
//! The hub learns what each host's agents spent from the link's view (their `spend`, kept as
//! the host last said) and gives it to its registry as the link takes it in ([`counted`],
//! `Registry::set_remote_spend`): there it counts in the trees of the hub's agents they work
//! for, so the tree's spend, the refusals (`budget_exhausted`, a new subagent here or on a
//! host), the turn gate of the hub's agents, the 80 % warning and a hard budget's cancel all
//! see it.
//!
//! The host holds its subagents to those budgets itself: on each subagent the hub made there
//! (the first of the host's agents below one of the hub's), the hub keeps one budget per budget
//! of its parent's lineage here, what that subagent's subtree may spend in all (what it spent
//! plus what the budgeted tree has left: `drover_core::upstream_allowance`), through
//! `set_upstream_budget`. The host checks them as budgets of that subagent's tree, beside any
//! set on it there, so its turns stop at the budget even while the link is down: a subagent
//! can spend what its tree had left when the hub last told it, not more (several subagents on
//! hosts cut off together can each spend that remainder). While a host that was heard from is
//! out of reach, what its subagents may still spend counts as spent in what the tree's
//! subagents on other hosts are given, new ones included ([`reserve`]): only what is provably
//! left. Until every host with subagents in a
//! budgeted tree was heard from since this daemon started, what it holds another host's
//! subagents to under that budget is not raised (`no_looser`): the spend missing here would
//! make the tree's remainder look larger than it is. [`keep_in_step`] acts on what the
//! counted spend changed and sends the budgets again whenever a link's agents, a record here or
//! a link changes: a reconciliation from the current state, never a queue, so nothing is lost
//! while a link is down.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, PoisonError, Weak};

use drover_core::{AgentId, Budget, RemoteSpend, Spend, budget_reached, upstream_allowance};
use serde_json::json;
use tokio::sync::Notify;

use super::link::RemoteRoot;
use super::{Inner, Link};

/// `host`'s agents below this daemon's spent `spends` (nothing: it was removed): counted in the
/// registry now, the rest (warnings, a hard budget's cancel, what a lower spend lets go, the
/// hosts' budgets) left to [`keep_in_step`]. A host no longer in the hub's list counts nothing:
/// what its link said after `remove` took it out (a message taken in meanwhile) does not bring
/// its spend back. Call it without holding `inner.links`.
pub(super) fn counted(inner: &Inner, host: &str, spends: RemoteSpend) {
    // Checked and counted under the lock `remove` takes the host out under.
    let links = inner.links.lock().unwrap_or_else(PoisonError::into_inner);
    let spends = if links.contains_key(host) {
        spends
    } else {
        RemoteSpend::new()
    };
    let changed = inner.runtimes.registry().set_remote_spend(host, spends);
    drop(links);
    inner
        .spend_changes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .extend(changed);
    inner.budgets.notify_one();
}

/// Acts on what the hosts' spend changed and brings the hosts' budgets in step each time
/// `poked` is notified, until the hosts are gone. Each link's requests are sent by a task of
/// its own ([`send_budgets`]): a slow host delays neither the warnings and hard budgets' cancels
/// here nor the other hosts' budgets.
pub(super) async fn keep_in_step(inner: Weak<Inner>, poked: Arc<Notify>) {
    let mut senders: HashMap<String, (Weak<Link>, Arc<Notify>)> = HashMap::new();
    loop {
        poked.notified().await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        act_on_spend(&strong).await;
        let links = links(&strong);
        drop(strong);
        // A removed (or replaced) link's task is woken to see it gone, and ends.
        senders.retain(|name, (link, wake)| {
            let kept = links
                .iter()
                .any(|(n, l)| n == name && link.upgrade().is_some_and(|w| Arc::ptr_eq(&w, l)));
            if !kept {
                wake.notify_one();
            }
            kept
        });
        for (name, link) in links {
            let (_, wake) = senders.entry(name.clone()).or_insert_with(|| {
                let wake = Arc::new(Notify::new());
                tokio::spawn(send_budgets(
                    inner.clone(),
                    name,
                    Arc::downgrade(&link),
                    wake.clone(),
                ));
                (Arc::downgrade(&link), wake)
            });
            wake.notify_one();
        }
    }
}

/// The hub's links, by host.
fn links(inner: &Inner) -> Vec<(String, Arc<Link>)> {
    inner
        .links
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(name, link)| (name.clone(), link.clone()))
        .collect()
}

/// The warnings, hard budgets' cancels and wakes what the hosts' counted spend changed calls
/// for.
async fn act_on_spend(inner: &Inner) {
    let runtimes = &inner.runtimes;
    let registry = runtimes.registry();
    let changed = std::mem::take(
        &mut *inner
            .spend_changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    for (agent, tokens, cost) in changed {
        let (more, less) = split(tokens, cost);
        if let Some((tokens, cost)) = more {
            registry.warn_budgets(agent, tokens, cost).await;
            runtimes.cancel_for_hard_budgets(agent).await;
        }
        if less {
            // Less counted (a host removed): what a spent budget held may go.
            let root = registry.ancestors(agent).last().copied().unwrap_or(agent);
            runtimes.wake_queued(&registry.tree(root)).await;
        }
    }
}

/// The budgets a host refused to hold one of its subagents to (a host of an earlier drover
/// refuses `set_upstream_budget`), by subagent: the link's connection it refused over (see
/// `Link::connection`) and those budgets. Not asked again over that connection, so a refusal
/// costs one request and one log line, not one per registry update.
type Refused = HashMap<AgentId, (u64, Vec<Budget>)>;

/// Brings the budgets `host`'s subagents are held to in step each time `wake` is notified,
/// until the link is gone from the hub's list.
async fn send_budgets(inner: Weak<Inner>, host: String, link: Weak<Link>, wake: Arc<Notify>) {
    let mut refused = Refused::new();
    loop {
        wake.notified().await;
        let (Some(inner), Some(link)) = (inner.upgrade(), link.upgrade()) else {
            return;
        };
        let listed = inner
            .links
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&host)
            .is_some_and(|l| Arc::ptr_eq(l, &link));
        if !listed {
            return;
        }
        reconcile(&inner, &host, &link, &mut refused).await;
    }
}

async fn reconcile(inner: &Inner, name: &str, link: &Link, refused: &mut Refused) {
    let Some(connection) = link.connection() else {
        return;
    };
    let registry = inner.runtimes.registry();
    // Hosts not heard from since this daemon started: what their agents spent is not counted
    // here yet, so what a budget's tree has left may be less than it seems.
    let unheard: HashSet<String> = links(inner)
        .into_iter()
        .filter(|(_, link)| !link.heard())
        .map(|(name, _)| name)
        .collect();
    for root in link.remote_roots() {
        let mut budgets = allowances_by_budgeted(inner, root.parent, &root.subtree);
        if !unheard.is_empty() && budgets.len() == root.budgets.len() {
            // No budget whose tree has subagents on an unheard host is raised on this one
            // (that would leave out what they spent): it only tightens until they report.
            for ((at, budget), held) in budgets.iter_mut().zip(&root.budgets) {
                let tree: HashSet<AgentId> = registry.tree(*at).into_iter().collect();
                let waiting = inner
                    .parents
                    .hosts_of(&tree)
                    .iter()
                    .any(|host| unheard.contains(host));
                if waiting {
                    *budget = no_looser(budget, held);
                }
            }
        }
        let budgets: Vec<Budget> = budgets.into_iter().map(|(_, b)| b).collect();
        if budgets == root.budgets {
            continue;
        }
        if refused
            .get(&root.id)
            .is_some_and(|(over, what)| *over == connection && *what == budgets)
        {
            // Refused over this connection already: asked again once the link is made
            // again, or for other budgets.
            continue;
        }
        let asked = json!({"type": "set_upstream_budget", "agentId": root.id.to_string(),
            "budgets": budgets});
        match link.request(asked).await {
            Ok(answer) if answer["type"] == "ok" => {
                refused.remove(&root.id);
                tracing::debug!(host = %name, agent = %root.id, ?budgets, "the host holds the subagent to its parent's budgets");
            }
            Ok(answer) => {
                tracing::warn!(host = %name, agent = %root.id, ?answer, "the host refused to hold the subagent to its parent's budgets (asked again when the link is made again or the budgets change)");
                refused.insert(root.id, (connection, budgets));
            }
            Err(e) => {
                // The link is down: everything is sent again once it is made.
                tracing::info!(host = %name, agent = %root.id, error = %e, "the host's budgets for the subagent are set again later");
                return;
            }
        }
    }
}

/// A change of an agent's counted remote spend (`tokens`, `cost`: negative for less): what it
/// added (tokens, cost; each at least 0), if it added any, for the 80 % warning and a hard
/// budget's cancel; and whether it took any away (what a spent budget held may go). Either part
/// may move alone: less tokens (a host removed) with more cost (another reported) adds no
/// tokens.
fn split(tokens: i128, cost: f64) -> (Option<(u64, f64)>, bool) {
    let more = (tokens > 0 || cost > 0.0).then(|| {
        (
            u64::try_from(tokens.max(0)).unwrap_or(u64::MAX),
            cost.max(0.0),
        )
    });
    (more, tokens < 0 || cost < 0.0)
}

/// What a subagent on a host of this daemon's `parent` may spend with its subtree there
/// (`subtree`, what it spent) under each budget of `parent`'s lineage here, nearest first.
pub(super) fn allowances(inner: &Inner, parent: AgentId, subtree: &Spend) -> Vec<Budget> {
    allowances_by_budgeted(inner, parent, subtree)
        .into_iter()
        .map(|(_, budget)| budget)
        .collect()
}

/// [`allowances`], each with the agent here whose budget it comes from. Only what is provably
/// left is given: what a subagent of the budgeted tree on a host out of reach may still spend
/// (what its host holds it to, beyond what it spent when last heard from) counts as spent.
/// That reserve holds back new turns but cancels none: nobody spent it. An allowance it
/// lowered is given as a soft one (the host's turn gate holds new turns at it, its hard
/// budgets' cancel ignores it), unless what was really spent reaches the hard budget as well.
fn allowances_by_budgeted(
    inner: &Inner,
    parent: AgentId,
    subtree: &Spend,
) -> Vec<(AgentId, Budget)> {
    let registry = inner.runtimes.registry();
    let away = away(inner);
    // The same budgets the turn gate checks here (`spent_budgets`): those this daemon's own
    // hub holds its agent to as well, so a chain of hubs passes the top one's budget on.
    registry
        .lineage_budgets(parent)
        .into_iter()
        .map(|b| {
            let spent = upstream_allowance(&b.budget, &b.tree.spend, subtree);
            let mut tree = b.tree.spend.clone();
            if !away.is_empty() {
                let members: HashSet<AgentId> = registry.tree(b.agent).into_iter().collect();
                for root in away.iter().filter(|r| members.contains(&r.parent)) {
                    reserve(&mut tree, &b.budget, &root.budgets, &root.subtree);
                }
            }
            let mut allowance = upstream_allowance(&b.budget, &tree, subtree);
            if allowance.hard && allowance != spent && !budget_reached(&spent, subtree) {
                allowance.hard = false;
            }
            (b.agent, allowance)
        })
        .collect()
}

/// The subagents of this daemon's agents on hosts heard from and out of reach now, as their
/// hosts last said.
fn away(inner: &Inner) -> Vec<RemoteRoot> {
    links(inner)
        .into_iter()
        .filter(|(_, link)| link.heard() && link.connection().is_none())
        .flat_map(|(_, link)| link.remote_roots())
        .collect()
}

/// Counts in `tree` (what a budgeted tree spent) what a subagent of it out of reach may still
/// spend: what the tightest of the budgets its host holds it to (`holds`, as the host last
/// said) leaves beyond what its subtree there spent (`subtree`); under a limit of a kind it is
/// held to none of, everything.
fn reserve(tree: &mut Spend, budget: &Budget, holds: &[Budget], subtree: &Spend) {
    if budget.tokens.is_some() {
        let more = holds
            .iter()
            .filter_map(|h| h.tokens)
            .min()
            .map_or(u64::MAX, |h| h.saturating_sub(subtree.tokens.unwrap_or(0)));
        tree.tokens = Some(tree.tokens.unwrap_or(0).saturating_add(more));
    }
    if budget.cost.is_some() {
        let more = holds
            .iter()
            .filter_map(|h| h.cost)
            .reduce(f64::min)
            .map_or(f64::INFINITY, |h| {
                (h - subtree.cost.unwrap_or(0.0)).max(0.0)
            });
        tree.cost = Some(tree.cost.unwrap_or(0.0) + more);
    }
}

/// `new`, with no limit looser than the one `held` has of the same kind (tokens, cost).
fn no_looser(new: &Budget, held: &Budget) -> Budget {
    Budget {
        tokens: match (new.tokens, held.tokens) {
            (Some(new), Some(held)) => Some(new.min(held)),
            (new, _) => new,
        },
        cost: match (new.cost, held.cost) {
            (Some(new), Some(held)) => Some(new.min(held)),
            (new, _) => new,
        },
        hard: new.hard,
    }
}

#[cfg(test)]
mod tests {
    use drover_core::Budget;

    use drover_core::Spend;

    use super::{no_looser, reserve, split};

    #[test]
    fn a_subagent_out_of_reach_keeps_what_its_host_may_still_spend() {
        let spend = |tokens: u64| Spend {
            tokens: Some(tokens),
            ..Spend::default()
        };
        let budget = Budget {
            tokens: Some(3000),
            cost: Some(1.0),
            hard: false,
        };
        // Held to 3000 and 4000 tokens (two budgets of its lineage) with 1000 spent: 2000 more
        // may be spent out of reach (the tighter holds); the tree counts its 1000 already.
        let holds = [
            Budget {
                tokens: Some(4000),
                cost: None,
                hard: false,
            },
            Budget {
                tokens: Some(3000),
                cost: Some(0.5),
                hard: false,
            },
        ];
        let mut tree = spend(1000);
        reserve(&mut tree, &budget, &holds, &spend(1000));
        assert_eq!(tree.tokens, Some(3000));
        assert_eq!(tree.cost, Some(0.5));
        // Held to no limit of a kind: nothing of it is provably left.
        let mut tree = spend(1000);
        reserve(&mut tree, &budget, &[], &spend(1000));
        assert_eq!(tree.tokens, Some(u64::MAX));
        assert_eq!(tree.cost, Some(f64::INFINITY));
        assert_eq!(
            drover_core::upstream_allowance(&budget, &tree, &spend(0)),
            Budget {
                tokens: Some(0),
                cost: Some(0.0),
                hard: false
            }
        );
    }

    #[test]
    fn an_allowance_waiting_for_an_unheard_host_only_tightens() {
        let budget = |tokens, cost| Budget {
            tokens,
            cost,
            hard: true,
        };
        // The hub, missing another host's spend, would raise 2500 to 3000: it stays 2500.
        assert_eq!(
            no_looser(&budget(Some(3000), None), &budget(Some(2500), None)),
            budget(Some(2500), None)
        );
        // Tighter goes through; each limit on its own; a limit the host does not hold yet too.
        assert_eq!(
            no_looser(
                &budget(Some(2000), Some(0.5)),
                &budget(Some(2500), Some(0.25))
            ),
            budget(Some(2000), Some(0.25))
        );
        assert_eq!(
            no_looser(&budget(None, Some(0.5)), &budget(Some(2500), None)),
            budget(None, Some(0.5))
        );
    }

    #[test]
    fn fewer_tokens_beside_more_cost_add_no_tokens() {
        // A host removed (its tokens leave) while another reported more cost: the warning
        // reads 0 tokens added (u64::MAX made a cleared 80 % warning come back), and what the
        // spent budget held may go.
        assert_eq!(split(-500, 0.25), (Some((0, 0.25)), true));
        assert_eq!(split(500, -0.25), (Some((500, 0.0)), true));
        assert_eq!(split(1000, 0.5), (Some((1000, 0.5)), false));
        assert_eq!(split(-1000, -0.5), (None, true));
        assert_eq!(split(0, 0.0), (None, false));
    }
}
