//! Providers: how an agent is run. Built-in presets for known ACP agents, the `demo` provider
//! (drover's own scripted agent, run by the `drover` binary: no model, no key; see
//! `docs/demo.md`), plus custom providers (or overrides of a preset) from
//! `$DROVER_HOME/config.toml`:
//!
//! ```toml
//! [providers.codex]                       # override a preset's command or environment
//! command = ["/opt/codex-acp/bin/codex-acp"]
//! env = { CODEX_HOME = "/home/me/.codex-drover" }
//!
//! [providers.mine]                        # any ACP agent
//! label = "My agent"
//! command = ["my-agent", "--acp"]
//! env = { MY_AGENT_TOKEN = "…" }
//! model = "big"
//! mode = "default"
//! effort = "high"                        # reasoning effort (`thought_level` option)
//! on_interrupt = "continue"               # a turn a restart cut off continues (default "notify")
//! on_limit = "wait"                       # a usage limit waits for its reset (or "fail", or
//!                                         # { fallback = "other" }: the work goes on there)
//! limit_backoff = "5m"                    # the first wait when the agent gives no reset time
//! warm = 1                                # keep 1 spare process ready (see `crate::warm`)
//!
//! [runtimes]                              # see `RuntimeSettings`
//! idle_timeout = "15m"                    # hibernate a runtime idle this long; 0: never
//! max_live = 8                            # at most this many agent processes at once
//! ```
//!
//! The file's `[notify]` section belongs to the daemon (`drover_daemon`'s `notify` module).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

use drover_core::{OnInterrupt, OnLimit};
use serde::{Deserialize, Serialize};

use crate::process::SpawnSpec;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    pub name: String,
    pub label: String,
    /// Program and arguments.
    pub command: Vec<String>,
    /// Variables set for the agent on top of the allowlisted part of the daemon's environment.
    /// Shown with their values hidden: they often hold keys.
    #[serde(serialize_with = "hide_values")]
    pub env: BTreeMap<String, String>,
    pub default_model: Option<String>,
    pub default_mode: Option<String>,
    /// Reasoning effort (`effort = "high"`): the session's `thought_level` config option.
    pub default_effort: Option<String>,
    /// What to do when the command is missing.
    pub install_hint: String,
    pub builtin: bool,
    /// The sign-in method to use when the agent asks for one (`auth` in `config.toml`).
    pub auth: Option<String>,
    /// How many spare processes of it the daemon keeps started and `initialize`d for the next
    /// start of one of its agents (`warm` in `config.toml`, 0 to [`MAX_WARM`]; see `warm`).
    pub warm: usize,
    /// Sign-in methods (by id) that the preset knows these variables satisfy, for agents
    /// whose methods carry no type (gemini-cli 0.61's `gemini-api-key`).
    #[serde(skip)]
    pub auth_env: Vec<(String, Vec<String>)>,
    /// What happens to a turn a daemon restart cuts off, for its agents created without a
    /// policy of their own (`on_interrupt`; `None`: `notify`).
    pub on_interrupt: Option<OnInterrupt>,
    /// What happens when a turn hits the provider's usage limit (`on_limit`; `None`: `wait`).
    pub on_limit: Option<OnLimit>,
    /// How long to wait for a usage limit whose reset time the agent did not say, the first
    /// time (`limit_backoff`; `None`: [`DEFAULT_LIMIT_BACKOFF`]); it doubles with each limit
    /// in a row, up to an hour.
    pub limit_backoff: Option<Duration>,
    /// The provider its agents' work goes to when a turn hits this provider's usage limit
    /// (`on_limit = { fallback = "other" }`), for agents created without a policy of their own.
    pub limit_fallback: Option<String>,
}

impl Provider {
    /// How its agent program (`program`, the command's first word resolved) starts in `cwd`:
    /// the inherited environment, the provider's own on top, and `DROVER_AGENT_ID` set to
    /// `marker` when there is one (the marker of everything the process starts).
    pub fn spawn_spec(&self, program: PathBuf, cwd: PathBuf, marker: Option<String>) -> SpawnSpec {
        let mut env = crate::process::inherited_env();
        env.extend(self.env.clone());
        if let Some(marker) = marker {
            env.insert("DROVER_AGENT_ID".to_string(), marker);
        }
        SpawnSpec {
            program,
            args: self.command[1..].to_vec(),
            cwd,
            env,
        }
    }

    /// A provider that runs `command` with `env` and nothing else set: labelled by its name,
    /// not built in, no defaults, no sign-in, no warm spares, no fallback (as a `config.toml`
    /// entry that gives only a command). Set more with struct update syntax.
    pub fn command(name: &str, command: Vec<String>, env: BTreeMap<String, String>) -> Provider {
        Provider {
            name: name.to_string(),
            label: name.to_string(),
            command,
            env,
            default_model: None,
            default_mode: None,
            default_effort: None,
            install_hint: format!("check `command` under [providers.{name}] in config.toml"),
            builtin: false,
            auth: None,
            warm: 0,
            auth_env: Vec::new(),
            on_interrupt: None,
            on_limit: None,
            limit_backoff: None,
            limit_fallback: None,
        }
    }
}

