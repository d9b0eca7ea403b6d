//! The client commands: each connects to the daemon, sends its requests, and prints the
//! answer (data on stdout, diagnostics on stderr).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use drover_acp::ItemKind;
use drover_protocol::{
    AgentInfo, ClientMessage, DaemonMessage, Delivery, ErrorCode, HostInfo, NewWorktree,
    PermissionPolicy, ProviderSignIn,
};
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::args::{PermitAnswer, RunArgs};
use crate::client::{Connection, Endpoint, SessionState};
use crate::error::{CliError, exit};
use crate::output::{self, Paint, Renderer, Style, Table, TurnEnd, View};
use crate::resolve::{Prefer, ShortIds, resolve};

/// Timeline items one `fetch_timeline` page may hold (the daemon's cap).
const PAGE: usize = 1000;

/// What every client command needs.
#[derive(Debug)]
pub struct Ctx {
    pub endpoint: Endpoint,
    pub style: Style,
}

impl Ctx {
    /// Connects; the state lists archived agents too, so any agent can be named.
    pub(crate) async fn connect(&self) -> anyhow::Result<(Connection, SessionState)> {
        Connection::open(&self.endpoint, true).await
    }

    /// Connects and finds the agent `query` names: (connection, agent, its short name).
    async fn agent(&self, query: &str) -> anyhow::Result<(Connection, AgentInfo, String)> {
        self.agent_preferring(query, Prefer::Live).await
    }

    async fn agent_preferring(
        &self,
        query: &str,
        prefer: Prefer,
    ) -> anyhow::Result<(Connection, AgentInfo, String)> {
        let (connection, SessionState { agents, .. }) = self.connect().await?;
        let agent = resolve(&agents, query, prefer)?.clone();
        let name = ShortIds::new(&agents).get(&agent.id).to_string();
        Ok((connection, agent, name))
    }
}

