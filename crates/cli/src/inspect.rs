//! `drover ls` and `drover inspect`: the list of agents (flat or as trees) and everything
//! known about one agent.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;

use drover_protocol::Answer;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, AgentStatus, AttentionReason, DaemonMessage, HostInfo, HostState, PermissionPolicy,
    RuntimeState,
};
use serde_json::json;

use crate::agents::budget_line;
use crate::client::{Connection, SessionState};
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::CliError;
use crate::output::{self, Paint, Style, Table};
use crate::resolve::{Prefer, ShortIds, resolve};

/// A quick filter of `drover ls`, as the web UI's (needs me, running, errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Only {
    NeedsMe,
    Running,
    Errors,
}

impl Only {
    fn keeps(self, agent: &AgentInfo) -> bool {
        match self {
            Only::NeedsMe => {
                agent.requires_attention
                    && agent.attention_reason != Some(AttentionReason::Finished)
            }
            Only::Running => matches!(
                agent.status,
                AgentStatus::Running | AgentStatus::Initializing
            ),
            Only::Errors => {
                agent.status == AgentStatus::Error
                    || agent.attention_reason == Some(AttentionReason::Error)
                    || agent.start_failure.is_some()
            }
        }
    }

    fn none_left(self) -> &'static str {
        match self {
            Only::NeedsMe => "no agent needs you",
            Only::Running => "no agent is running",
            Only::Errors => "no agent has failed",
        }
    }
}

/// Keeps the agents `only` keeps (after their handles were made, so that they read as in a
/// plain `drover ls`); returns how many there were.
fn narrow(agents: &mut Vec<AgentInfo>, only: Option<Only>) -> usize {
    let before = agents.len();
    if let Some(only) = only {
        agents.retain(|a| only.keeps(a));
    }
    before
}

fn say_none_left(only: Option<Only>, before: usize) {
    match only {
        Some(only) if before > 0 => {
            eprintln!("drover: {} ({before} agents in all)", only.none_left());
        }
        _ => eprintln!("drover: no agents; start one with `drover run \"…\"`"),
    }
}

pub async fn ls(
    ctx: &Ctx,
    all: bool,
    tree: bool,
    json: bool,
    host: Option<&str>,
    only: Option<Only>,
) -> anyhow::Result<()> {
    // Without --all the archived agents are neither fetched nor counted for short ids: an id
    // prefix that is also an archived agent's names the live one (see `resolve`).
    // The tree's spend counts its archived agents too: --tree fetches them to sum it.
    let (connection, state) = Connection::open(&ctx.endpoint, all || tree).await?;
    let SessionState {
        mut agents, hosts, ..
    } = state;
    connection.close().await;
    let tree_spend = if tree && !json {
        tree_spends(&agents)
    } else {
        HashMap::new()
    };
    agents.retain(|a| all || a.archived_at.is_none());
    if let Some(host) = host {
        only_on(&mut agents, &hosts, host)?;
    }
    let short = ShortIds::new(&agents);
    let before = narrow(&mut agents, only);
    agents.sort_by(|a, b| a.id.cmp(&b.id));
    if json {
        return print_json(&agents);
    }
    if agents.is_empty() {
        say_none_left(only, before);
        return Ok(());
    }
    let rows: Vec<(String, &AgentInfo)> = if tree {
        tree_order(&agents)
            .into_iter()
            .map(|(prefix, a)| (format!("{prefix}{}", short.get(&a.id)), a))
            .collect()
    } else {
        agents
            .iter()
            .map(|a| (short.get(&a.id).to_string(), a))
            .collect()
    };
    let now = jiff::Timestamp::now();
    let mut headers = vec!["ID", "TITLE", "PROVIDER", "STATUS", "RUNTIME", "ATTENTION"];
    if tree {
        headers.extend(["SPEND", "TREE SPEND / BUDGET"]);
    }
    headers.push("AGE");
    // The HOST column only in a fleet of several machines.
    if !hosts.is_empty() {
        headers.push("HOST");
    }
    headers.push("CWD");
    let mut table = Table::new(headers);
    let has_children: std::collections::HashSet<&str> = agents
        .iter()
        .filter_map(|a| a.parent_agent_id.as_deref())
        .collect();
    for (id, agent) in rows {
        let status = if agent.archived_at.is_some() {
            format!("{} (archived)", agent.status)
        } else {
            agent.status.to_string()
        };
        let paint = if agent.archived_at.is_some() {
            Paint::Dim
        } else {
            output::status_paint(agent.status)
        };
        let mut cells = vec![
            (id, Paint::Plain),
            (
                output::truncate(agent.title.as_deref().unwrap_or("-"), 40),
                Paint::Bold,
            ),
            (agent.provider.clone(), Paint::Plain),
            (status, paint),
            (
                agent.runtime.state.to_string(),
                if agent.runtime.state == RuntimeState::Cold {
                    Paint::Dim
                } else {
                    Paint::Plain
                },
            ),
            attention_cell(agent),
        ];
        if tree {
            let spent = tree_spend.get(agent.id.as_str());
            let parent = has_children.contains(agent.id.as_str());
            cells.extend(spend_cells(agent, spent, parent));
        }
        cells.push((output::age(&agent.created_at, now), Paint::Plain));
        if !hosts.is_empty() {
            cells.push(host_cell(agent, &hosts, now));
        }
        cells.push((output::tilde(&agent.cwd), Paint::Dim));
        table.row(cells);
    }
    let mut out = std::io::stdout().lock();
    table.write(&mut out, ctx.style)?;
    Ok(())
}