/// The first wait for a usage limit with no reset time, unless `config.toml` says.
pub const DEFAULT_LIMIT_BACKOFF: Duration = Duration::from_secs(5 * 60);

fn hide_values<S: serde::Serializer>(
    env: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(env.keys().map(|k| (k, "<set>")))
}

/// Whether a provider's command can be run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Availability {
    Available { path: PathBuf },
    Unavailable { reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{}` is not valid: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    /// The file cannot be written (a link into a read-only folder, a full disk); `message`
    /// names it and says what to put there instead.
    #[error("{message}")]
    Write { path: PathBuf, message: String },
}

/// The providers of a running daemon. `config.toml` is read again whenever it changed (its
/// modification time or size), so an edit takes effect at the next use, without a restart.
#[derive(Debug)]
pub struct LiveProviders {
    path: PathBuf,
    home: PathBuf,
    current: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    /// What `config.toml` looked like when `providers` was read from it (`None`: no file).
    stamp: Option<(SystemTime, u64)>,
    providers: Arc<Providers>,
}

impl LiveProviders {
    /// `providers` as loaded from `home`'s `config.toml` just now.
    pub fn new(home: &Path, providers: Providers) -> LiveProviders {
        let path = home.join("config.toml");
        LiveProviders {
            current: Mutex::new(Loaded {
                stamp: stamp(&path),
                providers: Arc::new(providers),
            }),
            path,
            home: home.to_path_buf(),
        }
    }

    /// The providers as `config.toml` says now. A file that changed and no longer reads is
    /// an error naming it (and the line), until it is fixed.
    pub fn current(&self) -> Result<Arc<Providers>, ConfigError> {
        let now = stamp(&self.path);
        let mut loaded = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if now != loaded.stamp {
            let providers = Providers::load(&self.home)?;
            tracing::info!(path = %self.path.display(), "providers reloaded");
            *loaded = Loaded {
                stamp: now,
                providers: Arc::new(providers),
            };
        }
        Ok(loaded.providers.clone())
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    providers: BTreeMap<String, ProviderEntry>,
    #[serde(default)]
    runtimes: RuntimesEntry,
    /// Notifications: the daemon's to read (`drover_daemon::notify`), left alone here.
    #[serde(default, rename = "notify")]
    _notify: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuntimesEntry {
    idle_timeout: Option<DurationEntry>,
    max_live: Option<i64>,
}

/// A duration as written in `config.toml`: seconds (`900`) or text (`"15m"`, `"1h 30m"`,
/// `"500ms"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum DurationEntry {
    Seconds(i64),
    Text(String),
}

impl DurationEntry {
    /// The duration it says when that is more than zero (`None`: it is not one, or is zero).
    pub fn positive(&self) -> Option<Duration> {
        let parsed = match self {
            DurationEntry::Seconds(s) => u64::try_from(*s).ok().map(Duration::from_secs),
            DurationEntry::Text(text) => text
                .trim()
                .parse::<jiff::SignedDuration>()
                .ok()
                .and_then(|d| Duration::try_from(d).ok()),
        };
        parsed.filter(|d| !d.is_zero())
    }
}

/// How long a runtime may stay idle before it hibernates, unless `config.toml` says.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The `[runtimes]` section of `config.toml`: when idle runtimes hibernate and how many may
/// be live at once. Read again with the providers when the file changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeSettings {
    /// A runtime idle this long is closed (its record stays); `None`: never (`0`).
    pub idle_timeout: Option<Duration>,
    /// At most this many agent processes at once; `None`: no ceiling.
    pub max_live: Option<usize>,
}

impl Default for RuntimeSettings {
    fn default() -> RuntimeSettings {
        RuntimeSettings {
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            max_live: None,
        }
    }
}

