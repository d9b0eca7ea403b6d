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

use anyhow::Context;
use clap::{CommandFactory, Parser};
use drover_daemon::DaemonConfig;

use crate::args::{Cli, Command};
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

/// The commands that run without the daemon, then one that talks to it.
fn dispatch(cli: Cli) -> anyhow::Result<()> {
    let home = match cli.global.home.clone() {
        Some(home) => home,
        None => DaemonConfig::default_home()?,
    };
    let command = match cli.command {
        Command::Daemon(daemon) => return daemon_cmd::run(&home, daemon),
        Command::Completions { shell } => return completions(shell),
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
    runtime.block_on(client_command(&ctx, command))
}

/// `drover completions SHELL`.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    // Into memory first: `generate` panics on a write error, and a reader that stops early
    // (`| head`) is one.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "drover", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script)?;
    stdout.flush()?;
    Ok(())
}

/// A command that talks to the daemon: one arm each, a family's in its module.
async fn client_command(ctx: &Ctx, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(mut args) => {
            args.prompt = args::message_text(args.prompt, std::io::stdin())?;
            run::run(ctx, args).await
        }
        Command::Ls {
            all,
            tree,
            json,
            host,
            needs_me,
            running,
            errors,
        } => {
            let only = if needs_me {
                Some(inspect::Only::NeedsMe)
            } else if running {
                Some(inspect::Only::Running)
            } else if errors {
                Some(inspect::Only::Errors)
            } else {
                None
            };
            inspect::ls(ctx, all, tree, json, host.as_deref(), only).await
        }
        Command::Host(host) => hosts::run(ctx, host.action).await,
        Command::Attach { id, tail, json } => run::attach(ctx, &id, tail, json).await,
        Command::Send {
            id,
            message,
            steer,
            inject,
            json,
        } => {
            let message = args::message_text(message, std::io::stdin())?;
            agents::send(ctx, &id, message, agents::delivery(steer, inject), json).await
        }
        Command::Wait { ids, timeout } => agents::wait(ctx, &ids, timeout).await,
        Command::Stop { id, drop_queue } => agents::stop(ctx, &id, drop_queue).await,
        Command::Archive { id, stop, json } => agents::archive(ctx, &id, stop, json).await,
        Command::Unarchive { id } => agents::unarchive(ctx, &id).await,
        Command::Detach { id } => agents::detach(ctx, &id).await,
        Command::Inspect { id, json } => inspect::inspect(ctx, &id, json).await,
        Command::Retry { id } => agents::retry(ctx, &id).await,
        Command::Set { id, setting, value } => agents::set(ctx, &id, &setting, &value).await,
        Command::Budget {
            id,
            tokens,
            cost,
            hard,
            clear,
        } => agents::budget(ctx, &id, tokens, cost, hard, clear).await,
        Command::Login { provider, method } => {
            login::login(ctx, &provider, method.as_deref()).await
        }
        Command::Logs {
            id,
            tail,
            follow,
            json,
        } => run::logs(ctx, &id, tail, follow, json).await,
        Command::Permit { id, answer, always } => agents::permit(ctx, &id, answer, always).await,
        Command::Providers { json } => providers::providers(ctx, json).await,
        Command::Workspaces { all, json } => workspaces::list(ctx, all, false, json).await,
        Command::Worktree(worktree) => workspaces::worktree(ctx, worktree.action).await,
        Command::Schedule(schedule) => schedules::run(ctx, schedule.action).await,
        Command::Job(job) => jobs::run(ctx, job.action).await,
        Command::Notify(notify) => notify::run(ctx, notify.action).await,
        Command::Import(import) => import::run(ctx, import.source).await,
        // Handled by `main` and `dispatch` before a client is made.
        Command::Daemon(_)
        | Command::Completions { .. }
        | Command::McpProxy { .. }
        | Command::Connect { .. }
        | Command::DemoAgent
        | Command::Ui { .. } => Ok(()),
    }
}