pub(crate) fn unexpected(message: &DaemonMessage) -> anyhow::Error {
    anyhow::anyhow!("unexpected answer from the daemon: {message:?}")
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Ctrl-C as a stream, set up before any wait so that no press is lost.
fn interrupts() -> anyhow::Result<Signal> {
    signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")
}

// ---- run, attach, logs ------------------------------------------------------------------------

/// A provider that cannot run here: the refusal also says how to try drover without one.
fn demo_hint(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<CliError>() {
        Ok(CliError::Daemon {
            code,
            message,
            details,
        }) if code == "provider_unavailable" => CliError::Daemon {
            code,
            message: format!(
                "{message}\n(to try drover without an agent or a key: `drover run --provider demo hello`)"
            ),
            details,
        }
        .into(),
        Ok(other) => other.into(),
        Err(e) => e,
    }
}

pub async fn run(ctx: &Ctx, args: RunArgs) -> anyhow::Result<()> {
    let provider = args
        .provider
        .clone()
        .or_else(|| {
            std::env::var("DROVER_PROVIDER")
                .ok()
                .filter(|p| !p.is_empty())
        })
        .unwrap_or_else(|| "codex".to_string());
    let cwd = match (&args.host, &args.cwd) {
        // Another host's directory: that host's daemon checks it.
        (Some(host), None) if host != "local" => {
            return Err(CliError::BadArgument(format!(
                "--host {host}: give --cwd, the directory on that host to work in"
            ))
            .into());
        }
        (Some(host), Some(dir)) if host != "local" => dir.clone(),
        (_, Some(dir)) => working_directory(dir)?,
        (_, None) => working_directory(
            &std::env::current_dir().context("cannot read the current directory")?,
        )?,
    };
    let (mut connection, SessionState { mut agents, .. }) = ctx.connect().await?;
    let parent = match &args.parent {
        Some(query) => Some(resolve(&agents, query, Prefer::Live)?.id.clone()),
        None => None,
    };
    let answer = connection
        .request(|request_id| create_message(&args, request_id, provider, &cwd, parent))
        .await
        .map_err(demo_hint)?;
    let DaemonMessage::AgentCreated { agent, .. } = answer else {
        return Err(unexpected(&answer));
    };
    if args.detach {
        if args.json {
            print_json(&agent)?;
        } else {
            outln!("{}", agent.id);
        }
        connection.close().await;
        return Ok(());
    }
    agents.push(agent.clone());
    let name = ShortIds::new(&agents).get(&agent.id).to_string();
    if args.worktree.is_some() {
        eprintln!("-- {name} works in the new worktree {}", agent.cwd);
    }
    let started = Instant::now();
    let view = View {
        timestamps: false,
        show_user: false,
        show_turns: false,
        live: true,
    };
    let mut stream = Stream::new(ctx.style, view, &name, args.json);
    let outcome = stream
        .follow(&mut connection, &agent.id, None, Until::TurnEnds)
        .await?;
    connection.close().await;
    let elapsed = started.elapsed().as_secs_f64();
    let tools = match stream.renderer.tool_count {
        0 => String::new(),
        1 => " · 1 tool call".to_string(),
        n => format!(" · {n} tool calls"),
    };
    report_run(outcome, &name, elapsed, &tools)
}

/// The `create_agent` request of `drover run`.
fn create_message(
    args: &RunArgs,
    request_id: Option<String>,
    provider: String,
    cwd: &Path,
    parent: Option<String>,
) -> ClientMessage {
    ClientMessage::CreateAgent {
        request_id,
        provider,
        cwd: Some(cwd.display().to_string()),
        workspace_id: None,
        prompt: Some(args.prompt.clone()),
        title: args.title.clone(),
        model: args.model.clone(),
        mode: args.mode.clone(),
        effort: args.effort.clone(),
        labels: BTreeMap::new(),
        parent_agent_id: parent,
        auto_archive: args.auto_archive,
        permission_policy: if args.allow_all {
            PermissionPolicy::Allow
        } else {
            PermissionPolicy::Ask
        },
        on_interrupt: args.on_interrupt.map(|p| match p {
            crate::args::OnInterruptArg::Notify => drover_protocol::OnInterrupt::Notify,
            crate::args::OnInterruptArg::Continue => drover_protocol::OnInterrupt::Continue,
        }),
        on_limit: args.on_limit.map(|p| match p {
            crate::args::OnLimitArg::Wait => drover_protocol::OnLimit::Wait,
            crate::args::OnLimitArg::Fail => drover_protocol::OnLimit::Fail,
        }),
        budget: (args.budget_tokens.is_some() || args.budget_cost.is_some()).then_some(
            drover_protocol::Budget {
                tokens: args.budget_tokens,
                cost: args.budget_cost,
                hard: args.budget_hard,
            },
        ),
        worktree: args.worktree.clone().map(|name| NewWorktree {
            name: Some(name),
            branch: None,
            base: args.base.clone(),
        }),
        host: args.host.clone(),
    }
}

/// How the turn `drover run` followed ended: a line on stderr, and the exit it means.
fn report_run(outcome: Outcome, name: &str, elapsed: f64, tools: &str) -> anyhow::Result<()> {
    match outcome {
        Outcome::Turn(end) => {
            eprintln!(
                "-- turn {} · {elapsed:.1}s{tools} · agent {name}",
                end.describe()
            );
            if end.succeeded() {
                Ok(())
            } else {
                Err(CliError::Reported {
                    code: exit::ERROR,
                    message: format!("turn {}", end.describe()),
                }
                .into())
            }
        }
        Outcome::Failed(message) => Err(anyhow::anyhow!("agent {name}: {message}")),
        Outcome::Interrupted => {
            eprintln!("-- detached; the agent keeps running: drover attach {name}");
            Err(CliError::Reported {
                code: exit::INTERRUPTED,
                message: "interrupted".to_string(),
            }
            .into())
        }
        Outcome::Closed(reason) => Err(anyhow::anyhow!(reason)),
    }
}

/// `dir` made absolute, if it is a directory: the same refusal (a bad argument) whether it is
/// missing or a file.
pub(crate) fn working_directory(dir: &Path) -> Result<PathBuf, CliError> {
    let refuse = |why: String| {
        CliError::BadArgument(format!(
            "cannot use `{}` as the working directory: {why}",
            dir.display()
        ))
    };
    let canonical = std::fs::canonicalize(dir).map_err(|e| refuse(e.to_string()))?;
    if !canonical.is_dir() {
        return Err(refuse("it is not a directory".to_string()));
    }
    Ok(canonical)
}

pub async fn attach(ctx: &Ctx, id: &str, tail: usize, json: bool) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    // While attached, nothing is sent to notification sinks about this agent.
    connection
        .request(|request_id| ClientMessage::Watching {
            request_id,
            agent_id: Some(agent.id.clone()),
        })
        .await?;
    eprintln!(
        "-- attached to {name} ({}, {}); Ctrl-C detaches",
        agent.title.as_deref().unwrap_or("untitled"),
        agent.status
    );
    let view = View {
        timestamps: false,
        show_user: true,
        show_turns: true,
        live: true,
    };
    let mut stream = Stream::new(ctx.style, view, &name, json);
    let outcome = stream
        .follow(&mut connection, &agent.id, Some(tail), Until::Interrupted)
        .await?;
    connection.close().await;
    match outcome {
        Outcome::Interrupted => {
            eprintln!("-- detached from {name}; it keeps running");
            Ok(())
        }
        Outcome::Closed(reason) => Err(anyhow::anyhow!(reason)),
        Outcome::Turn(_) | Outcome::Failed(_) => Ok(()),
    }
}

