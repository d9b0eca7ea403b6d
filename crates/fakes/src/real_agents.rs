//! How to run the real coding agents (codex-acp, claude-agent-acp, gemini-cli) against the
//! scripted model of [`crate::model`] on loopback.
//!
//! `scripts/install-agents` installs pinned versions under `$DROVER_AGENTS_DIR` (default
//! `<repo>/.agents`). For each agent, [`RealAgent::command`] writes the agent's private config
//! into a scratch folder and returns the real entry point (never an npm wrapper, which would
//! outlive a signal) with its whole environment: nothing is inherited from the caller but
//! `PATH`. See `agents-offline.md` in the design notes for why each setting is there.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::acp_client::{AgentCommand, ClientOptions};

/// The environment variable codex reads its (meaningless) API key from.
const CODEX_KEY_VAR: &str = "DROVER_MODEL_KEY";

/// A model slug codex knows: an unknown one adds a warning to every turn and drops `apply_patch`.
const CODEX_MODEL: &str = "gpt-5.3-codex";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RealAgent {
    Codex,
    Claude,
    Gemini,
}

#[derive(Debug, thiserror::Error)]
pub enum RealAgentError {
    #[error(
        "{agent} is not installed: {} is missing; run scripts/install-agents \
         (or set DROVER_AGENTS_DIR to where it installed them)",
        path.display()
    )]
    NotInstalled { agent: &'static str, path: PathBuf },
    #[error("`{program}` is not on PATH")]
    NotOnPath { program: &'static str },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl RealAgent {
    pub const ALL: [RealAgent; 3] = [RealAgent::Codex, RealAgent::Claude, RealAgent::Gemini];

    pub fn name(self) -> &'static str {
        match self {
            RealAgent::Codex => "codex",
            RealAgent::Claude => "claude",
            RealAgent::Gemini => "gemini",
        }
    }

    /// The file that is the agent: a native binary for codex, a JS entry for the others.
    pub fn entry_point(self, agents_dir: &Path) -> PathBuf {
        let modules = agents_dir.join("node_modules");
        match self {
            RealAgent::Codex => modules.join("@zed-industries/codex-acp-linux-x64/bin/codex-acp"),
            RealAgent::Claude => modules.join("@zed-industries/claude-agent-acp/dist/index.js"),
            RealAgent::Gemini => modules.join("@google/gemini-cli/bundle/gemini.js"),
        }
    }

    /// Fails, naming `scripts/install-agents`, when the agent is not installed.
    pub fn require_installed(self, agents_dir: &Path) -> Result<PathBuf, RealAgentError> {
        let path = self.entry_point(agents_dir);
        if path.is_file() {
            Ok(path)
        } else {
            Err(RealAgentError::NotInstalled {
                agent: self.name(),
                path,
            })
        }
    }

    /// ACP client options that suit the agent: gemini gets no `fs` capabilities.
    pub fn client_options(self) -> ClientOptions {
        ClientOptions {
            fs: self != RealAgent::Gemini,
            ..ClientOptions::default()
        }
    }

    /// Writes the agent's config under `scratch` (a private folder) and returns how to run it
    /// in `cwd` against the model at `model_url` (`http://127.0.0.1:PORT`).
    pub fn command(
        self,
        agents_dir: &Path,
        model_url: &str,
        scratch: &Path,
        cwd: &Path,
    ) -> Result<AgentCommand, RealAgentError> {
        match self {
            RealAgent::Codex => codex(agents_dir, model_url, scratch, cwd),
            RealAgent::Claude => claude(agents_dir, model_url, scratch, cwd),
            RealAgent::Gemini => gemini(agents_dir, model_url, scratch, cwd),
        }
    }
}

/// `$DROVER_AGENTS_DIR`, else `<repo>/.agents`.
pub fn agents_dir() -> PathBuf {
    match std::env::var_os("DROVER_AGENTS_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.agents"),
    }
}

/// codex-acp: a private `CODEX_HOME` whose `config.toml` points at the model, asks before
/// running commands (`untrusted`) and trusts `cwd`.
pub fn codex(
    agents_dir: &Path,
    model_url: &str,
    scratch: &Path,
    cwd: &Path,
) -> Result<AgentCommand, RealAgentError> {
    let program = RealAgent::Codex.require_installed(agents_dir)?;
    let mut env = base_env(scratch)?;
    let codex_home = scratch.join("codex-home");
    let config = format!(
        "model = {model}\n\
         model_provider = \"scripted\"\n\
         approval_policy = \"untrusted\"\n\
         sandbox_mode = \"danger-full-access\"\n\
         check_for_update_on_startup = false\n\
         \n\
         [analytics]\n\
         enabled = false\n\
         \n\
         [model_providers.scripted]\n\
         name = \"scripted model\"\n\
         base_url = {base_url}\n\
         wire_api = \"responses\"\n\
         env_key = \"{CODEX_KEY_VAR}\"\n\
         request_max_retries = 0\n\
         stream_max_retries = 0\n\
         \n\
         [projects.{cwd}]\n\
         trust_level = \"trusted\"\n",
        model = toml_string(CODEX_MODEL),
        base_url = toml_string(&format!("{model_url}/v1")),
        cwd = toml_string(&cwd.to_string_lossy()),
    );
    write(&codex_home.join("config.toml"), &config)?;
    env.insert("CODEX_HOME".into(), path_string(&codex_home));
    env.insert(CODEX_KEY_VAR.into(), "scripted".into());
    Ok(AgentCommand {
        program,
        args: Vec::new(),
        env,
        cwd: cwd.to_path_buf(),
    })
}

