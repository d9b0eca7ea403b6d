//! `drover-model`: the scripted model server (see `drover_fakes::model`) as a process.
//!
//! Usage: `drover-model [ADDR]` (default `127.0.0.1:0`). Prints `http://ADDR` on the first
//! line of stdout once it listens, then serves until SIGINT or SIGTERM. `GET /requests`
//! returns the request log.

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".to_string());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let server = drover_fakes::model::serve(listener);
    println!("{}", server.url());
    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}