/// The ATTENTION cell, said as people say it: `sign in` is what to do, `limited until` when
/// the prompt goes again.
/// What to do about an attention that has no row of its own to say it: a turn a daemon stop
/// cut off waits for a message.
fn next_step(agent: &AgentInfo, short: &ShortIds) -> String {
    match agent.attention_reason {
        Some(AttentionReason::Interrupted) => format!(
            ": a daemon stop cut its turn off; a message continues it (drover send {} \"continue\")",
            short.get(&agent.id)
        ),
        _ => String::new(),
    }
}

fn attention_cell(agent: &AgentInfo) -> (String, Paint) {
    let attention = match (agent.attention_reason, &agent.limited) {
        (None, _) => "-".to_string(),
        (Some(AttentionReason::AuthRequired), _) => "sign in".to_string(),
        (Some(AttentionReason::Limited), Some(limited)) => {
            format!("limited until {}", output::clock(&limited.retry_at))
        }
        (Some(reason), _) => reason.to_string(),
    };
    let paint = match attention.as_str() {
        "permission" | "error" | "sign in" => Paint::Yellow,
        _ => Paint::Plain,
    };
    (attention, paint)
}

/// Keeps the agents on `host` (`local`: this machine's), a host the daemon links to.
fn only_on(agents: &mut Vec<AgentInfo>, hosts: &[HostInfo], host: &str) -> Result<(), CliError> {
    if host != "local" && !hosts.iter().any(|h| h.name == host) {
        return Err(CliError::BadArgument(format!(
            "--host {host}: no such host (`drover host ls` lists them)"
        )));
    }
    agents.retain(|a| a.host.as_deref().unwrap_or("local") == host);
    Ok(())
}

/// The HOST cell: the agent's host, and whether it can be reached now.
fn host_cell(agent: &AgentInfo, hosts: &[HostInfo], now: jiff::Timestamp) -> (String, Paint) {
    let Some(host) = agent
        .host
        .as_deref()
        .and_then(|name| hosts.iter().find(|h| h.name == name))
    else {
        return ("local".to_string(), Paint::Dim);
    };
    if host.state == HostState::Reachable {
        return (host.name.clone(), Paint::Plain);
    }
    let since = output::age(&host.since, now);
    (
        format!("{} ({} {since})", host.name, host.state),
        Paint::Yellow,
    )
}

