//! `drover run`, `drover attach` and `drover logs`: start an agent or find one, and follow
//! its timeline (as text or JSON lines) until its turn ends or Ctrl-C.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use drover_protocol::Answer;
use drover_protocol::ItemKind;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{
    AgentInfo, AttentionReason, ClientMessage, DaemonMessage, NewWorktree, PermissionPolicy,
};
use serde_json::{Value, json};
use tokio::signal::unix::Signal;

use crate::args::RunArgs;
use crate::client::{Connection, SessionState};
use crate::commands::{Ctx, interrupts, print_json, unexpected, working_directory};
use crate::error::{CliError, exit};
use crate::output::{Renderer, Style, TurnEnd, View};
use crate::resolve::{Prefer, ShortIds, resolve};

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
        .request(create_message(&args, provider, &cwd, parent))
        .await
        .map_err(demo_hint)?;
    let answers::AgentCreated {
        agent,
        reused_worktree,
        ..
    } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if reused_worktree {
        // Said even with --detach (on stderr): the agent did not get a fresh checkout.
        eprintln!(
            "-- the worktree {} existed (no live agent in it): reused as it is, with its branch \
             and uncommitted work",
            agent.cwd
        );
    }
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
    if args.worktree.is_some() && !reused_worktree {
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
    provider: String,
    cwd: &Path,
    parent: Option<String>,
) -> ClientMessage {
    ClientMessage::CreateAgent(rq::CreateAgent {
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
        upstream: None,
    })
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

/// Timeline items one `fetch_timeline` page may hold (the daemon's cap).
const PAGE: usize = 1000;

pub async fn attach(ctx: &Ctx, id: &str, tail: usize, json: bool) -> anyhow::Result<()> {
    let (mut connection, agent, name) = ctx.agent(id).await?;
    // While attached, nothing is sent to notification sinks about this agent.
    connection
        .request(rq::Watching {
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
            .request(rq::FetchTimeline {
                agent_id: agent.to_string(),
                before,
                after: None,
                limit: Some(limit),
            })
            .await?;
        let DaemonMessage::TimelinePage(Answer {
            body:
                answers::TimelinePage {
                    items: page,
                    has_older,
                    ..
                },
            ..
        }) = answer
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
    /// A turn runs now (between `turn_started` and `turn_ended`), as far as this has seen.
    in_turn: bool,
    /// The agent waits for a permission answer (its last status said so).
    asking: bool,
    /// The agent's handle, for the hints this prints.
    name: String,
}

/// After how long without a word from the agent during its turn `drover run` and `drover
/// attach` say so (`$DROVER_QUIET_SECS`, default 30; 0 never): an agent retrying its model API
/// (a refused key, a rate limit: claude's ten retries take minutes) sends nothing meanwhile.
fn quiet_after() -> Option<Duration> {
    let secs = std::env::var("DROVER_QUIET_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(30.0);
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

impl Stream {
    fn new(style: Style, view: View, name: &str, json: bool) -> Stream {
        Stream {
            renderer: Renderer::new(std::io::stdout(), style, view, name.to_string()),
            view,
            json,
            last_seq: 0,
            turn_started: false,
            in_turn: false,
            asking: false,
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
            match item.get("kind").and_then(Value::as_str) {
                Some(kind) if kind == ItemKind::TurnStarted.as_str() => {
                    self.turn_started = true;
                    self.in_turn = true;
                }
                Some(kind) if kind == ItemKind::TurnEnded.as_str() => self.in_turn = false,
                _ => {}
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
        let quiet = quiet_after().filter(|_| !self.json);
        let mut heard = tokio::time::Instant::now();
        let mut said = 0u32;
        loop {
            if let Some((info, updates)) = initialized.take() {
                self.in_turn = info.status == "running";
                self.asking = info.attention_reason == Some(AttentionReason::Permission);
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
            // After 30 s of silence, then 60 s, 120 s…
            let say_quiet = quiet
                .filter(|_| self.in_turn && !self.asking)
                .map(|q| heard + q * (1u32 << said.min(10)));
            let message = tokio::select! {
                message = connection.recv() => message,
                _ = interrupts.recv() => return Ok(Outcome::Interrupted),
                () = sleep_until_some(say_quiet) => {
                    self.say_quiet(heard.elapsed())?;
                    said += 1;
                    continue;
                }
            };
            let message = match message {
                Ok(message) => message,
                Err(e) => return Ok(Outcome::Closed(format!("{e:#}"))),
            };
            match message {
                DaemonMessage::AgentUpdate(update) if update.agent_id == agent => {
                    heard = tokio::time::Instant::now();
                    said = 0;
                    if let Some(end) = self.show(&update.notification)?
                        && until == Until::TurnEnds
                    {
                        return Ok(Outcome::Turn(end));
                    }
                }
                DaemonMessage::AgentStatus { agent: info } if info.id == agent => {
                    let asking = info.attention_reason == Some(AttentionReason::Permission);
                    if asking != self.asking {
                        self.asking = asking;
                        heard = tokio::time::Instant::now();
                        said = 0;
                    }
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

    /// `-- nothing from the agent for 30s …` on stderr, on a line of its own.
    fn say_quiet(&mut self, for_how_long: Duration) -> anyhow::Result<()> {
        self.renderer.end_line()?;
        let secs = for_how_long.as_millis().div_ceil(1000).max(1);
        let took = if secs < 60 {
            format!("{secs}s")
        } else {
            format!("{}m{:02}s", secs / 60, secs % 60)
        };
        eprintln!(
            "-- nothing from the agent for {took}; its turn still runs (an agent retrying its \
             model API, after a refused key or a rate limit, says nothing meanwhile): `drover \
             stop {}` cancels it",
            self.name
        );
        Ok(())
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

/// Sleeps until `at`, or forever.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `initialize_agent_request`: the agent and its recent history, as notifications.
async fn initialize(
    connection: &mut Connection,
    agent: &str,
    tail: Option<usize>,
) -> anyhow::Result<(AgentInfo, Vec<Value>)> {
    let answer = connection
        .request(rq::InitializeAgentRequest {
            agent_id: agent.to_string(),
            limit: tail.map(|t| t.min(PAGE)),
        })
        .await?;
    let answers::AgentInitialized { info, updates, .. } =
        answer.into_answer().map_err(|m| unexpected(&m))?;
    Ok((info, updates.into_iter().map(|u| u.notification).collect()))
}
