//! `drover login PROVIDER [--method ID]`: signs a provider in with one of the methods its agent
//! offers (ACP `authMethods`), then has the daemon start again every agent of it that waits
//! for a sign-in.
//!
//! - `terminal`: the provider's own command with the method's arguments, in this terminal
//!   (stdin and stdout are the user's); exit 0 is a sign-in.
//! - `agent`: the agent is started here and asked to `authenticate` (what it prints on stderr,
//!   a link to open for instance, shows); the daemon keeps the method as the provider's `auth`.
//! - `env_var`: the variables are read here (without echo for secrets) and the daemon keeps
//!   them in the provider's `env` in `config.toml` (0600).
//!
//! The methods come from the daemon: what its agents' last starts saw, else what its agent
//! said when the daemon started it once to ask (`list_providers` with `askSignIn`), which the
//! daemon then remembers, so the `sign_in` that follows starts no agent to check the method
//! (a daemon from before `askSignIn`: the agent is asked here).
//!
//! What runs here is the CLI's own: its agent (and the terminal method's command) dies with
//! this process, by any signal, at any depth, as the daemon's children die with the daemon:
//! the same guard (`drover_core::guard`: the marker, a cgroup, `PR_SET_PDEATHSIG`), started
//! for the login. A login that ends, done or failed, ends its agent's process group and its
//! descendants, and what a terminal method's command (a job of the terminal's: a group of its
//! own, the foreground while it runs) left in its group; a failed one then has the guard sweep
//! too. A successful one disarms the guard instead: what the sign-in left running on its own,
//! out of the agent's tree or the command's group (the browser `xdg-open` started for the
//! sign-in page), is the user's and stays.
//!
//! It runs in this process's environment (the variables drover passes to agents, then the
//! provider's `env`), not the daemon's: a sign-in the agent keeps in the user's files (under
//! `HOME`) is found by the daemon's agents only when the daemon runs as the same user with
//! the same `HOME`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use drover_protocol::answers;
use drover_protocol::requests as rq;
use drover_protocol::{AuthKind, AuthMethod, ErrorCode};
use serde_json::{Value, json};

use crate::commands::{Ctx, unexpected};
use crate::error::CliError;
use crate::output::Paint;

/// How long the agent may take to answer `initialize` here.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an agent's own sign-in may take (a browser round trip).
const AUTHENTICATE_TIMEOUT: Duration = Duration::from_secs(600);

