//! `drover`: runs the daemon (`drover daemon`) and talks to it over the client protocol
//! (every other command). Parsing is in `args`, the commands in their own modules (what
//! they share in `commands`), the daemon's in `daemon_cmd`.

/// `println!` that hands a closed stdout (`drover ls | head`) back as an error instead of
/// panicking.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod agents;
mod args;
mod client;
mod commands;
mod daemon_cmd;
mod error;
mod hosts;
mod import;
mod inspect;
mod jobs;
mod login;
mod mcp_proxy;
mod notify;
mod output;
mod providers;
mod resolve;
mod run;
mod schedules;
mod ui;
mod workspaces;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use drover_daemon::DaemonConfig;
use drover_protocol::Delivery;

use crate::args::{Cli, Command, DaemonAction, ScheduleAction, WorktreeAction};
use crate::client::Endpoint;
use crate::commands::Ctx;
use crate::error::CliError;
use crate::output::Style;

fn main() -> ExitCode {
    // `drover daemon` runs its guard from this binary (`drover_core::guard`).
    drover_core::guard::serve_if_asked();
    // The `demo` provider runs this very binary (`drover demo-agent`).
    if let Ok(exe) = std::env::current_exe() {
        drover_acp::providers::set_demo_program(exe);
    }
    let cli = Cli::parse();
    if let Command::DemoAgent = cli.command {
        return drover_scripted::scripted_agent::demo_main();
    }
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`drover ls | head`): nothing more to say.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let reported = e.chain().any(|e| {
                matches!(
                    e.downcast_ref::<CliError>(),
                    Some(CliError::Reported { .. })
                )
            });
            if !reported {
                eprintln!("drover: {e:#}");
            }
            ExitCode::from(error::exit_code(&e))
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

// One arm per command: splitting the match would only move it.
#[expect(clippy::too_many_lines)]
fn dispatch(cli: Cli) -> anyhow::Result<()> {
    let home = match cli.global.home.clone() {
        Some(home) => home,
        None => DaemonConfig::default_home()?,
    };
    let seconds = |s: f64| {
        Duration::try_from_secs_f64(s)
            .map_err(|_| anyhow::anyhow!("{s} is not a number of seconds"))
    };
    let command = match cli.command {
        Command::Daemon(daemon) => {
            return match daemon.action {
                None => daemon_cmd::foreground(&home, &daemon.serve),
                Some(DaemonAction::Start { serve, timeout }) => {
                    daemon_cmd::start(&home, &serve, seconds(timeout)?)
                }
                Some(DaemonAction::Stop { timeout }) => daemon_cmd::stop(&home, seconds(timeout)?),
                Some(DaemonAction::Status { json }) => daemon_cmd::status(&home, json),
            };
        }
        Command::Completions { shell } => {
            // Into memory first: `generate` panics on a write error, and a reader that stops
            // early (`| head`) is one.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "drover", &mut script);
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&script)?;
            stdout.flush()?;
            return Ok(());
        }
        Command::McpProxy { url } => return mcp_proxy::run(&url),
        Command::Connect { .. } => return hosts::connect_stdio(&home),
        Command::Ui { print } => return ui::run(&home, cli.global.url.as_deref(), print),
        other => other,
    };
    let ctx = Ctx {
        endpoint: Endpoint {
            home,
            url: cli.global.url.filter(|u| !u.is_empty()),
        },
        style: Style::detect(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        match command {
            Command::Run(args) => run::run(&ctx, args).await,
            Command::Ls {
                all,
                tree,
                json,
                host,
            } => inspect::ls(&ctx, all, tree, json, host.as_deref()).await,
            Command::Host(host) => hosts::run(&ctx, host.action).await,
            Command::Attach { id, tail, json } => run::attach(&ctx, &id, tail, json).await,
            Command::Send {
                id,
                message,
                steer,
                inject,
                json,
            } => {
                let delivery = if steer {
                    Delivery::Steer
                } else if inject {
                    Delivery::Inject
                } else {
                    Delivery::Followup
                };
                agents::send(&ctx, &id, message, delivery, json).await
            }
            Command::Wait { id, timeout } => agents::wait(&ctx, &id, timeout).await,
            Command::Stop { id, drop_queue } => agents::stop(&ctx, &id, drop_queue).await,
            Command::Archive { id, stop, json } => agents::archive(&ctx, &id, stop, json).await,
            Command::Unarchive { id } => agents::unarchive(&ctx, &id).await,
            Command::Detach { id } => agents::detach(&ctx, &id).await,
            Command::Inspect { id, json } => inspect::inspect(&ctx, &id, json).await,
            Command::Retry { id } => agents::retry(&ctx, &id).await,
            Command::Set { id, setting, value } => agents::set(&ctx, &id, &setting, &value).await,
            Command::Budget {
                id,
                tokens,
                cost,
                hard,
                clear,
            } => agents::budget(&ctx, &id, tokens, cost, hard, clear).await,
            Command::Login { provider, method } => {
                login::login(&ctx, &provider, method.as_deref()).await
            }
            Command::Logs {
                id,
                tail,
                follow,
                json,
            } => run::logs(&ctx, &id, tail, follow, json).await,
            Command::Permit { id, answer, always } => {
                agents::permit(&ctx, &id, answer, always).await
            }
            Command::Providers { json } => providers::providers(&ctx, json).await,
            Command::Workspaces { all, json } => workspaces::list(&ctx, all, false, json).await,
            Command::Worktree(worktree) => match worktree.action {
                WorktreeAction::Ls { all, json } => workspaces::list(&ctx, all, true, json).await,
                WorktreeAction::New {
                    name,
                    repo,
                    branch,
                    base,
                    json,
                } => workspaces::new(&ctx, name, repo, branch, base, json).await,
                WorktreeAction::Status { ws, json } => workspaces::status(&ctx, &ws, json).await,
                WorktreeAction::Rm { ws, force, json } => {
                    workspaces::remove(&ctx, &ws, force, json).await
                }
            },
            Command::Schedule(schedule) => match schedule.action {
                ScheduleAction::Add(add) => schedules::add(&ctx, add).await,
                ScheduleAction::Ls { agent, json } => {
                    schedules::list(&ctx, agent.as_deref(), json).await
                }
                ScheduleAction::Rm { schedule } => schedules::remove(&ctx, &schedule).await,
                ScheduleAction::Pause { schedule } => {
                    schedules::set_paused(&ctx, &schedule, true).await
                }
                ScheduleAction::Resume { schedule } => {
                    schedules::set_paused(&ctx, &schedule, false).await
                }
            },
            Command::Job(job) => jobs::run(&ctx, job.action).await,
            Command::Notify(notify) => notify::run(&ctx, notify.action).await,
            Command::Import(import) => match import.source {
                args::ImportSource::Paseo { path, apply, json } => {
                    import::paseo(&ctx, path, apply, json).await
                }
                args::ImportSource::Sessions {
                    provider,
                    cwd,
                    sessions,
                    apply,
                    json,
                } => import::sessions(&ctx, &provider, cwd, sessions, apply, json).await,
            },
            Command::Daemon(_)
            | Command::Completions { .. }
            | Command::McpProxy { .. }
            | Command::Connect { .. }
            | Command::DemoAgent
            | Command::Ui { .. } => Ok(()),
        }
    })
}
