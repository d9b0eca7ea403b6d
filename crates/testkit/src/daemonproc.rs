//! The program `drover-daemon-proc HOME` (a bin of drover-e2e; this is its code): the daemon
//! in a process of its own, as `drover daemon` runs it (`drover_daemon::run` on 127.0.0.1:0,
//! a multi-threaded runtime), so that a test can kill it with any signal. It serves until
//! SIGTERM or SIGINT; clients find it by `HOME/daemon.json`.

use std::path::PathBuf;

use anyhow::{Context, bail};

/// The program's `main`: reads HOME from the arguments.
pub fn main() -> anyhow::Result<()> {
    // As `drover`'s main: the daemon's guard runs from this binary.
    drover_core::guard::serve_if_asked();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [home] = args.as_slice() else {
        bail!("usage: drover-daemon-proc HOME");
    };
    let home = PathBuf::from(home);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr().context("the listening address")?;
        let config = drover_daemon::DaemonConfig::new(&home, addr)?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        drover_daemon::run(listener, config, shutdown).await?;
        Ok(())
    })
}