impl RuntimesEntry {
    fn settings(
        self,
        invalid: impl Fn(String) -> ConfigError,
    ) -> Result<RuntimeSettings, ConfigError> {
        let idle_timeout = match self.idle_timeout {
            None => Some(DEFAULT_IDLE_TIMEOUT),
            Some(DurationEntry::Seconds(s)) => match u64::try_from(s) {
                Ok(0) => None,
                Ok(s) => Some(Duration::from_secs(s)),
                Err(_) => {
                    return Err(invalid(format!(
                        "[runtimes] `idle_timeout` = {s}: give seconds (0 or more) or a duration such as \"15m\""
                    )));
                }
            },
            Some(DurationEntry::Text(text)) => {
                let parsed = text
                    .trim()
                    .parse::<jiff::SignedDuration>()
                    .ok()
                    .and_then(|d| Duration::try_from(d).ok());
                match parsed {
                    Some(d) if d.is_zero() => None,
                    Some(d) => Some(d),
                    None if text.trim() == "0" => None,
                    None => {
                        return Err(invalid(format!(
                            "[runtimes] `idle_timeout` = {text:?}: not a duration (write e.g. \"15m\", \"1h 30m\", \"90s\", or 0 for never)"
                        )));
                    }
                }
            }
        };
        let max_live = match self.max_live {
            None => None,
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Some(n) => {
                return Err(invalid(format!(
                    "[runtimes] `max_live` = {n}: at least 1 (leave it out for no ceiling)"
                )));
            }
        };
        Ok(RuntimeSettings {
            idle_timeout,
            max_live,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    label: Option<String>,
    command: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    model: Option<String>,
    mode: Option<String>,
    effort: Option<String>,
    auth: Option<String>,
    on_interrupt: Option<OnInterrupt>,
    on_limit: Option<OnLimitEntry>,
    limit_backoff: Option<DurationEntry>,
    warm: Option<i64>,
}

/// `on_limit` as written: a policy, or the provider the work falls back to. A value that is
/// neither says which ones there are (serde's own words name this type).
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "`on_limit` is \"wait\", \"fail\" or { fallback = \"PROVIDER\" }"
)]
enum OnLimitEntry {
    Policy(OnLimit),
    Fallback { fallback: String },
}

impl OnLimitEntry {
    /// The policy and the fallback provider, as `Provider` keeps them.
    fn split(self) -> (Option<OnLimit>, Option<String>) {
        match self {
            OnLimitEntry::Policy(policy) => (Some(policy), None),
            OnLimitEntry::Fallback { fallback } => (None, Some(fallback)),
        }
    }
}

/// A `limit_backoff` as written: more than zero.
fn limit_backoff(
    name: &str,
    entry: Option<DurationEntry>,
    invalid: impl Fn(String) -> ConfigError,
) -> Result<Option<Duration>, ConfigError> {
    let Some(entry) = entry else {
        return Ok(None);
    };
    match entry.positive() {
        Some(d) => Ok(Some(d)),
        None => Err(invalid(format!(
            "[providers.{name}] `limit_backoff`: a duration such as \"5m\" or seconds, more than 0"
        ))),
    }
}

/// Every provider the daemon knows, by name.
#[derive(Debug, Clone)]
pub struct Providers {
    by_name: BTreeMap<String, Provider>,
    /// The PATH used to find commands (the daemon's, or the provider's own `PATH` variable).
    path_var: Option<String>,
    /// The `[runtimes]` section of the same file.
    runtimes: RuntimeSettings,
}

/// The most spare processes a provider may keep (`warm`): each is a whole agent process.
pub const MAX_WARM: usize = 4;

/// The provider that runs drover's own scripted agent: always there, with no model and no key.
pub const DEMO_PROVIDER: &str = "demo";

/// The program whose `demo-agent` subcommand is the demo agent (see [`set_demo_program`]).
static DEMO_PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Names the program that runs the demo agent as `PROGRAM demo-agent`: the `drover` binary
/// names itself when it starts. Without it (drover embedded in another program, such as a
/// test) the demo's command is `drover demo-agent`, found on `PATH`.
pub fn set_demo_program(program: PathBuf) {
    // A binary replaced while it runs reads as `… (deleted)`; the new one is at the path.
    let program = match program.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        Some(path) => PathBuf::from(path),
        None => program,
    };
    let _ = DEMO_PROGRAM.set(program);
}

fn demo() -> Provider {
    let program = DEMO_PROGRAM
        .get()
        .map_or_else(|| "drover".to_string(), |p| p.display().to_string());
    preset(
        DEMO_PROVIDER,
        "demo — scripted, no model",
        &[&program, "demo-agent"],
        "the demo agent is part of the `drover` binary: run the daemon with `drover daemon`",
    )
}

fn preset(name: &str, label: &str, command: &[&str], hint: &str) -> Provider {
    Provider {
        label: label.to_string(),
        install_hint: hint.to_string(),
        builtin: true,
        ..Provider::command(
            name,
            command.iter().map(ToString::to_string).collect(),
            BTreeMap::new(),
        )
    }
}

