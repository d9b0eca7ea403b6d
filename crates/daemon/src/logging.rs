//! Daemon logs: `tracing` to stderr and to `$DROVER_HOME/daemon.log`.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt;
use tracing_subscriber::prelude::*;

/// Installs the global subscriber. The level comes from `DROVER_LOG` (e.g. `debug`,
/// `drover_core=trace`), default `info`. Call once per process.
pub fn init(home: &Path) -> std::io::Result<()> {
    drover_core::private::create_dir_all(home)?;
    let file = drover_core::private::open_options()
        .create(true)
        .append(true)
        .open(home.join("daemon.log"))?;
    let filter =
        || EnvFilter::try_from_env("DROVER_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let color = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::registry()
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color)
                .with_filter(filter()),
        )
        .with(
            fmt::layer()
                .with_writer(Mutex::new(file))
                .with_ansi(false)
                .with_filter(filter()),
        )
        .try_init()
        .map_err(std::io::Error::other)
}
