//! `drover host` (the hosts a hub links to) and `drover connect --stdio` (what a hub's link
//! runs on the host: a bridge from stdin and stdout to the host's own daemon).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{DaemonMessage, HostConfig, HostInfo, HostState};
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

use crate::args::{HostAction, LogFormatArg, ServeArgs};
use crate::client::{read_token, ws_url};
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::CliError;
use crate::output::{self, Paint, Table};

/// How long `host add` waits for the new host to be reachable.
const ADD_WAIT: Duration = Duration::from_secs(45);

pub async fn run(ctx: &Ctx, action: HostAction) -> anyhow::Result<()> {
    match action {
        HostAction::Add {
            name,
            address,
            identity,
            ssh_options,
            command,
            no_wait,
            install,
        } => {
            let identity = match identity {
                Some(path) => Some(
                    std::path::absolute(&path)
                        .with_context(|| format!("cannot resolve `{}`", path.display()))?
                        .display()
                        .to_string(),
                ),
                None => None,
            };
            let command = command.map(|line| split_command(&line)).transpose()?;
            let host = HostConfig {
                name,
                ssh: address,
                identity,
                ssh_options,
                command,
            };
            if install {
                install_on(&host)?;
            }
            add(ctx, host, no_wait).await
        }
        HostAction::Ls { json } => ls(ctx, json).await,
        HostAction::Rm { name } => rm(ctx, &name).await,
    }
}

/// `--command "…"` as words, as a shell would split them.
fn split_command(line: &str) -> Result<Vec<String>, CliError> {
    shlex::split(line)
        .filter(|words| !words.is_empty())
        .ok_or_else(|| {
            CliError::BadArgument(format!(
                "--command `{line}`: not a command line (check its quotes)"
            ))
        })
}

/// Where `--install` puts drover on a host (first on the link's `PATH`).
const INSTALLED: &str = "$HOME/.local/bin/drover";