/// What each agent and every agent below it spent (archived ones included), by agent id.
fn tree_spends(agents: &[AgentInfo]) -> HashMap<String, drover_protocol::SpendInfo> {
    fn add(to: &mut drover_protocol::SpendInfo, spend: &drover_protocol::SpendInfo) {
        if let Some(tokens) = spend.tokens {
            to.tokens = Some(to.tokens.unwrap_or(0).saturating_add(tokens));
        }
        if let Some(cost) = spend.cost {
            to.cost = Some(to.cost.unwrap_or(0.0) + cost);
            if to.currency.is_none() {
                to.currency.clone_from(&spend.currency);
            }
        }
    }
    let parents: HashMap<&str, Option<&str>> = agents
        .iter()
        .map(|a| (a.id.as_str(), a.parent_agent_id.as_deref()))
        .collect();
    let mut sums: HashMap<String, drover_protocol::SpendInfo> = HashMap::new();
    for agent in agents {
        // Each agent adds to itself and to every ancestor (bounded: a parent cycle cannot
        // happen in the registry, the bound keeps a bad answer from looping).
        let mut at = Some(agent.id.as_str());
        for _ in 0..64 {
            let Some((id, parent)) = at.and_then(|id| parents.get(id).map(|p| (id, *p))) else {
                break;
            };
            add(sums.entry(id.to_string()).or_default(), &agent.spend);
            at = parent;
        }
    }
    sums
}

/// `ls --tree`'s SPEND (the agent's own) and TREE SPEND / BUDGET (its tree's, against its
/// budget; shown for an agent with a budget or subagents).
fn spend_cells(
    agent: &AgentInfo,
    tree: Option<&drover_protocol::SpendInfo>,
    parent: bool,
) -> [(String, Paint); 2] {
    let tree = match (&agent.budget, tree) {
        (Some(budget), Some(spent)) => budget_cell(budget, spent),
        (None, Some(spent)) if parent => (short_spend(spent), Paint::Plain),
        _ => ("-".to_string(), Paint::Dim),
    };
    [(short_spend(&agent.spend), Paint::Plain), tree]
}

/// `1000 tok, 0.0010 USD`; `unknown` when the agent reported nothing (never zero).
fn short_spend(spend: &drover_protocol::SpendInfo) -> String {
    let mut parts = Vec::new();
    if let Some(tokens) = spend.tokens {
        parts.push(format!("{tokens} tok"));
    }
    if let Some(cost) = spend.cost {
        parts.push(format!(
            "{cost:.4} {}",
            spend.currency.as_deref().unwrap_or("USD")
        ));
    }
    if parts.is_empty() {
        "unknown".to_string()
    } else {
        parts.join(", ")
    }
}

/// `2000/1500 tok (133 %)`: the tree's spend against each limit, the larger share, yellow
/// past 80 %, red at 100 %.
fn budget_cell(
    budget: &drover_protocol::Budget,
    spent: &drover_protocol::SpendInfo,
) -> (String, Paint) {
    let mut parts = Vec::new();
    let mut share: f64 = 0.0;
    if let Some(limit) = budget.tokens {
        let tokens = spent.tokens.unwrap_or(0);
        parts.push(format!("{tokens}/{limit} tok"));
        if limit > 0 {
            share = share.max(tokens as f64 / limit as f64);
        } else {
            share = share.max(1.0);
        }
    }
    if let Some(limit) = budget.cost {
        let cost = spent.cost.unwrap_or(0.0);
        let currency = spent.currency.as_deref().unwrap_or("USD");
        parts.push(format!("{cost:.4}/{limit:.4} {currency}"));
        share = share.max(if limit > 0.0 { cost / limit } else { 1.0 });
    }
    let hard = if budget.hard { ", hard" } else { "" };
    let text = format!("{} ({:.0} %{hard})", parts.join(", "), share * 100.0);
    let paint = if share >= 1.0 {
        Paint::Red
    } else if share >= 0.8 {
        Paint::Yellow
    } else {
        Paint::Plain
    };
    (text, paint)
}