/// claude-agent-acp: the model through `ANTHROPIC_BASE_URL`, and a private `HOME` whose
/// settings make tools ask for permission.
pub fn claude(
    agents_dir: &Path,
    model_url: &str,
    scratch: &Path,
    cwd: &Path,
) -> Result<AgentCommand, RealAgentError> {
    let entry = RealAgent::Claude.require_installed(agents_dir)?;
    let mut env = base_env(scratch)?;
    let home = scratch.join("home");
    write(
        &home.join(".claude/settings.json"),
        &json!({"permissions": {"defaultMode": "default"}}).to_string(),
    )?;
    for (key, value) in [
        ("ANTHROPIC_BASE_URL", model_url),
        ("ANTHROPIC_API_KEY", "scripted"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
    ] {
        env.insert(key.into(), value.into());
    }
    Ok(AgentCommand {
        program: find_on_path("node", &env)?,
        args: vec![path_string(&entry)],
        env,
        cwd: cwd.to_path_buf(),
    })
}

/// gemini-cli `--acp`: the model through `GOOGLE_GEMINI_BASE_URL`, a trusted workspace, no
/// self re-exec, and settings with telemetry, statistics and updates off.
pub fn gemini(
    agents_dir: &Path,
    model_url: &str,
    scratch: &Path,
    cwd: &Path,
) -> Result<AgentCommand, RealAgentError> {
    let entry = RealAgent::Gemini.require_installed(agents_dir)?;
    let mut env = base_env(scratch)?;
    let settings = json!({
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
    });
    write(
        &scratch.join("home/.gemini/settings.json"),
        &serde_json::to_string_pretty(&settings).unwrap_or_default(),
    )?;
    for (key, value) in [
        ("GOOGLE_GEMINI_BASE_URL", model_url),
        ("GEMINI_API_KEY", "scripted"),
        ("GEMINI_CLI_TRUST_WORKSPACE", "true"),
        // Otherwise it re-execs itself and the parent ignores SIGTERM.
        ("GEMINI_CLI_NO_RELAUNCH", "true"),
    ] {
        env.insert(key.into(), value.into());
    }
    Ok(AgentCommand {
        program: find_on_path("node", &env)?,
        args: vec![path_string(&entry), "--acp".into()],
        env,
        cwd: cwd.to_path_buf(),
    })
}

/// What every agent gets: the caller's `PATH`, and a private `HOME` and `TMPDIR` in `scratch`.
fn base_env(scratch: &Path) -> Result<BTreeMap<String, String>, RealAgentError> {
    let home = scratch.join("home");
    let tmp = scratch.join("tmp");
    for dir in [&home, &tmp] {
        std::fs::create_dir_all(dir).map_err(|source| RealAgentError::Write {
            path: dir.clone(),
            source,
        })?;
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let mut env = BTreeMap::from([
        ("PATH".to_string(), path),
        ("HOME".to_string(), path_string(&home)),
        ("TMPDIR".to_string(), path_string(&tmp)),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TERM".to_string(), "dumb".to_string()),
    ]);
    if let Ok(bash) = find_on_path("bash", &env) {
        env.insert("SHELL".into(), path_string(&bash));
    }
    // Where the system keeps its CA certificates, as drover passes them on: without them
    // codex looks for a store on every request (tens of milliseconds a turn).
    for key in ["SSL_CERT_FILE", "SSL_CERT_DIR"] {
        if let Ok(value) = std::env::var(key) {
            env.insert(key.to_string(), value);
        }
    }
    Ok(env)
}

fn find_on_path(
    program: &'static str,
    env: &BTreeMap<String, String>,
) -> Result<PathBuf, RealAgentError> {
    env.get("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(p))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or(RealAgentError::NotOnPath { program })
}

fn write(path: &Path, text: &str) -> Result<(), RealAgentError> {
    let fail = |source| RealAgentError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(fail)?;
    }
    std::fs::write(path, text).map_err(fail)
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            // Writing to a `String` cannot fail.
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A `[providers.<name>]` table of `config.toml` running `command`.
pub fn provider_toml(name: &str, command: &AgentCommand) -> String {
    // A JSON string is a valid TOML basic string.
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut argv = vec![quote(&command.program.display().to_string())];
    argv.extend(command.args.iter().map(|a| quote(a)));
    let env: Vec<String> = command
        .env
        .iter()
        .map(|(k, v)| format!("{} = {}", quote(k), quote(v)))
        .collect();
    format!(
        "[providers.{name}]\ncommand = [{}]\nenv = {{ {} }}\n",
        argv.join(", "),
        env.join(", ")
    )
}
