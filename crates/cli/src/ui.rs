//! `drover ui`: the web UI's address with the token in its fragment (`#token=…`, which
//! browsers never send to a server), opened in the browser or printed.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::client::{not_published, read_info};

/// The page's address for the daemon at `base` (`http://HOST:PORT`): with the token of
/// `home` in the fragment when the daemon keeps one.
pub fn address(base: &str, home: &Path) -> String {
    let base = base.trim_end_matches('/');
    let base = base.strip_suffix("/ws").unwrap_or(base);
    let base = if let Some(rest) = base.strip_prefix("ws://") {
        format!("http://{rest}")
    } else if let Some(rest) = base.strip_prefix("wss://") {
        format!("https://{rest}")
    } else {
        base.to_string()
    };
    match crate::client::read_token(home) {
        Some(token) => format!("{base}/#token={token}"),
        None => format!("{base}/"),
    }
}

/// `drover ui [--print]`.
pub fn run(home: &Path, url: Option<&str>, print: bool) -> anyhow::Result<()> {
    let base = match url.filter(|u| !u.is_empty()) {
        Some(url) => url.to_string(),
        None => match read_info(home) {
            Some(info) => info.url,
            None => return Err(not_published(home).into()),
        },
    };
    let address = address(&base, home);
    if print {
        outln!("{address}");
        return Ok(());
    }
    if open(&address) {
        eprintln!("drover: opened the web UI in the browser");
    } else {
        eprintln!("drover: no browser could be started; open this address:");
        outln!("{address}");
    }
    Ok(())
}

/// Starts the desktop's opener (`xdg-open`, macOS `open`); `false` when none ran.
fn open(address: &str) -> bool {
    let openers: &[&str] = if cfg!(target_os = "macos") {
        &["open"]
    } else {
        &["xdg-open", "open"]
    };
    openers.iter().any(|opener| {
        Command::new(opener)
            .arg(address)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_in_the_fragment() {
        let home = tempfile::tempdir().expect("home");
        assert_eq!(
            address("http://127.0.0.1:7433", home.path()),
            "http://127.0.0.1:7433/"
        );
        std::fs::write(home.path().join("token"), "abc123\n").expect("token");
        assert_eq!(
            address("ws://127.0.0.1:7433/ws", home.path()),
            "http://127.0.0.1:7433/#token=abc123"
        );
    }
}