impl Providers {
    /// The built-in presets.
    pub fn presets() -> Providers {
        let list = [
            preset(
                "codex",
                "Codex",
                &["codex-acp"],
                "install it with `npm install -g @zed-industries/codex-acp`, or set `command` under [providers.codex] in config.toml",
            ),
            preset(
                "claude",
                "Claude Code",
                &["claude-agent-acp"],
                "install it with `npm install -g @zed-industries/claude-agent-acp`, or set `command` under [providers.claude] in config.toml",
            ),
            Provider {
                auth_env: vec![(
                    "gemini-api-key".to_string(),
                    vec!["GEMINI_API_KEY".to_string()],
                )],
                ..preset(
                    "gemini",
                    "Gemini CLI",
                    &["gemini", "--acp"],
                    "install it with `npm install -g @google/gemini-cli`, or set `command` under [providers.gemini] in config.toml",
                )
            },
            preset(
                "opencode",
                "OpenCode",
                &["opencode", "acp"],
                "install it with `npm install -g opencode-ai`, or set `command` under [providers.opencode] in config.toml",
            ),
            preset(
                "qwen",
                "Qwen Code",
                &["qwen", "--acp"],
                "install it with `npm install -g @qwen-code/qwen-code`, or set `command` under [providers.qwen] in config.toml",
            ),
            preset(
                "copilot",
                "GitHub Copilot",
                &["copilot", "--acp"],
                "install it with `npm install -g @github/copilot`, or set `command` under [providers.copilot] in config.toml",
            ),
            demo(),
        ];
        Providers {
            by_name: list.into_iter().map(|p| (p.name.clone(), p)).collect(),
            path_var: crate::process::inherited_env().remove("PATH"),
            runtimes: RuntimeSettings::default(),
        }
    }

    /// The presets with `$DROVER_HOME/config.toml` applied (a missing file is fine). The demo
    /// agent keeps its sessions in `$DROVER_HOME/demo-agent` unless the file says otherwise.
    pub fn load(home: &Path) -> Result<Providers, ConfigError> {
        let path = home.join("config.toml");
        let mut presets = Self::presets();
        if let Some(demo) = presets.by_name.get_mut(DEMO_PROVIDER) {
            demo.env.insert(
                "SCRIPTED_AGENT_STATE_DIR".to_string(),
                home.join("demo-agent").display().to_string(),
            );
        }
        match std::fs::read_to_string(&path) {
            Ok(text) => presets.with_config(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(presets),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    fn with_config(mut self, path: &Path, text: &str) -> Result<Providers, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: ConfigFile =
            toml::from_str(text).map_err(|e| invalid(located(text, e.span(), e.message())))?;
        self.runtimes = file.runtimes.settings(invalid)?;
        for (name, entry) in file.providers {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(format!(
                    "provider name `{name}`: use letters, digits, `-` and `_`"
                )));
            }
            if let Some(command) = &entry.command
                && command.first().is_none_or(|c| c.trim().is_empty())
            {
                return Err(invalid(format!(
                    "[providers.{name}] `command` must name a program"
                )));
            }
            let warm = match entry.warm {
                None => None,
                Some(n) => Some(
                    usize::try_from(n)
                        .ok()
                        .filter(|n| *n <= MAX_WARM)
                        .ok_or_else(|| {
                            invalid(format!(
                                "[providers.{name}] `warm` = {n}: from 0 to {MAX_WARM} spare processes"
                            ))
                        })?,
                ),
            };
            let provider = if let Some(mut preset) = self.by_name.remove(&name) {
                if let Some(command) = entry.command {
                    preset.command = command;
                }
                preset.env.extend(entry.env);
                preset.label = entry.label.unwrap_or(preset.label);
                preset.default_model = entry.model.or(preset.default_model);
                preset.default_mode = entry.mode.or(preset.default_mode);
                preset.default_effort = entry.effort.or(preset.default_effort);
                preset.auth = entry.auth.or(preset.auth);
                preset.on_interrupt = entry.on_interrupt.or(preset.on_interrupt);
                if let Some(on_limit) = entry.on_limit {
                    (preset.on_limit, preset.limit_fallback) = on_limit.split();
                }
                preset.limit_backoff =
                    limit_backoff(&name, entry.limit_backoff, invalid)?.or(preset.limit_backoff);
                preset.warm = warm.unwrap_or(preset.warm);
                preset
            } else {
                let (on_limit, limit_fallback) =
                    entry.on_limit.map(OnLimitEntry::split).unwrap_or_default();
                let command = entry
                    .command
                    .ok_or_else(|| invalid(format!("[providers.{name}] needs a `command`")))?;
                Provider {
                    label: entry.label.unwrap_or_else(|| name.clone()),
                    default_model: entry.model,
                    default_mode: entry.mode,
                    default_effort: entry.effort,
                    install_hint: format!(
                        "check `command` under [providers.{name}] in {}",
                        path.display()
                    ),
                    auth: entry.auth,
                    warm: warm.unwrap_or(0),
                    on_interrupt: entry.on_interrupt,
                    on_limit,
                    limit_backoff: limit_backoff(&name, entry.limit_backoff, invalid)?,
                    limit_fallback,
                    ..Provider::command(&name, command, entry.env)
                }
            };
            self.by_name.insert(name, provider);
        }
        for provider in self.by_name.values() {
            if let Some(fallback) = &provider.limit_fallback
                && (fallback == &provider.name || !self.by_name.contains_key(fallback))
            {
                return Err(invalid(format!(
                    "[providers.{}] `on_limit = {{ fallback = \"{fallback}\" }}`: name another provider",
                    provider.name
                )));
            }
        }
        Ok(self)
    }