pub async fn login(ctx: &Ctx, provider: &str, method: Option<&str>) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection.request(rq::ListProviders::default()).await?;
    let answers::Providers { providers, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    let Some(info) = providers.iter().find(|p| p.name == provider) else {
        let known: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
        return Err(refusal(
            "unknown_provider",
            format!(
                "unknown provider `{provider}`; the providers are {}",
                known.join(", ")
            ),
        ));
    };
    if !info.available {
        return Err(refusal("provider_unavailable", info.detail.clone()));
    }
    let local = drover_acp::Providers::load(&ctx.endpoint.home)?;
    let spec = local
        .get(provider)
        .cloned()
        .ok_or_else(|| anyhow!("provider `{provider}` is not in this home's config"))?;
    let program = match local.availability(&spec) {
        drover_acp::Availability::Available { path } => path,
        drover_acp::Availability::Unavailable { reason } => {
            return Err(refusal("provider_unavailable", reason));
        }
    };
    let mut methods = Some(info.sign_in.methods.clone());
    if info.sign_in.methods.is_empty() {
        // The daemon asks the agent (started once) and remembers: the `sign_in` below starts
        // no agent of its own to check the method.
        eprintln!("-- asking {provider} how it signs in");
        let asked = connection
            .request(rq::ListProviders {
                ask_sign_in: Some(provider.to_string()),
            })
            .await;
        methods = match asked {
            Ok(answer) => {
                let answers::Providers { providers, .. } =
                    answer.into_answer().map_err(|m| unexpected(&m))?;
                Some(
                    providers
                        .into_iter()
                        .find(|p| p.name == provider)
                        .map(|p| p.sign_in.methods)
                        .unwrap_or_default(),
                )
            }
            // A daemon from before `askSignIn`: the agent is asked here.
            Err(e) if daemon_code(&e) == Some(ErrorCode::InvalidMessage) => None,
            Err(e) => return Err(e),
        };
    }
    // Before the agent starts: it ends what the login started if this process is killed.
    let guard = drover_core::guard::start();
    let signed = sign_in_here(ctx, provider, method, methods, &program, &spec);
    if let Some(guard) = guard {
        match &signed {
            // The agent is ended (its group and descendants, `Acp`'s drop): what it left
            // running on its own, the browser its sign-in opened, is the user's.
            Ok(_) => guard.disarm().await,
            Err(_) => guard.stop().await,
        }
    }
    let (method, vars) = signed?;
    let answer = connection
        .request(rq::SignIn {
            provider: provider.to_string(),
            method_id: method.id.clone(),
            vars,
        })
        .await?;
    connection.close().await;
    let answers::SignedIn { retried, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    let done = ctx.style.paint(Paint::Green, "signed in");
    match retried.len() {
        0 => eprintln!("{provider}: {done} with {}", method.id),
        n => eprintln!(
            "{provider}: {done} with {}; {n} agent(s) waiting for it start again",
            method.id
        ),
    }
    Ok(())
}

/// The daemon's error code in `error`, if it is one of the daemon's.
fn daemon_code(error: &anyhow::Error) -> Option<ErrorCode> {
    match error.downcast_ref::<CliError>() {
        Some(CliError::Daemon { code, .. }) => ErrorCode::parse(code),
        _ => None,
    }
}

/// What runs here: the method chosen (of `methods`, the daemon's; `None`: a daemon that
/// cannot ask, the agent is asked here) and done (the terminal command, the agent's own
/// sign-in, the variables read). The method and the variables for the daemon to keep.
fn sign_in_here(
    ctx: &Ctx,
    provider: &str,
    method: Option<&str>,
    methods: Option<Vec<AuthMethod>>,
    program: &Path,
    spec: &drover_acp::Provider,
) -> anyhow::Result<(AuthMethod, BTreeMap<String, String>)> {
    let agent = AgentCommand {
        program: program.display().to_string(),
        args: spec.command[1..].to_vec(),
        env: agent_env(&spec.env),
    };
    let methods = match methods {
        Some(methods) => methods,
        None => agent.auth_methods()?,
    };
    if methods.is_empty() {
        eprintln!(
            "{provider} offers no sign-in method over ACP: give it its key in config.toml \
             ([providers.{provider}] env), or sign in with its own CLI"
        );
        return Err(refusal(
            "provider_unavailable",
            format!("{provider} offers no sign-in method"),
        ));
    }
    let method = pick(ctx, provider, &methods, method)?;
    let mut vars = BTreeMap::new();
    match method.kind {
        AuthKind::Terminal => {
            eprintln!("-- {}: running {provider}'s login here", method.name);
            agent.run_terminal_login(&method)?;
        }
        AuthKind::Agent => {
            eprintln!("-- {}: {provider} signs in by itself", method.name);
            agent.authenticate(&method.id)?;
        }
        AuthKind::EnvVar => {
            for var in &method.vars {
                let value = read_var(var)?;
                if value.is_empty() && !var.optional {
                    return Err(usage(format!("{} is needed", var.name)));
                }
                if !value.is_empty() {
                    vars.insert(var.name.clone(), value);
                }
            }
        }
    }
    Ok((method, vars))
}

/// The method to use: the one named, the only one, or the user's choice at the terminal.
fn pick(
    ctx: &Ctx,
    provider: &str,
    methods: &[AuthMethod],
    wanted: Option<&str>,
) -> anyhow::Result<AuthMethod> {
    let list = || {
        methods
            .iter()
            .map(|m| format!("{} ({}: {})", m.id, m.kind.as_str(), m.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(id) = wanted {
        return methods.iter().find(|m| m.id == id).cloned().ok_or_else(|| {
            usage(format!(
                "{provider} has no sign-in method `{id}`; its methods: {}",
                list()
            ))
        });
    }
    if let [only] = methods {
        return Ok(only.clone());
    }
    if !std::io::stdin().is_terminal() {
        return Err(usage(format!("choose a method with --method: {}", list())));
    }
    eprintln!(
        "{}",
        ctx.style
            .paint(Paint::Bold, &format!("Sign in to {provider}:"))
    );
    for (i, m) in methods.iter().enumerate() {
        let about = m.description.as_deref().unwrap_or_default();
        eprintln!("  {}. {} [{}] {about}", i + 1, m.name, m.kind.as_str());
    }
    eprint!("method (1-{}): ", methods.len());
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    line.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| methods.get(n.wrapping_sub(1)))
        .cloned()
        .ok_or_else(|| usage(format!("no method `{}`", line.trim())))
}

fn usage(message: String) -> anyhow::Error {
    CliError::BadArgument(message).into()
}

/// A failure with the exit code the daemon's `code` has.
fn refusal(code: &str, message: String) -> anyhow::Error {
    CliError::Daemon {
        code: code.to_string(),
        message,
        details: None,
    }
    .into()
}

/// A variable's value from stdin: without echo when it is a secret and stdin a terminal.
fn read_var(var: &drover_protocol::AuthVar) -> anyhow::Result<String> {
    let label = var.label.as_deref().unwrap_or(&var.name);
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal();
    if terminal {
        eprint!("{label} ({}): ", var.name);
        std::io::stderr().flush()?;
    }
    let hidden = terminal && var.secret;
    let saved = if hidden { echo_off(&stdin) } else { None };
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    if let Some(saved) = saved {
        let _ = nix::sys::termios::tcsetattr(&stdin, nix::sys::termios::SetArg::TCSANOW, &saved);
        eprintln!();
    }
    read.context("cannot read the value")?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

/// Turns the terminal's echo off; returns what to restore.
fn echo_off(stdin: &std::io::Stdin) -> Option<nix::sys::termios::Termios> {
    use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
    let saved = tcgetattr(stdin).ok()?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    tcsetattr(stdin, SetArg::TCSANOW, &quiet).ok()?;
    Some(saved)
}

/// The environment the daemon gives the provider's agents: the allowlisted part of ours plus
/// the provider's own variables.
fn agent_env(provider_env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = drover_acp::process::inherited_env();
    env.extend(provider_env.clone());
    env
}

/// The provider's command, run here.
struct AgentCommand {
    program: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

impl AgentCommand {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).env_clear().envs(&self.env);
        // In the user's home where there is one (else where the CLI runs).
        if let Some(home) = self.env.get("HOME").filter(|h| Path::new(h).is_dir()) {
            command.current_dir(home);
        }
        command
    }

    /// The `terminal` method: the agent's own command with the method's arguments, here, as a
    /// job of the terminal's (a process group of its own, in the foreground while it runs).
    /// When it exits, what it left in its group ends with it, done or failed, as the agent's
    /// group does; what left the group on its own (a browser it opened) stays.
    fn run_terminal_login(&self, method: &AuthMethod) -> anyhow::Result<()> {
        let mut command = self.command();
        command.args(&method.args).envs(&method.env);
        let group = drover_core::child::in_a_job_of_its_own(&mut command);
        let foreground = group == drover_core::child::JobGroup::Foreground;
        let spawned = drover_core::child::spawn_tied(command);
        let status = spawned.and_then(|mut child| {
            if foreground {
                drover_core::child::wait_in_the_foreground(&child);
            } else {
                exited(&child);
            }
            if group.is_its_own() {
                // Before it is reaped: its pid, the group's id, cannot be another's yet.
                drover_acp::process::kill_group_now(child.id(), None, None);
            }
            child.wait()
        });
        if foreground {
            // Also when it did not start: the child gave it the terminal before its `exec`.
            drover_core::child::take_terminal_back();
        }
        let status = status.with_context(|| format!("cannot run {}", self.program))?;
        if status.success() {
            Ok(())
        } else {
            bail!(
                "the sign-in did not succeed ({} {} ended with {status})",
                self.program,
                method.args.join(" ")
            )
        }
    }

    /// Starts the agent speaking ACP on pipes (stderr is the user's).
    fn start(&self) -> anyhow::Result<Acp> {
        let mut command = self.command();
        // A group of its own, so what an npm launcher starts ends with it (see `Drop`).
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Dies with this process; what it starts carries the guard's marker.
        let mut child = drover_core::child::spawn_tied(command)
            .with_context(|| format!("cannot run {}", self.program))?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut acp = Acp {
            child,
            stdin,
            lines,
            next: 1,
            last_init: None,
        };
        acp.request(
            "initialize",
            // Here only a terminal sign-in is served (it runs in this terminal).
            &drover_acp::handshake::initialize_params(&json!({"auth": {"terminal": true}})),
            INITIALIZE_TIMEOUT,
        )?;
        Ok(acp)
    }

    /// What the agent offers in `initialize`.
    fn auth_methods(&self) -> anyhow::Result<Vec<AuthMethod>> {
        let mut acp = self.start()?;
        let init = acp.last_init.take().unwrap_or(Value::Null);
        drop(acp);
        Ok(drover_acp::auth::parse_methods(&init))
    }

    /// `authenticate` with the agent's own method.
    fn authenticate(&self, method: &str) -> anyhow::Result<()> {
        let mut acp = self.start()?;
        acp.request(
            "authenticate",
            &json!({"methodId": method}),
            AUTHENTICATE_TIMEOUT,
        )
        .map(|_| ())
    }
}

/// Waits until `child` exited, leaving it to be reaped (`waitid` with `WNOWAIT`).
fn exited(child: &Child) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    while let Err(nix::errno::Errno::EINTR) =
        waitid(Id::Pid(nix::unistd::Pid::from_raw(pid)), flags)
    {}
}

/// A short ACP conversation with an agent started here; it is killed when dropped.
struct Acp {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    next: u64,
    /// The answer to `initialize`.
    last_init: Option<Value>,
}

impl Acp {
    fn request(
        &mut self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> anyhow::Result<Value> {
        let id = self.next;
        self.next += 1;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{line}").context("the agent closed its input")?;
        self.stdin.flush()?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| anyhow!("the agent did not answer `{method}` within {timeout:?}"))?;
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message.get("id") != Some(&json!(id)) || message.get("method").is_some() {
                continue;
            }
            if let Some(error) = message.get("error") {
                bail!(
                    "the agent answered `{method}` with error {}: {}",
                    error["code"],
                    error["message"].as_str().unwrap_or_default()
                );
            }
            let result = message.get("result").cloned().unwrap_or(Value::Null);
            if method == "initialize" {
                self.last_init = Some(result.clone());
            }
            return Ok(result);
        }
    }
}

impl Drop for Acp {
    /// Ends the agent's whole tree: its process group and its descendants in other groups or
    /// sessions (a launcher's native agent too, not only the launcher); the guard then sweeps
    /// anything carrying the marker that escaped both.
    fn drop(&mut self) {
        drover_acp::process::kill_group_now(self.child.id(), None, None);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