pub async fn logs(
    ctx: &Ctx,
    id: &str,
    tail: Option<usize>,
    follow: bool,
    json: bool,
) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let view = View {
        timestamps: true,
        show_user: true,
        show_turns: true,
        live: follow,
    };
    let mut stream = Stream::new(ctx.style, view, &name, json);
    if follow {
        let outcome = stream
            .follow(&mut connection, &agent.id, tail, Until::Interrupted)
            .await?;
        connection.close().await;
        return match outcome {
            Outcome::Closed(reason) => Err(anyhow::anyhow!(reason)),
            _ => Ok(()),
        };
    }
    // The last N items that print: with --json every item does.
    let shows = |item: &Value| json || view.shows(item.get("kind").and_then(Value::as_str));
    let items = fetch_tail(&mut connection, &agent.id, tail, shows).await?;
    connection.close().await;
    if items.is_empty() {
        eprintln!("drover: {name} has no timeline yet");
    }
    for item in items {
        stream.show(&json!({"op": "item", "item": item}))?;
    }
    stream.renderer.finish()?;
    Ok(())
}

/// The last `want` timeline items for which `counts` holds (all of them if `None`), oldest
/// first, paging back.
async fn fetch_tail(
    connection: &mut Connection,
    agent: &str,
    want: Option<usize>,
    counts: impl Fn(&Value) -> bool,
) -> anyhow::Result<Vec<Value>> {
    let mut items: Vec<Value> = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let limit = want.map_or(PAGE, |w| w.saturating_sub(items.len()).min(PAGE));
        if limit == 0 {
            break;
        }
        let answer = connection
            .request(|request_id| ClientMessage::FetchTimeline {
                agent_id: agent.to_string(),
                request_id,
                before,
                after: None,
                limit: Some(limit),
            })
            .await?;
        let DaemonMessage::TimelinePage {
            items: page,
            has_older,
            ..
        } = answer
        else {
            return Err(unexpected(&answer));
        };
        before = page
            .first()
            .and_then(|i| i.get("seq"))
            .and_then(Value::as_u64);
        let more = has_older && before.is_some() && !page.is_empty();
        items.splice(0..0, page.into_iter().filter(|item| counts(item)));
        if !more {
            break;
        }
    }
    Ok(items)
}

/// When [`Stream::follow`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// The first `turn_ended`, or the agent failing before its turn started (`drover run`).
    TurnEnds,
    /// Only Ctrl-C (or the daemon going away).
    Interrupted,
}

#[derive(Debug)]
enum Outcome {
    Turn(TurnEnd),
    /// The agent failed before a turn started.
    Failed(String),
    Interrupted,
    Closed(String),
}

/// An agent's updates on stdout: as text, or one JSON line each.
struct Stream {
    renderer: Renderer<std::io::Stdout>,
    view: View,
    json: bool,
    /// The last item seen, so a re-initialization after `resync_required` repeats nothing.
    last_seq: u64,
    turn_started: bool,
    /// The agent's handle, for the hints this prints.
    name: String,
}

impl Stream {
    fn new(style: Style, view: View, name: &str, json: bool) -> Stream {
        Stream {
            renderer: Renderer::new(std::io::stdout(), style, view, name.to_string()),
            view,
            json,
            last_seq: 0,
            turn_started: false,
            name: name.to_string(),
        }
    }

    /// Shows one notification; returns how a turn ended if it was a `turn_ended` item.
    fn show(&mut self, notification: &Value) -> anyhow::Result<Option<TurnEnd>> {
        if notification.get("op").and_then(Value::as_str) == Some("item") {
            let item = &notification["item"];
            if let Some(seq) = item.get("seq").and_then(Value::as_u64) {
                if seq <= self.last_seq && self.last_seq > 0 {
                    return Ok(None);
                }
                self.last_seq = seq;
            }
            if item.get("kind").and_then(Value::as_str) == Some(ItemKind::TurnStarted.as_str()) {
                self.turn_started = true;
            }
        }
        if self.json {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{notification}")?;
            out.flush()?;
            if notification.pointer("/item/kind").and_then(Value::as_str)
                == Some(ItemKind::TurnEnded.as_str())
            {
                return Ok(Some(TurnEnd::from_data(&notification["item"]["data"])));
            }
            return Ok(None);
        }
        Ok(self.renderer.notification(notification)?)
    }