    /// When idle runtimes hibernate and how many may be live (`[runtimes]`).
    pub fn runtime_settings(&self) -> RuntimeSettings {
        self.runtimes
    }

    /// Replaces the `[runtimes]` settings (for embedding and benchmarks).
    pub fn set_runtime_settings(&mut self, settings: RuntimeSettings) {
        self.runtimes = settings;
    }

    /// Finds providers' programs on `path` instead of the daemon's `PATH` (for embedding and
    /// tests that must not depend on what the machine has installed).
    pub fn set_search_path(&mut self, path: &str) {
        self.path_var = Some(path.to_string());
    }

    /// Adds or replaces a provider (for embedding and tests).
    pub fn insert(&mut self, provider: Provider) {
        self.by_name.insert(provider.name.clone(), provider);
    }

    pub fn get(&self, name: &str) -> Option<&Provider> {
        self.by_name.get(name)
    }

    pub fn all(&self) -> impl Iterator<Item = &Provider> {
        self.by_name.values()
    }

    /// Finds the provider's program: an absolute or relative path as given, else on PATH (the
    /// provider's own `PATH` if it sets one).
    pub fn availability(&self, provider: &Provider) -> Availability {
        let Some(program) = provider.command.first() else {
            return Availability::Unavailable {
                reason: format!("provider `{}` has no command", provider.name),
            };
        };
        let path_var = provider
            .env
            .get("PATH")
            .cloned()
            .or_else(|| self.path_var.clone());
        match resolve(program, path_var.as_deref()) {
            Some(path) => Availability::Available { path },
            None => Availability::Unavailable {
                reason: format!(
                    "`{program}` was not found (provider `{}`): {}",
                    provider.name, provider.install_hint
                ),
            },
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn resolve(program: &str, path_var: Option<&str>) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return is_executable(&path).then_some(path);
    }
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

/// A TOML error as `line L, column C: message`, without the line itself: `config.toml` holds
/// API keys, and what a parse error says goes to timelines, logs and clients.
pub fn located(text: &str, span: Option<std::ops::Range<usize>>, message: &str) -> String {
    let message = message.trim();
    let Some(start) = span.map(|s| s.start.min(text.len())) else {
        return message.to_string();
    };
    let before = text.get(..start).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_names_the_place_and_never_shows_the_key() {
        let text = "[providers.codex]\nenv = { OPENAI_API_KEY = \"sk-secret-123 }\n";
        let Err(e) = Providers::presets().with_config(Path::new("/h/config.toml"), text) else {
            panic!("an unterminated string parses");
        };
        let said = e.to_string();
        assert!(!said.contains("sk-secret"), "{said}");
        assert!(said.contains("line 2, column"), "{said}");
        let home = tempfile::TempDir::new().expect("home");
        std::fs::write(home.path().join("config.toml"), text).expect("config");
        let entry = SignInEntry::Auth("x".to_string());
        let Err(e) = store_sign_in(home.path(), "codex", &entry) else {
            panic!("an unterminated string is edited");
        };
        assert!(!e.to_string().contains("sk-secret"), "{e}");
    }

    #[test]
    fn sign_ins_written_at_the_same_time_keep_every_key() {
        let home = tempfile::TempDir::new().expect("home");
        let writers = 8;
        let rounds = 4;
        let barrier = Arc::new(std::sync::Barrier::new(writers));
        let threads: Vec<_> = (0..writers)
            .map(|w| {
                let (home, barrier) = (home.path().to_path_buf(), barrier.clone());
                std::thread::spawn(move || {
                    for r in 0..rounds {
                        barrier.wait();
                        let vars = BTreeMap::from([(format!("KEY_{w}_{r}"), format!("v{w}{r}"))]);
                        store_sign_in(&home, "codex", &SignInEntry::Env(vars)).expect("stored");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer");
        }
        let text = std::fs::read_to_string(home.path().join("config.toml")).expect("config");
        let codex = Providers::load(home.path()).expect("reads");
        let env = &codex.get("codex").expect("codex").env;
        let lost: Vec<String> = (0..writers)
            .flat_map(|w| (0..rounds).map(move |r| format!("KEY_{w}_{r}")))
            .filter(|k| !env.contains_key(k))
            .collect();
        assert!(lost.is_empty(), "keys lost: {lost:?}\n{text}");
    }

    #[test]
    fn a_sign_in_writes_through_a_symlinked_config_and_keeps_the_link() {
        let root = tempfile::TempDir::new().expect("root");
        let (home, dotfiles) = (root.path().join("home"), root.path().join("dotfiles"));
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&dotfiles).expect("dotfiles");
        let mine = "# kept in my dotfiles\n[runtimes]\nidle_timeout = \"1h\"\n";
        std::fs::write(dotfiles.join("drover.toml"), mine).expect("target");
        // A relative link, through a second link, as dotfile managers make them.
        std::os::unix::fs::symlink("../dotfiles/drover.toml", dotfiles.join("current.toml"))
            .expect("link");
        std::os::unix::fs::symlink("../dotfiles/current.toml", home.join("config.toml"))
            .expect("link");
        store_sign_in(&home, "codex", &SignInEntry::Auth("chatgpt".to_string())).expect("stored");
        let link = std::fs::symlink_metadata(home.join("config.toml")).expect("link");
        assert!(link.file_type().is_symlink(), "the link was replaced");
        let text = std::fs::read_to_string(dotfiles.join("drover.toml")).expect("target");
        assert!(text.starts_with(mine), "{text}");
        assert!(text.contains("auth = \"chatgpt\""), "{text}");
        let mode = std::fs::metadata(dotfiles.join("drover.toml")).expect("target");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let left: Vec<_> = std::fs::read_dir(&dotfiles)
            .expect("dotfiles")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 2, "no temp file left: {left:?}");

        // A link to a file not made yet: the file is made where the link points.
        std::fs::remove_file(home.join("config.toml")).expect("unlink");
        std::os::unix::fs::symlink("../dotfiles/new.toml", home.join("config.toml")).expect("link");
        store_sign_in(&home, "codex", &SignInEntry::Auth("chatgpt".to_string())).expect("stored");
        assert!(
            std::fs::symlink_metadata(home.join("config.toml"))
                .expect("link")
                .file_type()
                .is_symlink()
        );
        let made = std::fs::read_to_string(dotfiles.join("new.toml")).expect("made");
        assert!(made.contains("auth = \"chatgpt\""), "{made}");
    }

    #[test]
    fn a_sign_in_into_a_folder_that_cannot_be_written_names_the_file_and_what_to_put_there() {
        let home = tempfile::TempDir::new().expect("home");
        // No file can be made in /proc, root or not: a read-only folder (a home-manager link
        // into /nix/store).
        let target = Path::new("/proc/drover-test-config.toml");
        std::os::unix::fs::symlink(target, home.path().join("config.toml")).expect("link");
        let vars = BTreeMap::from([("OPENAI_API_KEY".to_string(), "sk-secret".to_string())]);
        let error =
            store_sign_in(home.path(), "codex", &SignInEntry::Env(vars)).expect_err("not writable");
        let message = error.to_string();
        assert!(matches!(error, ConfigError::Write { .. }), "{error:?}");
        assert!(
            message.contains("`/proc/drover-test-config.toml`")
                && message.contains("config.toml` leads")
                && message.contains("OPENAI_API_KEY under [providers.codex]"),
            "{message}"
        );
        assert!(!message.contains("sk-secret"), "{message}");
        assert_eq!(
            crate::AcpError::from(error).code(),
            drover_core::error::ErrorCode::StoreFailed
        );
    }

    #[test]
    fn unattended_policies_read_and_a_fallback_names_another_provider() {
        let text = r#"
            [providers.codex]
            on_interrupt = "continue"
            on_limit = "fail"
            limit_backoff = "90s"

            [providers.mine]
            command = ["/bin/sh"]
            limit_backoff = 30
        "#;
        let p = Providers::presets()
            .with_config(Path::new("/h/config.toml"), text)
            .expect("valid");
        let codex = p.get("codex").expect("codex");
        assert_eq!(codex.on_interrupt, Some(OnInterrupt::Continue));
        assert_eq!(codex.on_limit, Some(OnLimit::Fail));
        assert_eq!(codex.limit_backoff, Some(Duration::from_secs(90)));
        let mine = p.get("mine").expect("mine");
        assert_eq!(mine.limit_backoff, Some(Duration::from_secs(30)));
        assert_eq!((mine.on_interrupt, mine.on_limit), (None, None));
        let p = Providers::presets()
            .with_config(
                Path::new("/h/config.toml"),
                "[providers.codex]\non_limit = { fallback = \"claude\" }\n",
            )
            .expect("a fallback to another provider");
        let codex = p.get("codex").expect("codex");
        assert_eq!(
            (codex.on_limit, codex.limit_fallback.as_deref()),
            (None, Some("claude"))
        );
        for bad in [
            "[providers.codex]\non_limit = { fallback = \"codex\" }\n",
            "[providers.codex]\non_limit = { fallback = \"nobody\" }\n",
            "[providers.codex]\non_limit = { wait = \"claude\" }\n",
            "[providers.codex]\non_interrupt = \"retry\"\n",
            "[providers.codex]\nlimit_backoff = \"0s\"\n",
        ] {
            let read = Providers::presets().with_config(Path::new("/h/config.toml"), bad);
            assert!(read.is_err(), "{bad}");
        }
        // A value that is no policy names the ones there are, not serde's type.
        let Err(e) = Providers::presets().with_config(
            Path::new("/h/config.toml"),
            "[providers.codex]\non_limit = \"retry\"\n",
        ) else {
            panic!("on_limit = \"retry\" is read");
        };
        let said = e.to_string();
        assert!(
            said.contains("line 2")
                && said.contains(r#""wait", "fail" or { fallback = "PROVIDER" }"#)
                && !said.contains("OnLimitEntry"),
            "{said}"
        );
    }

    #[test]
    fn warm_is_read_per_provider_and_defaults_to_none() {
        let text = "[providers.codex]\nwarm = 2\n[providers.mine]\ncommand = [\"m\"]\n";
        let p = Providers::presets()
            .with_config(Path::new("/h/config.toml"), text)
            .expect("valid");
        assert_eq!(p.get("codex").map(|c| c.warm), Some(2));
        assert_eq!(p.get("mine").map(|c| c.warm), Some(0));
        assert_eq!(p.get("claude").map(|c| c.warm), Some(0));
    }

    #[test]
    fn config_overrides_presets_and_adds_providers() {
        let text = r#"
            [providers.codex]
            command = ["/opt/codex"]
            env = { CODEX_HOME = "/x" }

            [providers.mine]
            label = "Mine"
            command = ["/bin/sh", "-c", "exit 0"]
            model = "big"
        "#;
        let p = Providers::presets()
            .with_config(Path::new("/h/config.toml"), text)
            .expect("valid");
        let codex = p.get("codex").expect("codex");
        assert_eq!(codex.command, vec!["/opt/codex"]);
        assert_eq!(codex.env["CODEX_HOME"], "/x");
        assert!(codex.builtin);
        let mine = p.get("mine").expect("mine");
        assert_eq!(mine.default_model.as_deref(), Some("big"));
        assert!(matches!(
            p.availability(mine),
            Availability::Available { .. }
        ));
        match p.availability(codex) {
            Availability::Unavailable { reason } => {
                assert!(reason.contains("/opt/codex"), "{reason}");
            }
            other @ Availability::Available { .. } => panic!("{other:?}"),
        }
    }

    #[test]
    fn runtimes_section_reads_durations_and_the_ceiling() {
        let read = |text: &str| {
            Providers::presets()
                .with_config(Path::new("/h/config.toml"), text)
                .map(|p| p.runtime_settings())
        };
        assert_eq!(
            read("").expect("empty").idle_timeout,
            Some(DEFAULT_IDLE_TIMEOUT)
        );
        assert_eq!(read("").expect("empty").max_live, None);
        for (text, want) in [
            (
                "[runtimes]\nidle_timeout = \"15m\"",
                Some(Duration::from_secs(900)),
            ),
            (
                "[runtimes]\nidle_timeout = \"1h 30m\"",
                Some(Duration::from_secs(5400)),
            ),
            (
                "[runtimes]\nidle_timeout = \"500ms\"",
                Some(Duration::from_millis(500)),
            ),
            (
                "[runtimes]\nidle_timeout = 90",
                Some(Duration::from_secs(90)),
            ),
            ("[runtimes]\nidle_timeout = 0", None),
            ("[runtimes]\nidle_timeout = \"0\"", None),
        ] {
            assert_eq!(read(text).expect(text).idle_timeout, want, "{text}");
        }
        assert_eq!(
            read("[runtimes]\nmax_live = 3").expect("3").max_live,
            Some(3)
        );
    }

    #[test]
    fn bad_config_names_the_file_and_the_problem() {
        for (text, needle) in [
            ("[providers.x]\nlabel = \"no command\"", "needs a `command`"),
            ("[providers.x]\ncommand = []", "must name a program"),
            ("[providers.x]\ncommand = [\"a\"]\ncomand = 1", "comand"),
            ("[providers.\"a b\"]\ncommand = [\"a\"]", "provider name"),
            (
                "[runtimes]\nidle_timeout = \"soon\"",
                "`idle_timeout` = \"soon\"",
            ),
            ("[runtimes]\nidle_timeout = -5", "`idle_timeout` = -5"),
            ("[runtimes]\nmax_live = 0", "`max_live` = 0"),
            ("[runtimes]\nidle = 1", "idle"),
            (
                "[providers.codex]\nwarm = 5",
                "[providers.codex] `warm` = 5",
            ),
            ("[providers.codex]\nwarm = -1", "`warm` = -1"),
        ] {
            let err = Providers::presets()
                .with_config(Path::new("/h/config.toml"), text)
                .expect_err(text)
                .to_string();
            assert!(
                err.contains("/h/config.toml") && err.contains(needle),
                "{err}"
            );
        }
    }
}

/// A sign-in to keep in a provider's entry of `config.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignInEntry {
    /// Variables for its `env` (an `env_var` method's key).
    Env(BTreeMap<String, String>),
    /// The method its agents are asked to `authenticate` with (`auth`).
    Auth(String),
}

/// Writes `entry` into `[providers.<provider>]` of `home`'s `config.toml`, keeping every other
/// line, comment and key of the file as it was; the file is written atomically and private
/// (0600). The daemon reads it again at the next start of an agent.
///
/// Writers take turns (`config.toml.lock` in `home`, an advisory lock): two sign-ins at the
/// same moment each read what the other wrote, so neither key is lost. A `config.toml` that is
/// a symbolic link (dotfiles kept in a repository) keeps its link: the file it points to is
/// the one replaced, atomically, in its own folder.
pub fn store_sign_in(home: &Path, provider: &str, entry: &SignInEntry) -> Result<(), ConfigError> {
    use toml_edit::{DocumentMut, InlineTable, Item, Table, value};
    let path = home.join("config.toml");
    let _turn = config_write_lock(home)?;
    let target = link_target(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let text = match std::fs::read_to_string(&target) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => return Err(ConfigError::Read { path, source }),
    };
    let invalid = |message: String| ConfigError::Invalid {
        path: path.clone(),
        message,
    };
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| invalid(located(&text, e.span(), e.message())))?;
    let providers = doc
        .entry("providers")
        .or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(true);
            Item::Table(t)
        })
        .as_table_mut()
        .ok_or_else(|| invalid("`providers` is not a table".to_string()))?;
    let table = providers
        .entry(provider)
        .or_insert_with(|| Item::Table(Table::new()))
        .as_table_like_mut()
        .ok_or_else(|| invalid(format!("`providers.{provider}` is not a table")))?;
    match entry {
        SignInEntry::Auth(method) => {
            table.insert("auth", value(method.as_str()));
        }
        SignInEntry::Env(vars) => {
            let env = table
                .entry("env")
                .or_insert(Item::Value(InlineTable::new().into()));
            let env = env
                .as_table_like_mut()
                .ok_or_else(|| invalid(format!("`providers.{provider}.env` is not a table")))?;
            for (name, val) in vars {
                env.insert(name, value(val.as_str()));
            }
        }
    }
    let text = doc.to_string();
    // What the daemon will read must read: a write that breaks the file is not made.
    Providers::presets().with_config(&path, &text)?;
    drover_core::store::write_atomic(&target, text.as_bytes())
        .map_err(|e| unwritable(&path, &target, provider, entry, &e))
}

/// A sign-in that cannot be kept: which file, why, and what the user can put there instead
/// (the variables' names, never their values).
fn unwritable(
    path: &Path,
    target: &Path,
    provider: &str,
    entry: &SignInEntry,
    error: &drover_core::store::StoreError,
) -> ConfigError {
    let via = if target == path {
        String::new()
    } else {
        format!(" (where `{}` leads)", path.display())
    };
    let what = match entry {
        SignInEntry::Env(vars) => format!(
            "`env` with {}",
            vars.keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        SignInEntry::Auth(method) => format!("`auth = \"{method}\"`"),
    };
    ConfigError::Write {
        path: target.to_path_buf(),
        message: format!(
            "cannot keep the sign-in: `{}`{via} cannot be written ({error}); put it there \
             yourself ({what} under [providers.{provider}]) and retry the agents that wait \
             for it (`drover retry`), or make the file writable",
            target.display()
        ),
    }
}

/// Held while `config.toml` is read, edited and written: one writer at a time, across threads
/// and processes (released when dropped, or by the kernel if the writer dies).
fn config_write_lock(home: &Path) -> Result<std::fs::File, ConfigError> {
    let path = home.join("config.toml.lock");
    let io = |source| ConfigError::Read {
        path: path.clone(),
        source,
    };
    let file = drover_core::private::open_options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    file.lock().map_err(io)?;
    Ok(file)
}

/// The file `path` stands for: itself, or where its symbolic links lead (relative links from
/// the link's folder), followed as the kernel would, to a file that may not exist yet.
fn link_target(path: &Path) -> std::io::Result<PathBuf> {
    // The kernel's own limit on links followed (ELOOP).
    const MAX_LINKS: usize = 40;
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let next = std::fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) => dir.join(next),
                    None => next,
                };
            }
            Ok(_) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(path),
            Err(e) => return Err(e),
        }
    }
    Err(nix::errno::Errno::ELOOP.into())
}