/// `drover host add --install`: copies this drover over ssh into the host's
/// `~/.local/bin` unless the drover the link would run there is this version already.
fn install_on(host: &HostConfig) -> anyhow::Result<()> {
    let ours = env!("CARGO_PKG_VERSION");
    let run = |remote: &str, stdin: Option<std::fs::File>| -> anyhow::Result<String> {
        let argv = drover_daemon::ssh_command(host, remote).ok_or_else(|| {
            CliError::BadArgument(
                "--install copies drover over ssh: give an ssh:// address (a pod or container \
                 gets drover from its image)"
                    .to_string(),
            )
        })?;
        let mut command = std::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.stdin(stdin.map_or_else(Stdio::null, Stdio::from));
        let out = command.output().context("cannot run ssh")?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(CliError::Daemon {
                code: "host_unreachable".to_string(),
                message: format!("installing drover on host `{}`: {said}", host.name),
                details: None,
            }
            .into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let found = run(
        "uname -sm; PATH=\"$HOME/.local/bin:$PATH\" drover --version 2>/dev/null || true",
        None,
    )?;
    let mut lines = found.lines();
    let system = lines.next().unwrap_or_default().to_string();
    let theirs = lines.next().unwrap_or_default().trim().to_string();
    let here = format!(
        "{} {}",
        capitalized(std::env::consts::OS),
        std::env::consts::ARCH
    );
    if system != here {
        return Err(CliError::BadArgument(format!(
            "host `{}` runs {system}; this drover is built for {here}: install drover there yourself",
            host.name
        ))
        .into());
    }
    if theirs == format!("drover {ours}") {
        eprintln!("drover: host `{}` has drover {ours} already", host.name);
        return Ok(());
    }
    let exe = std::env::current_exe().context("cannot find this drover")?;
    let binary =
        std::fs::File::open(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    run(
        &format!(
            "mkdir -p \"$HOME/.local/bin\" && cat > \"{INSTALLED}.part\" && chmod 755 \"{INSTALLED}.part\" \
             && mv -f \"{INSTALLED}.part\" \"{INSTALLED}\""
        ),
        Some(binary),
    )?;
    eprintln!(
        "drover: installed drover {ours} on host `{}` in ~/.local/bin (it had {})",
        host.name,
        if theirs.is_empty() {
            "none"
        } else {
            theirs.as_str()
        }
    );
    Ok(())
}

/// `linux` as `uname -s` says it.
fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `drover host add`: the daemon keeps the host and links to it; waits (unless `no_wait`)
/// until the link is made or failed once, and says which.
async fn add(ctx: &Ctx, host: HostConfig, no_wait: bool) -> anyhow::Result<()> {
    let name = host.name.clone();
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection.request(rq::AddHost { host }).await?;
    answer
        .into_answer::<answers::Hosts>()
        .map_err(|m| unexpected(&m))?;
    eprintln!("drover: host `{name}` added; linking…");
    if no_wait {
        connection.close().await;
        return Ok(());
    }
    let info = wait_linked(&mut connection, &name).await?;
    connection.close().await;
    if info.state == HostState::Reachable {
        eprintln!(
            "drover: host `{name}` is reachable (drover {}, {} agents)",
            info.version.as_deref().unwrap_or("?"),
            info.agents
        );
        return Ok(());
    }
    Err(CliError::Daemon {
        code: "host_unreachable".to_string(),
        message: format!(
            "host `{name}` was added but is {}: {}; the hub keeps trying (`drover host ls`), or `drover host rm {name}`",
            info.state,
            info.error.as_deref().unwrap_or("no answer")
        ),
        details: None,
    }
    .into())
}

/// `drover host ls`.
async fn ls(ctx: &Ctx, json: bool) -> anyhow::Result<()> {
    let (connection, state) = ctx.connect().await?;
    connection.close().await;
    if json {
        return print_json(&state.hosts);
    }
    if state.hosts.is_empty() {
        eprintln!("drover: no hosts; add one with `drover host add NAME ssh://user@machine`");
        return Ok(());
    }
    let now = jiff::Timestamp::now();
    let mut table = Table::new(vec![
        "NAME", "STATE", "SINCE", "AGENTS", "LIVE", "VERSION", "TARGET",
    ]);
    for host in &state.hosts {
        let state = match &host.error {
            Some(error) if host.state != HostState::Reachable => {
                format!("{} ({})", host.state, output::truncate(error, 60))
            }
            _ => host.state.to_string(),
        };
        let live = match host.max_live {
            Some(max) => format!("{}/{max}", host.live),
            None => host.live.to_string(),
        };
        let paint = if host.state == HostState::Reachable {
            Paint::Plain
        } else {
            Paint::Yellow
        };
        table.row(vec![
            (host.name.clone(), Paint::Bold),
            (state, paint),
            (output::age(&host.since, now), Paint::Plain),
            (host.agents.to_string(), Paint::Plain),
            (live, Paint::Plain),
            (
                host.version.clone().unwrap_or_else(|| "-".into()),
                Paint::Plain,
            ),
            (host.target.clone(), Paint::Dim),
        ]);
    }
    table.write(&mut std::io::stdout().lock(), ctx.style)?;
    Ok(())
}

/// `drover host rm`.
async fn rm(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection
        .request(rq::RemoveHost {
            name: name.to_string(),
        })
        .await?;
    connection.close().await;
    answer
        .into_answer::<answers::Hosts>()
        .map_err(|m| unexpected(&m))?;
    eprintln!("drover: host `{name}` removed (its agents go on running there)");
    Ok(())
}

/// Waits (bounded) until the host's link is made or has failed once.
async fn wait_linked(
    connection: &mut crate::client::Connection,
    name: &str,
) -> anyhow::Result<HostInfo> {
    let deadline = tokio::time::Instant::now() + ADD_WAIT;
    loop {
        let message = tokio::time::timeout_at(deadline, connection.recv())
            .await
            .map_err(|_| {
                CliError::Timeout(format!(
                    "host `{name}` did not answer within {} s; `drover host ls` shows how it goes",
                    ADD_WAIT.as_secs()
                ))
            })??;
        if let DaemonMessage::HostUpdate {
            name: updated,
            host: Some(info),
        } = message
            && updated == name
            && info.state != HostState::Connecting
        {
            return Ok(info);
        }
    }
}

/// `drover connect --stdio`: starts this machine's daemon when none runs, connects to it with
/// its token, and copies messages between it and stdin/stdout, one JSON message per line,
/// until either side ends. The token goes into the first `hello` here: the other side never
/// sees it.
pub fn connect_stdio(home: &Path) -> anyhow::Result<()> {
    let info = if let Some((info, _)) = crate::daemon_cmd::running(home) {
        info
    } else {
        let listen = match std::env::var("DROVER_LISTEN") {
            Ok(addr) if !addr.is_empty() => addr.parse().map_err(|_| {
                CliError::BadArgument(format!("DROVER_LISTEN `{addr}`: not an address"))
            })?,
            _ => drover_daemon::DaemonConfig::default_listen(),
        };
        let serve = ServeArgs {
            listen,
            no_token: false,
            allow_hosts: Vec::new(),
            log_format: LogFormatArg::Text,
        };
        crate::daemon_cmd::launch(home, &serve, Duration::from_secs(30))
            .context("cannot start this machine's drover daemon")?
    };
    let token = read_token(home);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(bridge(&ws_url(&info.url), token))
}

async fn bridge(url: &str, token: Option<String>) -> anyhow::Result<()> {
    let started = Instant::now();
    let (socket, _) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_tungstenite::connect_async_with_config(url, None, true),
    )
    .await
    .map_err(|_| anyhow::anyhow!("this machine's daemon at {url} did not answer in 10 s"))?
    .with_context(|| format!("cannot reach this machine's daemon at {url}"))?;
    tracing::debug!(elapsed = ?started.elapsed(), "bridged");
    let (mut to_daemon, mut from_daemon) = socket.split();
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let mut token = token;
    loop {
        tokio::select! {
            line = stdin.next_line() => {
                let Some(line): Option<String> = line.context("cannot read stdin")? else {
                    let _ = to_daemon.close().await;
                    return Ok(());
                };
                let line = match token.take() {
                    Some(token) => with_token(&line, token),
                    None => line,
                };
                if to_daemon.send(Message::Text(line.into())).await.is_err() {
                    return Ok(());
                }
            }
            frame = from_daemon.next() => match frame {
                Some(Ok(Message::Text(text))) => {
                    stdout.write_all(text.as_bytes()).await?;
                    stdout.write_all(b"\n").await?;
                    stdout.flush().await?;
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => return Ok(()),
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The `hello` with this machine's token in it (any other first line as it is).
fn with_token(line: &str, token: String) -> String {
    match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(mut hello)) if hello.get("type") == Some(&Value::from("hello")) => {
            hello.insert("token".into(), Value::String(token));
            Value::Object(hello).to_string()
        }
        _ => line.to_string(),
    }
}