/// Agents in tree order, each with its branch drawing: roots (no parent shown) first, their
/// subagents under them.
fn tree_order(agents: &[AgentInfo]) -> Vec<(String, &AgentInfo)> {
    fn walk<'a>(
        agent: &'a AgentInfo,
        lead: &str,
        branch: &str,
        children: &HashMap<&str, Vec<&'a AgentInfo>>,
        out: &mut Vec<(String, &'a AgentInfo)>,
        depth: usize,
    ) {
        out.push((format!("{lead}{branch}"), agent));
        // A parent cycle cannot happen in the registry; the depth bound keeps a bad answer
        // from looping.
        if depth > 64 {
            return;
        }
        let kids = children.get(agent.id.as_str()).cloned().unwrap_or_default();
        let lead = match branch {
            "├─ " => format!("{lead}│  "),
            "└─ " => format!("{lead}   "),
            _ => lead.to_string(),
        };
        for (i, kid) in kids.iter().enumerate() {
            let branch = if i + 1 == kids.len() {
                "└─ "
            } else {
                "├─ "
            };
            walk(kid, &lead, branch, children, out, depth + 1);
        }
    }
    let shown: HashMap<&str, &AgentInfo> = agents.iter().map(|a| (a.id.as_str(), a)).collect();
    let mut children: HashMap<&str, Vec<&AgentInfo>> = HashMap::new();
    let mut roots = Vec::new();
    for agent in agents {
        match agent.parent_agent_id.as_deref() {
            Some(parent) if shown.contains_key(parent) => {
                children.entry(parent).or_default().push(agent);
            }
            _ => roots.push(agent),
        }
    }
    let mut out = Vec::with_capacity(agents.len());
    for root in roots {
        walk(root, "", "", &children, &mut out, 0);
    }
    out
}