    /// Initializes the agent (its recent history, `tail` items) and shows its updates until
    /// `until`.
    async fn follow(
        &mut self,
        connection: &mut Connection,
        agent: &str,
        tail: Option<usize>,
        until: Until,
    ) -> anyhow::Result<Outcome> {
        let mut interrupts = interrupts()?;
        let outcome = self
            .follow_inner(connection, agent, tail, until, &mut interrupts)
            .await;
        self.renderer.finish()?;
        outcome
    }

    async fn follow_inner(
        &mut self,
        connection: &mut Connection,
        agent: &str,
        tail: Option<usize>,
        until: Until,
        interrupts: &mut Signal,
    ) -> anyhow::Result<Outcome> {
        let mut initialized = Some(self.initial(connection, agent, tail).await?);
        loop {
            if let Some((info, updates)) = initialized.take() {
                for update in updates {
                    if let Some(end) = self.show(&update)?
                        && until == Until::TurnEnds
                    {
                        return Ok(Outcome::Turn(end));
                    }
                }
                if let Some(outcome) = self.check_status(&info, until) {
                    return Ok(outcome);
                }
            }
            let message = tokio::select! {
                message = connection.recv() => message,
                _ = interrupts.recv() => return Ok(Outcome::Interrupted),
            };
            let message = match message {
                Ok(message) => message,
                Err(e) => return Ok(Outcome::Closed(format!("{e:#}"))),
            };
            match message {
                DaemonMessage::AgentUpdate(update) if update.agent_id == agent => {
                    if let Some(end) = self.show(&update.notification)?
                        && until == Until::TurnEnds
                    {
                        return Ok(Outcome::Turn(end));
                    }
                }
                DaemonMessage::AgentStatus { agent: info } if info.id == agent => {
                    if let Some(outcome) = self.check_status(&info, until) {
                        return Ok(outcome);
                    }
                }
                DaemonMessage::ResyncRequired { .. } => {
                    // Events were dropped: take the history again (only newer items show).
                    initialized = Some(initialize(connection, agent, Some(PAGE)).await?);
                }
                _ => {}
            }
        }
    }

    /// The agent and its last `tail` items that print (with `--json`, its last `tail` items).
    async fn initial(
        &self,
        connection: &mut Connection,
        agent: &str,
        tail: Option<usize>,
    ) -> anyhow::Result<(AgentInfo, Vec<Value>)> {
        let Some(want) = tail.filter(|_| !self.json) else {
            return initialize(connection, agent, tail).await;
        };
        let (info, mut updates) = initialize(connection, agent, Some(PAGE)).await?;
        let shown: Vec<usize> = updates
            .iter()
            .enumerate()
            .filter(|(_, u)| {
                self.view
                    .shows(u.pointer("/item/kind").and_then(Value::as_str))
            })
            .map(|(i, _)| i)
            .collect();
        if want == 0 {
            updates.clear();
        } else if shown.len() > want {
            updates.drain(..shown[shown.len() - want]);
        }
        Ok((info, updates))
    }

    /// `drover run` gives up on an agent that failed (or was archived) before its turn.
    fn check_status(&self, info: &AgentInfo, until: Until) -> Option<Outcome> {
        if until != Until::TurnEnds || self.turn_started {
            return None;
        }
        if info.status == "error" {
            let mut error = info.error.clone().unwrap_or_else(|| "failed".to_string());
            if let Some(failure) = &info.start_failure {
                let how = if failure.sign_in.is_some() {
                    format!("`drover login {}`", info.provider)
                } else {
                    format!("`drover retry {}`", self.name)
                };
                let _ = write!(
                    error,
                    "\nthe prompt is kept and runs once the agent starts ({how})"
                );
            }
            return Some(Outcome::Failed(error));
        }
        if info.archived_at.is_some() {
            return Some(Outcome::Failed("archived before its turn".to_string()));
        }
        None
    }
}

