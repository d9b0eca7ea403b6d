//! `drover`: runs the daemon (`drover daemon`); the client commands join it with the protocol.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use drover_daemon::{DaemonConfig, DataDirLock};

#[derive(Debug, Parser)]
#[command(
    name = "drover",
    version,
    about = "Run and manage fleets of coding agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the providers (presets and config.toml) and whether each can run here.
    Providers {
        /// Data directory whose config.toml to read [default: $DROVER_HOME, else ~/.drover]
        #[arg(long, value_name = "DIR")]
        home: Option<PathBuf>,
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon in the foreground (Ctrl-C or SIGTERM stops it cleanly).
    Daemon {
        /// Data directory [default: $DROVER_HOME, else ~/.drover]
        #[arg(long, value_name = "DIR")]
        home: Option<PathBuf>,
        /// Address to listen on (loopback only)
        #[arg(long, env = "DROVER_LISTEN", value_name = "ADDR", default_value_t = DaemonConfig::default_listen())]
        listen: SocketAddr,
        /// Ask clients for the token (`$DROVER_HOME/token`) even on loopback; beyond loopback
        /// it is always asked for
        #[arg(long)]
        require_token: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Daemon {
            home,
            listen,
            require_token,
        } => daemon(home, listen, require_token),
        Command::Providers { home, json } => providers(home, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drover: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn daemon(home: Option<PathBuf>, listen: SocketAddr, require_token: bool) -> anyhow::Result<()> {
    let home = match home {
        Some(home) => home,
        None => DaemonConfig::default_home()?,
    };
    let mut config = DaemonConfig::new(home, listen)?;
    config.require_token = require_token;
    // The lock comes before the port, so a second daemon on this home names the first one
    // instead of failing on a busy port.
    let lock = DataDirLock::acquire(&config.home)?;
    drover_daemon::logging::init(&config.home)
        .with_context(|| format!("cannot open the log in `{}`", config.home.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        drover_daemon::run_locked(lock, listener, config, shutdown_signal()).await?;
        Ok(())
    })
}

fn providers(home: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let home = match home {
        Some(home) => home,
        None => DaemonConfig::default_home()?,
    };
    let providers = drover_acp::Providers::load(&home)?;
    let rows: Vec<(&drover_acp::Provider, drover_acp::Availability)> = providers
        .all()
        .map(|p| (p, providers.availability(p)))
        .collect();
    if json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(p, a)| serde_json::json!({"provider": p, "availability": a}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let width = rows.iter().map(|(p, _)| p.name.len()).max().unwrap_or(0);
    for (provider, availability) in rows {
        let (state, detail) = match availability {
            drover_acp::Availability::Available { path } => {
                ("available", path.display().to_string())
            }
            drover_acp::Availability::Unavailable { reason } => ("unavailable", reason),
        };
        println!("{:width$}  {:11}  {}", provider.name, state, detail);
    }
    Ok(())
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