pub async fn inspect(ctx: &Ctx, id: &str, json: bool) -> anyhow::Result<()> {
    let (mut connection, state) = ctx.connect().await?;
    let SessionState {
        agents, workspaces, ..
    } = state;
    let listed = resolve(&agents, id, Prefer::Live)?;
    // The agent again, with what its process tree holds now.
    let answer = connection
        .request(rq::GetAgent {
            agent_id: listed.id.clone(),
        })
        .await?;
    // Its work beside its turn: its jobs and the schedules that reach it.
    let jobs = connection
        .request(rq::ListJobs {
            agent_id: Some(listed.id.clone()),
        })
        .await?;
    let schedules = connection
        .request(rq::ListSchedules {
            agent_id: Some(listed.id.clone()),
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Agent(Answer {
        body: answers::Agent {
            agent: measured, ..
        },
        ..
    }) = answer
    else {
        return Err(unexpected(&answer));
    };
    let answers::Jobs { jobs, .. } = jobs.into_answer().map_err(|m| unexpected(&m))?;
    let answers::Schedules { schedules, .. } =
        schedules.into_answer().map_err(|m| unexpected(&m))?;
    let agent = &measured;
    let workspace = match workspaces.iter().find(|w| w.id == agent.workspace_id) {
        Some(w) => format!("{} ({}, {})", w.name, w.kind, w.path),
        None => agent.workspace_id.clone(),
    };
    let short = ShortIds::new(&agents);
    let children: Vec<&AgentInfo> = agents
        .iter()
        .filter(|a| a.parent_agent_id.as_deref() == Some(agent.id.as_str()))
        .collect();
    if json {
        let mut value = serde_json::to_value(agent)?;
        value["children"] = json!(children.iter().map(|c| &c.id).collect::<Vec<_>>());
        value["jobs"] = serde_json::to_value(&jobs)?;
        value["schedules"] = serde_json::to_value(&schedules)?;
        return print_json(&value);
    }
    let style = ctx.style;
    let mut rows = inspect_rows(agent, &workspace, &short, &children, style);
    let at = rows
        .iter()
        .position(|(k, _)| *k == "children")
        .map_or(rows.len(), |i| i + 1);
    rows.insert(at, ("jobs", jobs_summary(&jobs)));
    rows.insert(at + 1, ("schedules", schedules_summary(&schedules)));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for (key, value) in rows {
        let key = format!("{key:width$}");
        writeln!(out, "{}  {value}", style.paint(Paint::Bold, &key))?;
    }
    Ok(())
}

/// `live, pid 4242`, `cold`, `queued (waits for a slot under max_live)`.
fn runtime_line(runtime: &drover_protocol::RuntimeInfo) -> String {
    match (runtime.state.as_str(), runtime.pid) {
        ("queued", _) => "queued (waits for a slot under max_live)".to_string(),
        (state, Some(pid)) => format!("{state}, pid {pid}"),
        (state, None) => state.to_string(),
    }
}

/// When the idle runtime hibernates, or what keeps it live: `kept live: 2 background
/// processes`.
fn hibernates_line(runtime: &drover_protocol::RuntimeInfo, now: jiff::Timestamp) -> String {
    match runtime.background_processes {
        0 => runtime
            .hibernate_at
            .as_deref()
            .map_or_else(|| "-".to_string(), |at| output::when_ahead(at, now)),
        1 => "kept live: 1 background process".to_string(),
        n => format!("kept live: {n} background processes"),
    }
}

/// `3 processes, 83.9 MB`: what the runtime's process tree holds (`-` without one).
fn memory_line(runtime: &drover_protocol::RuntimeInfo) -> String {
    match (runtime.processes, runtime.rss_bytes) {
        (Some(n), Some(rss)) => format!(
            "{n} process{}, {}",
            if n == 1 { "" } else { "es" },
            output::megabytes(rss)
        ),
        _ => "-".to_string(),
    }
}

fn jobs_summary(jobs: &[drover_protocol::JobInfo]) -> String {
    let mut parts: Vec<String> = jobs
        .iter()
        .filter(|j| j.status == "running")
        .map(|j| format!("{} running `{}`", j.id, output::truncate(&j.command, 40)))
        .collect();
    let ended = jobs.len() - parts.len();
    if ended > 0 {
        parts.push(format!("{ended} ended"));
    }
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join(", ")
    }
}

/// The schedules that reach an agent in one line: id, cadence, and the next run or the state.
fn schedules_summary(schedules: &[drover_protocol::ScheduleInfo]) -> String {
    let now = jiff::Timestamp::now();
    let parts: Vec<String> = schedules
        .iter()
        .map(|s| match s.state.as_str() {
            "active" => format!(
                "{} {}, next {}",
                s.id,
                s.description,
                crate::schedules::next_run(s.next_run_at.as_deref(), now)
            ),
            state => format!("{} {} ({state})", s.id, s.description),
        })
        .collect();
    if parts.is_empty() {
        "-".to_string()
    } else {
        parts.join("; ")
    }
}

/// `12000 tokens, 0.0120 USD`, what is unknown said so (an agent that reports nothing).
fn spend_line(spend: &drover_protocol::SpendInfo) -> String {
    let tokens = spend
        .tokens
        .map_or_else(|| "tokens unknown".to_string(), |t| format!("{t} tokens"));
    let cost = spend.cost.map_or_else(
        || "cost unknown".to_string(),
        |c| format!("{c:.4} {}", spend.currency.as_deref().unwrap_or("USD")),
    );
    format!("{tokens}, {cost}")
}

/// The agent and its subagents: the sum, over how many, and who reported nothing.
fn tree_spend_line(agent: &AgentInfo, short: &ShortIds) -> String {
    let Some(tree) = &agent.tree_spend else {
        return "-".to_string();
    };
    let sum = spend_line(&drover_protocol::SpendInfo {
        tokens: tree.tokens,
        cost: tree.cost,
        currency: tree.currency.clone(),
    });
    let mut line = format!("{sum} over {} agent(s)", tree.agents);
    if !tree.unknown.is_empty() {
        let unknown: Vec<&str> = tree.unknown.iter().map(|id| short.get(id)).collect();
        let _ = write!(line, "; nothing reported by {}", unknown.join(", "));
    }
    line
}

/// An agent waiting for its usage limit: since when, the reset, when its prompt goes again.
fn limited_line(agent: &AgentInfo, now: jiff::Timestamp) -> String {
    let Some(limited) = &agent.limited else {
        return "-".to_string();
    };
    let reset = limited.reset_at.as_deref().map_or_else(
        || "the provider named no reset time".to_string(),
        |r| format!("resets at {}", output::when_ahead(r, now)),
    );
    format!(
        "usage limit since {}; {reset}; the prompt goes again at {} (`drover retry` sends it now)",
        output::when(&limited.at, now),
        output::when_ahead(&limited.retry_at, now),
    )
}
/// The key/value lines of `drover inspect`; `archived` only for an archived agent.
fn inspect_rows(
    agent: &AgentInfo,
    workspace: &str,
    short: &ShortIds,
    children: &[&AgentInfo],
    style: Style,
) -> Vec<(&'static str, String)> {
    let now = jiff::Timestamp::now();
    let dash = || "-".to_string();
    let mut rows: Vec<(&str, String)> = vec![
        ("id", agent.id.clone()),
        ("title", agent.title.clone().unwrap_or_else(dash)),
        ("provider", agent.provider.clone()),
        (
            "status",
            style.paint(output::status_paint(agent.status), agent.status.as_str()),
        ),
        (
            "attention",
            match (&agent.attention_reason, &agent.attention_timestamp) {
                (Some(reason), Some(at)) => format!(
                    "{reason} since {}{}",
                    output::when(at, now),
                    next_step(agent, short)
                ),
                (Some(reason), None) => format!("{reason}{}", next_step(agent, short)),
                _ => dash(),
            },
        ),
        ("error", agent.error.clone().unwrap_or_else(dash)),
        ("limited", limited_line(agent, now)),
        ("spend", spend_line(&agent.spend)),
        ("tree spend", tree_spend_line(agent, short)),
        (
            "budget",
            agent.budget.as_ref().map_or_else(dash, |b| {
                format!("{} (for it and its subagents)", budget_line(b))
            }),
        ),
        ("cwd", agent.cwd.clone()),
        ("workspace", workspace.to_string()),
        (
            "parent",
            agent
                .parent_agent_id
                .as_deref()
                .map_or_else(dash, |p| short.get(p).to_string()),
        ),
        ("children", children_line(children, short)),
        ("own subagents", own_subagents_line(agent)),
        ("model", agent.model.clone().unwrap_or_else(dash)),
        ("mode", agent.current_mode_id.clone().unwrap_or_else(dash)),
        ("effort", agent.effort.clone().unwrap_or_else(dash)),
        ("settings", settings_line(agent)),
        (
            "permissions",
            match agent.permission_policy {
                PermissionPolicy::Ask => "ask".to_string(),
                PermissionPolicy::Allow => "allow all".to_string(),
            },
        ),
        (
            "auto-archive",
            if agent.auto_archive { "yes" } else { "no" }.to_string(),
        ),
        ("labels", labels_line(agent)),
        ("session", agent.session_id.clone().unwrap_or_else(dash)),
        ("agent", advertised_line(&agent.runtime)),
        ("start", start_line(agent, now)),
        ("queued", queued_line(agent)),
        ("runtime", runtime_line(&agent.runtime)),
        ("memory", memory_line(&agent.runtime)),
        ("hibernates", hibernates_line(&agent.runtime, now)),
        ("created", output::when(&agent.created_at, now)),
        ("last active", output::when(&agent.last_activity_at, now)),
        (
            "archived",
            agent
                .archived_at
                .as_deref()
                .map_or_else(dash, |at| output::when(at, now)),
        ),
    ];
    // Rows that only say something in some states.
    let hidden = [
        ("limited", agent.limited.is_none()),
        ("budget", agent.budget.is_none()),
        ("archived", agent.archived_at.is_none()),
        ("start", agent.start_failure.is_none()),
        ("own subagents", agent.own_subagents.is_empty()),
    ];
    rows.retain(|(k, _)| !hidden.iter().any(|(name, hide)| *hide && name == k));
    rows
}

fn children_line(children: &[&AgentInfo], short: &ShortIds) -> String {
    if children.is_empty() {
        return "-".to_string();
    }
    children
        .iter()
        .map(|c| short.get(&c.id))
        .collect::<Vec<_>>()
        .join(", ")
}

fn labels_line(agent: &AgentInfo) -> String {
    if agent.labels.is_empty() {
        return "-".to_string();
    }
    agent
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The subagents the agent's process runs itself: `Look around (running), Reviewer (idle)`.
fn own_subagents_line(agent: &AgentInfo) -> String {
    agent
        .own_subagents
        .iter()
        .map(|s| format!("{} ({})", s.title, s.state))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the live session offers to set (`drover set`): `mode=default (default, plan),
/// reasoning_effort=high (low, medium, high)`.
fn settings_line(agent: &AgentInfo) -> String {
    let Some(options) = agent.config_options.as_ref().filter(|o| !o.is_empty()) else {
        return if agent.runtime.state == "live" {
            "-".to_string()
        } else {
            "- (shown while the agent runs)".to_string()
        };
    };
    options
        .iter()
        .map(|o| {
            let values: Vec<&str> = o.values.iter().map(|v| v.value.as_str()).collect();
            if values.is_empty() {
                format!("{}={}", o.id, o.current_value)
            } else {
                format!("{}={} ({})", o.id, o.current_value, values.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the agent's process said of itself at its last start: `codex-acp 0.16.0, ACP 1:
/// load, resume, close, list, image, embedded-context, mcp-http`.
fn advertised_line(runtime: &drover_protocol::RuntimeInfo) -> String {
    let Some(agent) = &runtime.agent else {
        return "-".to_string();
    };
    let name = match (&agent.name, &agent.version) {
        (Some(name), Some(version)) => format!("{name} {version}, "),
        (Some(name), None) => format!("{name}, "),
        _ => String::new(),
    };
    let capabilities = if agent.capabilities.is_empty() {
        "prompts only".to_string()
    } else {
        agent.capabilities.join(", ")
    };
    format!("{name}ACP {}: {capabilities}", agent.protocol_version)
}

/// `failed 2m ago; needs a sign-in: openai-api-key (env_var: OPENAI_API_KEY), chatgpt (agent)`.
fn start_line(agent: &AgentInfo, now: jiff::Timestamp) -> String {
    let Some(failure) = &agent.start_failure else {
        return "-".to_string();
    };
    let mut line = format!("failed {}", output::when(&failure.at, now));
    match (&failure.sign_in, &agent.runtime.retry_at) {
        (Some(methods), _) => {
            let ways: Vec<String> = methods
                .iter()
                .map(|m| {
                    let vars: Vec<&str> = m.vars.iter().map(|v| v.name.as_str()).collect();
                    if vars.is_empty() {
                        format!("{} ({})", m.id, m.kind.as_str())
                    } else {
                        format!("{} ({}: {})", m.id, m.kind.as_str(), vars.join(", "))
                    }
                })
                .collect();
            let _ = write!(
                line,
                "; needs a sign-in (`drover login {}`): {}",
                agent.provider,
                ways.join(", ")
            );
        }
        (None, Some(at)) => {
            let _ = write!(line, "; tries again {}", output::when_ahead(at, now));
        }
        (None, None) => line.push_str("; starts again on `drover retry`"),
    }
    line
}

/// `2 waiting to run: "fix the tests", "then the docs"`, or `… not delivered: …` while the
/// agent cannot start (a failed start keeps them).
fn queued_line(agent: &AgentInfo) -> String {
    match agent.queued.as_deref() {
        None | Some([]) => "-".to_string(),
        Some(messages) => {
            let texts: Vec<String> = messages
                .iter()
                .map(|m| format!("{:?}", output::truncate(&m.text, 60)))
                .collect();
            let state = if agent.start_failure.is_some() {
                "not delivered"
            } else {
                "waiting to run"
            };
            format!("{} {state}: {}", messages.len(), texts.join(", "))
        }
    }
}