/// `initialize_agent_request`: the agent and its recent history, as notifications.
async fn initialize(
    connection: &mut Connection,
    agent: &str,
    tail: Option<usize>,
) -> anyhow::Result<(AgentInfo, Vec<Value>)> {
    let answer = connection
        .request(|request_id| ClientMessage::InitializeAgentRequest {
            agent_id: agent.to_string(),
            request_id,
            limit: tail.map(|t| t.min(PAGE)),
        })
        .await?;
    let DaemonMessage::AgentInitialized { info, updates, .. } = answer else {
        return Err(unexpected(&answer));
    };
    Ok((info, updates.into_iter().map(|u| u.notification).collect()))
}

// ---- the list and one agent -------------------------------------------------------------------

pub async fn ls(
    ctx: &Ctx,
    all: bool,
    tree: bool,
    json: bool,
    host: Option<&str>,
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
    agents.sort_by(|a, b| a.id.cmp(&b.id));
    if json {
        return print_json(&agents);
    }
    if agents.is_empty() {
        eprintln!("drover: no agents; start one with `drover run \"…\"`");
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
            agent.status.clone()
        };
        let paint = if agent.archived_at.is_some() {
            Paint::Dim
        } else {
            output::status_paint(&agent.status)
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
                agent.runtime.state.clone(),
                if agent.runtime.state == "cold" {
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
fn attention_cell(agent: &AgentInfo) -> (String, Paint) {
    let attention = match (agent.attention_reason.as_deref(), &agent.limited) {
        (None, _) => "-".to_string(),
        (Some("auth_required"), _) => "sign in".to_string(),
        (Some("limited"), Some(limited)) => {
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
    if host.state == "reachable" {
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
        #[allow(clippy::cast_precision_loss)]
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
    let (
        mut connection,
        SessionState {
            agents, workspaces, ..
        },
    ) = ctx.connect().await?;
    let listed = resolve(&agents, id, Prefer::Live)?;
    // The agent again, with what its process tree holds now.
    let answer = connection
        .request(|request_id| ClientMessage::GetAgent {
            request_id,
            agent_id: listed.id.clone(),
        })
        .await?;
    // Its work beside its turn: its jobs and the schedules that reach it.
    let jobs = connection
        .request(|request_id| ClientMessage::ListJobs {
            request_id,
            agent_id: Some(listed.id.clone()),
        })
        .await?;
    let schedules = connection
        .request(|request_id| ClientMessage::ListSchedules {
            request_id,
            agent_id: Some(listed.id.clone()),
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Agent {
        agent: measured, ..
    } = answer
    else {
        return Err(unexpected(&answer));
    };
    let DaemonMessage::Jobs { jobs, .. } = jobs else {
        return Err(unexpected(&jobs));
    };
    let DaemonMessage::Schedules { schedules, .. } = schedules else {
        return Err(unexpected(&schedules));
    };
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

/// The key/value lines of `drover inspect`; `archived` only for an archived agent.
/// An agent's jobs in one line: the running ones by id and command, then how many ended.
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
            style.paint(output::status_paint(&agent.status), &agent.status),
        ),
        (
            "attention",
            match (&agent.attention_reason, &agent.attention_timestamp) {
                (Some(reason), Some(at)) => format!("{reason} since {}", output::when(at, now)),
                (Some(reason), None) => reason.clone(),
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

/// `2 not delivered: "fix the tests", "then the docs"`.
fn queued_line(agent: &AgentInfo) -> String {
    match agent.queued.as_deref() {
        None | Some([]) => "-".to_string(),
        Some(messages) => {
            let texts: Vec<String> = messages
                .iter()
                .map(|m| format!("{:?}", output::truncate(&m.text, 60)))
                .collect();
            format!("{} not delivered: {}", messages.len(), texts.join(", "))
        }
    }
}

// ---- requests about one agent -----------------------------------------------------------------

pub async fn send(
    ctx: &Ctx,
    id: &str,
    message: String,
    delivery: Delivery,
    json: bool,
) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(|request_id| ClientMessage::SendMessage {
            request_id,
            agent_id: agent.id.clone(),
            text: message,
            delivery,
        })
        .await?;
    let DaemonMessage::MessageQueued { message_id, .. } = answer else {
        return Err(unexpected(&answer));
    };
    // The message is kept either way; say so when it cannot run now.
    let now = connection
        .request(|request_id| ClientMessage::GetAgent {
            request_id,
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    if let DaemonMessage::Agent { agent: now, .. } = &now {
        if now.start_failure.is_some() {
            eprintln!("{}", not_running(now, &name));
        } else if let Some(limited) = &now.limited {
            eprintln!(
                "{name} waits for its provider's usage limit: this message runs after the prompt that waits, which goes again {} (`drover retry {name}` sends it now)",
                output::when_ahead(&limited.retry_at, jiff::Timestamp::now()),
            );
        }
    }
    let delivery = match delivery {
        Delivery::Followup => "followup",
        Delivery::Steer => "steer",
        Delivery::Inject => "inject",
    };
    if json {
        return print_json(
            &json!({"agentId": agent.id, "messageId": message_id, "delivery": delivery}),
        );
    }
    outln!("queued {delivery} for {name} (message {message_id})");
    Ok(())
}

/// What to say of an agent whose last start failed: why, that its messages are kept, and
/// how it starts again.
fn not_running(agent: &AgentInfo, name: &str) -> String {
    let why = agent.error.as_deref().unwrap_or("its start failed");
    let queued = agent.queued.as_ref().map_or(0, Vec::len);
    let how = match (&agent.start_failure, &agent.runtime.retry_at) {
        (Some(f), _) if f.sign_in.is_some() => {
            format!(
                "`drover login {}` signs it in and starts it",
                agent.provider
            )
        }
        (_, Some(at)) => format!(
            "it tries again {}; `drover retry {name}` now",
            output::when_ahead(at, jiff::Timestamp::now())
        ),
        _ => format!("`drover retry {name}` starts it again"),
    };
    format!("{name} is not running: {why}\n{queued} message(s) kept for it, not delivered; {how}")
}

pub async fn wait(ctx: &Ctx, id: &str, timeout: Option<f64>) -> anyhow::Result<()> {
    let timeout = match timeout {
        Some(s) if s.is_finite() && s >= 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => anyhow::bail!("--timeout must be a number of seconds, not {s}"),
        None => None,
    };
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(|request_id| ClientMessage::WaitIdle {
            request_id,
            agent_id: agent.id.clone(),
            timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        })
        .await?;
    connection.close().await;
    match answer {
        DaemonMessage::Idle { idle: true, .. } => {
            eprintln!("drover: {name} is idle");
            Ok(())
        }
        DaemonMessage::Idle { idle: false, .. } => Err(CliError::Timeout(format!(
            "{name} is still busy after {:.1}s",
            timeout.unwrap_or_default().as_secs_f64()
        ))
        .into()),
        other => Err(unexpected(&other)),
    }
}

pub async fn stop(ctx: &Ctx, id: &str, drop_queue: bool) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(|request_id| ClientMessage::Cancel {
            request_id,
            agent_id: agent.id.clone(),
            keep_inbox: !drop_queue,
        })
        .await?;
    connection.close().await;
    if drop_queue {
        outln!("stopped {name} and discarded its queued messages");
    } else {
        outln!("stopped {name}");
    }
    Ok(())
}

pub async fn archive(ctx: &Ctx, id: &str, stop: bool, json: bool) -> anyhow::Result<()> {
    let (mut connection, SessionState { agents, .. }) = ctx.connect().await?;
    let agent = resolve(&agents, id, Prefer::Live)?.clone();
    let short = ShortIds::new(&agents);
    let name = short.get(&agent.id).to_string();
    let answer = connection
        .request(|request_id| ClientMessage::Archive {
            request_id,
            agent_id: agent.id.clone(),
            stop_activity: stop,
        })
        .await;
    connection.close().await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            if let Some(CliError::Daemon {
                code,
                details: Some(details),
                ..
            }) = e.downcast_ref::<CliError>()
                && ErrorCode::parse(code) == Some(ErrorCode::AgentActive)
            {
                eprintln!("drover: cannot archive {name}: work still runs:");
                for line in activity_lines(details, &short) {
                    eprintln!("  {line}");
                }
                eprintln!("archive it anyway, stopping that work: drover archive {name} --stop");
                return Err(CliError::Reported {
                    code: exit::REFUSED,
                    message: "agent_active".to_string(),
                }
                .into());
            }
            return Err(e);
        }
    };
    let DaemonMessage::Archived {
        archived, stopped, ..
    } = &answer
    else {
        return Err(unexpected(&answer));
    };
    if json {
        return print_json(&json!({"agentId": agent.id, "archived": archived, "stopped": stopped}));
    }
    if !archived.contains(&agent.id) {
        outln!("{name} was already archived");
        return Ok(());
    }
    let others = archived.iter().filter(|a| **a != agent.id).count();
    let mut line = format!("archived {name}");
    if others > 0 {
        // Writing to a `String` cannot fail.
        let _ = write!(
            line,
            " and {others} subagent{}",
            if others == 1 { "" } else { "s" }
        );
    }
    outln!("{line}");
    for item in activity_lines(stopped, &short) {
        outln!("  stopped {item}");
    }
    Ok(())
}

/// One line per running item of an activity report (`{agentId, families: {name: [items]}}`),
/// agents named by their handles.
fn activity_lines(report: &Value, short: &ShortIds) -> Vec<String> {
    let Some(families) = report.get("families").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for (family, items) in families {
        for item in items.as_array().into_iter().flatten() {
            let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
            let who = match item.get("agentId").and_then(Value::as_str) {
                Some(id) => short.get(id).to_string(),
                None => text("id").to_string(),
            };
            let title = match text("title") {
                "" => String::new(),
                t => format!(" \"{t}\""),
            };
            lines.push(format!("{family}: {who}{title}: {}", text("detail")));
        }
    }
    lines
}

pub async fn retry(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(|request_id| ClientMessage::RestartAgent {
            request_id,
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Ok { .. } = answer else {
        return Err(unexpected(&answer));
    };
    if agent.limited.is_some() {
        eprintln!(
            "sending {name}'s prompt now, without waiting for the usage limit's reset (`drover attach {name}` to watch)"
        );
    } else {
        eprintln!("starting {name} again (`drover attach {name}` to watch)");
    }
    Ok(())
}

/// `drover set AGENT SETTING VALUE`: mode, model, reasoning effort or another option the
/// agent offers.
pub async fn set(ctx: &Ctx, id: &str, setting: &str, value: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(|request_id| ClientMessage::SetConfigOption {
            request_id,
            agent_id: agent.id.clone(),
            config_id: setting.to_string(),
            value: value.to_string(),
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Ok { .. } = answer else {
        return Err(unexpected(&answer));
    };
    outln!("{name}: {setting} = {value}");
    Ok(())
}

/// `drover budget AGENT --tokens N --cost X` (or `--clear`).
pub async fn budget(
    ctx: &Ctx,
    id: &str,
    tokens: Option<u64>,
    cost: Option<f64>,
    hard: bool,
    clear: bool,
) -> anyhow::Result<()> {
    if !clear && tokens.is_none() && cost.is_none() {
        anyhow::bail!("give --tokens and/or --cost, or --clear");
    }
    let budget = (!clear).then_some(drover_protocol::Budget { tokens, cost, hard });
    let (mut connection, agent, name) = ctx.agent(id).await?;
    let answer = connection
        .request(|request_id| ClientMessage::SetBudget {
            request_id,
            agent_id: agent.id.clone(),
            budget: budget.clone(),
        })
        .await?;
    connection.close().await;
    let DaemonMessage::Ok { .. } = answer else {
        return Err(unexpected(&answer));
    };
    if let Some(b) = &budget {
        outln!("{name}: budget {}", budget_line(b));
    } else {
        outln!("{name}: no budget");
    }
    Ok(())
}

/// "1000 tokens, 2.5000 cost".
fn budget_line(budget: &drover_protocol::Budget) -> String {
    let mut parts = Vec::new();
    if let Some(tokens) = budget.tokens {
        parts.push(format!("{tokens} tokens"));
    }
    if let Some(cost) = budget.cost {
        parts.push(format!("{cost:.4} cost"));
    }
    let mut line = parts.join(", ");
    if budget.hard {
        line.push_str(", hard (running turns are cancelled at 100 %)");
    }
    line
}

pub async fn unarchive(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent_preferring(id, Prefer::Archived).await?;
    connection
        .request(|request_id| ClientMessage::Unarchive {
            request_id,
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    outln!("unarchived {name}");
    Ok(())
}

pub async fn detach(ctx: &Ctx, id: &str) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(|request_id| ClientMessage::Detach {
            request_id,
            agent_id: agent.id.clone(),
        })
        .await?;
    connection.close().await;
    if agent.parent_agent_id.is_none() {
        outln!("{name} is a top-level agent already");
    } else {
        outln!("detached {name}: it is a top-level agent now");
    }
    Ok(())
}

pub async fn permit(ctx: &Ctx, id: &str, answer: PermitAnswer, always: bool) -> anyhow::Result<()> {
    let kind = match (answer, always) {
        (PermitAnswer::Allow, false) => "allow_once",
        (PermitAnswer::Allow, true) => "allow_always",
        (PermitAnswer::Deny, false) => "reject_once",
        (PermitAnswer::Deny, true) => "reject_always",
    };
    let (mut connection, agent, name) = ctx.agent(id).await?;
    connection
        .request(|request_id| ClientMessage::AnswerPermission {
            request_id,
            agent_id: agent.id.clone(),
            seq: None,
            kind: Some(kind.to_string()),
            option_id: None,
            cancel: false,
        })
        .await?;
    connection.close().await;
    let verb = match answer {
        PermitAnswer::Allow => "allowed",
        PermitAnswer::Deny => "denied",
    };
    outln!("{verb} the oldest request of {name} ({kind})");
    Ok(())
}

// ---- providers --------------------------------------------------------------------------------

/// `drover providers`: the running daemon's view, else the config on disk.
pub async fn providers(ctx: &Ctx, json: bool) -> anyhow::Result<()> {
    // Each provider, whether it can run, and (from a daemon) its sign-in.
    #[expect(clippy::type_complexity, reason = "one row of the listing")]
    let rows: Vec<(
        Value,
        bool,
        String,
        Option<ProviderSignIn>,
        Option<drover_protocol::ProviderWarm>,
    )> = match Connection::open(&ctx.endpoint, false).await {
        Ok((mut connection, _)) => {
            let answer = connection
                .request(|request_id| ClientMessage::ListProviders { request_id })
                .await?;
            connection.close().await;
            let DaemonMessage::Providers { providers, .. } = answer else {
                return Err(unexpected(&answer));
            };
            providers
                .into_iter()
                .map(|p| {
                    let provider = json!({"name": p.name, "label": p.label, "command": p.command});
                    (
                        provider,
                        p.available,
                        p.detail,
                        Some(p.sign_in),
                        Some(p.warm),
                    )
                })
                .collect()
        }
        Err(e) if is_not_running(&e) && ctx.endpoint.url.is_none() => {
            local_providers(&ctx.endpoint.home)?
                .into_iter()
                .map(|(p, available, detail)| (p, available, detail, None, None))
                .collect()
        }
        Err(e) => return Err(e),
    };
    if json {
        let list: Vec<Value> = rows
            .into_iter()
            .map(|(provider, available, detail, sign_in, warm)| {
                let availability = if available {
                    json!({"state": "available", "path": detail})
                } else {
                    json!({"state": "unavailable", "reason": detail})
                };
                let mut entry =
                    json!({"provider": provider, "availability": availability, "signIn": sign_in});
                if let Some(warm) = warm.filter(|w| w.wanted > 0) {
                    entry["warm"] = json!(warm);
                }
                entry
            })
            .collect();
        return print_json(&list);
    }
    let width = rows
        .iter()
        .map(|(p, _, _, _, _)| p["name"].as_str().unwrap_or_default().len())
        .max()
        .unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for (provider, available, detail, sign_in, warm) in rows {
        let name = provider["name"].as_str().unwrap_or_default();
        // The demo says what it is rather than where the drover binary is.
        let detail = if name == drover_acp::providers::DEMO_PROVIDER && available {
            provider["label"].as_str().unwrap_or_default().to_string()
        } else {
            detail
        };
        let state = if available {
            ctx.style.paint(Paint::Green, "available  ")
        } else {
            ctx.style.paint(Paint::Yellow, "unavailable")
        };
        writeln!(out, "{name:width$}  {state}  {detail}")?;
        match sign_in {
            Some(s) if s.state == "needs_sign_in" => {
                let how = s.how.unwrap_or_default();
                let label = ctx.style.paint(Paint::Yellow, "needs a sign-in");
                writeln!(out, "{:width$}  {label}: {how}", "")?;
            }
            Some(s) if s.state == "signed_in" && available => {
                writeln!(out, "{:width$}  signed in", "")?;
            }
            _ => {}
        }
        if let Some(warm) = warm.filter(|w| w.wanted > 0) {
            writeln!(out, "{:width$}  warm {}/{}", "", warm.ready, warm.wanted)?;
        }
    }
    Ok(())
}

fn is_not_running(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<CliError>(),
        Some(CliError::NotRunning { .. })
    )
}

fn local_providers(home: &Path) -> anyhow::Result<Vec<(Value, bool, String)>> {
    let providers = drover_acp::Providers::load(home)?;
    providers
        .all()
        .map(|p| {
            let (available, detail) = match providers.availability(p) {
                drover_acp::Availability::Available { path } => (true, path.display().to_string()),
                drover_acp::Availability::Unavailable { reason } => (false, reason),
            };
            Ok((serde_json::to_value(p)?, available, detail))
        })
        .collect()
}
