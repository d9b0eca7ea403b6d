//! `[notify]` in `$DROVER_HOME/config.toml`: the sinks notifications go to, read once at
//! start. A mistake is an error naming the sink and the key, and the daemon does not start.
//!
//! ```toml
//! [notify]
//! web_url = "http://my-laptop:7433"      # links in notifications (default: the daemon's URL)
//!
//! [[notify.sink]]
//! kind = "webhook"                        # or "ntfy", "command"
//! name = "team"                           # default: the kind and its place, e.g. "webhook-1"
//! url = "http://127.0.0.1:9000/hook"
//! secret = "…"                            # signs the body: X-Drover-Signature: sha256=<hex>
//! events = ["finished", "permission"]     # default: every event but `summary` and `test`
//! all = false                             # also watched agents and each subagent's own events
//! limit = 10                              # at most this many per `window`, then one summary
//! window = "1m"
//! timeout = "10s"                         # per attempt (HTTP exchange, or the command's run)
//! retries = 2                             # attempts after the first, 1 s then 2 s apart
//! # command = ["prog", "arg"]             # a command sink's program and arguments, no shell
//! # env = { DISPLAY = ":0" }              # and what it adds to the agents' environment
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use drover_acp::providers::DurationEntry;
use serde::Deserialize;

/// What a notification is about: the protocol's names (`NotifySinkInfo.events`).
pub(crate) use drover_protocol::NotifyEvent as EventKind;

/// The events a sink may ask for, which are also its default.
pub(crate) const SUBSCRIBABLE: [EventKind; 6] = [
    EventKind::Finished,
    EventKind::Failed,
    EventKind::Permission,
    EventKind::AuthRequired,
    EventKind::Interrupted,
    EventKind::Limited,
];

/// The subscribable event named `name`.
fn subscribable(name: &str) -> Option<EventKind> {
    SUBSCRIBABLE.into_iter().find(|k| k.as_str() == name)
}

/// Where a sink sends.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// POST the event's JSON to `url`; with a secret, sign it.
    Webhook { url: String, secret: Option<String> },
    /// POST the message to an ntfy topic URL, with ntfy's headers.
    Ntfy { url: String },
    /// Run `argv` (no shell) with the event's JSON on stdin, with `env` added to the
    /// environment agents get.
    Command {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl Target {
    pub(crate) fn kind(&self) -> drover_protocol::SinkKind {
        match self {
            Target::Webhook { .. } => drover_protocol::SinkKind::Webhook,
            Target::Ntfy { .. } => drover_protocol::SinkKind::Ntfy,
            Target::Command { .. } => drover_protocol::SinkKind::Command,
        }
    }

    /// Where it goes, without what may be secret (an ntfy topic, a path's token, a query, a
    /// command's arguments).
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Webhook { url, .. } | Target::Ntfy { url } => match url.split_once("://") {
                Some((scheme, rest)) => {
                    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
                    let host = host.rsplit('@').next().unwrap_or_default();
                    format!("{scheme}://{host}")
                }
                None => String::new(),
            },
            Target::Command { argv, .. } => argv.first().cloned().unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct SinkConfig {
    pub(crate) name: String,
    pub(crate) target: Target,
    pub(crate) events: BTreeSet<EventKind>,
    pub(crate) all: bool,
    pub(crate) limit: u32,
    pub(crate) window: Duration,
    pub(crate) timeout: Duration,
    pub(crate) retries: u32,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct NotifyConfig {
    pub(crate) sinks: Vec<SinkConfig>,
    /// The web UI's address for links (default: the daemon's own URL).
    pub(crate) web_url: Option<String>,
}

pub(crate) const DEFAULT_LIMIT: u32 = 10;
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(60);
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const DEFAULT_RETRIES: u32 = 2;

#[derive(Debug, Deserialize)]
struct File {
    #[serde(default)]
    notify: Option<NotifyEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyEntry {
    #[serde(default)]
    sink: Vec<SinkEntry>,
    web_url: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SinkEntry {
    kind: String,
    name: Option<String>,
    url: Option<String>,
    secret: Option<String>,
    command: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    events: Option<Vec<String>>,
    all: Option<bool>,
    limit: Option<i64>,
    window: Option<DurationEntry>,
    timeout: Option<DurationEntry>,
    retries: Option<i64>,
}

impl NotifyConfig {
    /// `[notify]` of `home`'s `config.toml` (none: no file, or no section).
    pub(crate) fn load(home: &Path) -> Result<NotifyConfig, String> {
        let path = home.join("config.toml");
        match std::fs::read_to_string(&path) {
            Ok(text) => NotifyConfig::parse(&text)
                .map_err(|e| format!("`{}` is not valid: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NotifyConfig::default()),
            Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
        }
    }

    /// The section from the file's text. Errors never quote the file: it holds secrets.
    pub(crate) fn parse(text: &str) -> Result<NotifyConfig, String> {
        let file: File = toml::from_str(text)
            .map_err(|e| drover_acp::providers::located(text, e.span(), e.message()))?;
        let Some(entry) = file.notify else {
            return Ok(NotifyConfig::default());
        };
        if let Some(url) = &entry.web_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!(
                "[notify] `web_url` = {url:?}: an http:// or https:// address"
            ));
        }
        let mut sinks: Vec<SinkConfig> = Vec::new();
        for (i, sink) in entry.sink.into_iter().enumerate() {
            let sink = sink.check(i + 1)?;
            if sinks.iter().any(|s| s.name == sink.name) {
                return Err(format!(
                    "[[notify.sink]] {}: `name` = {:?} is another sink's name",
                    i + 1,
                    sink.name
                ));
            }
            sinks.push(sink);
        }
        Ok(NotifyConfig {
            sinks,
            web_url: entry.web_url.map(|u| u.trim_end_matches('/').to_string()),
        })
    }
}

impl SinkEntry {
    /// The sink, checked; `n` is its place in the file (from 1), for errors.
    fn check(self, n: usize) -> Result<SinkConfig, String> {
        let at = match &self.name {
            Some(name) => format!("[[notify.sink]] {n} ({name:?})"),
            None => format!("[[notify.sink]] {n}"),
        };
        let only = |key: &str, present: bool, kinds: &str| {
            if present {
                Err(format!(
                    "{at}: `{key}` is for {kinds} sinks, not `{}`",
                    self.kind
                ))
            } else {
                Ok(())
            }
        };
        let url = |url: Option<String>| match url {
            None => Err(format!("{at}: a `{}` sink needs a `url`", self.kind)),
            Some(u) if u.starts_with("http://") && u.len() > "http://".len() => Ok(u),
            Some(u) if u.starts_with("https://") => Err(format!(
                "{at}: `url` = {u:?}: drover sends over plain http:// only; put a local relay in front of an https:// service (see the README)"
            )),
            Some(u) => Err(format!("{at}: `url` = {u:?}: not an http:// address")),
        };
        let target = match self.kind.as_str() {
            "webhook" => {
                only("command", self.command.is_some(), "command")?;
                only("env", self.env.is_some(), "command")?;
                if self.secret.as_deref().is_some_and(str::is_empty) {
                    return Err(format!("{at}: `secret` is empty"));
                }
                Target::Webhook {
                    url: url(self.url)?,
                    secret: self.secret,
                }
            }
            "ntfy" => {
                only("command", self.command.is_some(), "command")?;
                only("env", self.env.is_some(), "command")?;
                only("secret", self.secret.is_some(), "webhook")?;
                let url = url(self.url)?;
                let path = url["http://".len()..].split_once('/').map(|(_, p)| p);
                if path.is_none_or(|p| p.is_empty() || p.ends_with('/') || p.contains(['?', '#'])) {
                    return Err(format!(
                        "{at}: `url` = {url:?}: an ntfy topic's URL, e.g. \"http://ntfy.lan/my-topic\""
                    ));
                }
                Target::Ntfy { url }
            }
            "command" => {
                only("url", self.url.is_some(), "webhook and ntfy")?;
                only("secret", self.secret.is_some(), "webhook")?;
                let argv = self.command.unwrap_or_default();
                if argv.first().is_none_or(|p| p.trim().is_empty()) {
                    return Err(format!(
                        "{at}: a `command` sink needs `command`, the program and its arguments, e.g. [\"notify-send\", \"drover\"]"
                    ));
                }
                Target::Command {
                    argv,
                    env: self.env.unwrap_or_default(),
                }
            }
            other => {
                return Err(format!(
                    "{at}: `kind` = {other:?}: use \"webhook\", \"ntfy\" or \"command\""
                ));
            }
        };
        let events = events(&at, self.events)?;
        let limit = match self.limit {
            None => DEFAULT_LIMIT,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{at}: `limit` = {n}: at least 1"))?,
        };
        let retries = match self.retries {
            None => DEFAULT_RETRIES,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|n| *n <= 10)
                .ok_or_else(|| format!("{at}: `retries` = {n}: from 0 to 10"))?,
        };
        let window = duration(&at, "window", self.window, DEFAULT_WINDOW)?;
        let timeout = duration(&at, "timeout", self.timeout, DEFAULT_TIMEOUT)?;
        Ok(SinkConfig {
            name: self.name.unwrap_or_else(|| format!("{}-{n}", self.kind)),
            target,
            events,
            all: self.all.unwrap_or(false),
            limit,
            window,
            timeout,
            retries,
        })
    }
}

/// The events a sink asks for (default: every one it may).
fn events(at: &str, names: Option<Vec<String>>) -> Result<BTreeSet<EventKind>, String> {
    let Some(names) = names else {
        return Ok(SUBSCRIBABLE.into_iter().collect());
    };
    names
        .iter()
        .map(|name| {
            subscribable(name).ok_or_else(|| {
                let known: Vec<&str> = SUBSCRIBABLE.iter().map(|k| k.as_str()).collect();
                format!(
                    "{at}: `events` names {name:?}: the events are {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

/// A duration as written (seconds, or text such as `"10s"`, `"1m"`), more than zero.
fn duration(
    at: &str,
    key: &str,
    entry: Option<DurationEntry>,
    default: Duration,
) -> Result<Duration, String> {
    let Some(entry) = entry else {
        return Ok(default);
    };
    if let Some(d) = entry.positive() {
        return Ok(d);
    }
    let shown = match entry {
        DurationEntry::Seconds(s) => s.to_string(),
        DurationEntry::Text(t) => format!("{t:?}"),
    };
    Err(format!(
        "{at}: `{key}` = {shown}: give seconds (more than 0) or a duration such as \"10s\" or \"1m\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinks_read_with_their_defaults() {
        let config = NotifyConfig::parse(
            r#"
[providers.x]
command = ["x"]

[notify]
web_url = "http://box:7433/"

[[notify.sink]]
kind = "webhook"
url = "http://127.0.0.1:9/hook?key=s3cret"
secret = "k"

[[notify.sink]]
kind = "ntfy"
name = "phone"
url = "http://user:pw@ntfy.local/my-topic"
events = ["permission", "failed"]
limit = 3
window = "30s"
timeout = 2

[[notify.sink]]
kind = "command"
command = ["notify-send", "drover"]
env = { DISPLAY = ":0" }
all = true
"#,
        )
        .expect("valid");
        assert_eq!(config.web_url.as_deref(), Some("http://box:7433"));
        let [hook, phone, command] = &config.sinks[..] else {
            panic!("{config:?}");
        };
        assert_eq!(hook.name, "webhook-1");
        assert_eq!(hook.target.describe(), "http://127.0.0.1:9");
        assert_eq!(hook.events.len(), SUBSCRIBABLE.len());
        assert_eq!((hook.limit, hook.window), (DEFAULT_LIMIT, DEFAULT_WINDOW));
        assert_eq!(phone.name, "phone");
        assert_eq!(phone.target.describe(), "http://ntfy.local");
        assert_eq!(
            phone.events,
            BTreeSet::from([EventKind::Permission, EventKind::Failed])
        );
        assert_eq!(
            (phone.limit, phone.window, phone.timeout),
            (3, Duration::from_secs(30), Duration::from_secs(2))
        );
        assert_eq!(command.name, "command-3");
        assert!(command.all);
        assert_eq!(command.target.describe(), "notify-send");
        let Target::Command { env, .. } = &command.target else {
            panic!("{command:?}");
        };
        assert_eq!(env.get("DISPLAY").map(String::as_str), Some(":0"));
        assert!(NotifyConfig::parse("").expect("empty").sinks.is_empty());
    }

    #[test]
    fn mistakes_name_the_sink_and_the_key_and_never_quote_a_secret() {
        for (text, needle) in [
            ("[[notify.sink]]\nkind = \"pager\"", "`kind` = \"pager\""),
            ("[[notify.sink]]\nkind = \"webhook\"", "needs a `url`"),
            (
                "[[notify.sink]]\nkind = \"webhook\"\nurl = \"ftp://x\"",
                "`url` = \"ftp://x\"",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"https://ntfy.sh/t\"",
                "local relay",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://ntfy.lan/\"",
                "an ntfy topic's URL",
            ),
            (
                "[[notify.sink]]\nname = \"a\"\nkind = \"ntfy\"\nurl = \"http://x/t\"\nevents = [\"done\"]",
                "[[notify.sink]] 1 (\"a\"): `events` names \"done\"",
            ),
            (
                "[[notify.sink]]\nkind = \"command\"\ncommand = []",
                "needs `command`",
            ),
            (
                "[[notify.sink]]\nkind = \"command\"\ncommand = [\"x\"]\nurl = \"http://x\"",
                "`url` is for webhook and ntfy sinks",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://x/t\"\nenv = { A = \"hush\" }",
                "`env` is for command sinks",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://x/t\"\nlimit = 0",
                "`limit` = 0",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://x/t\"\nwindow = \"soon\"",
                "`window` = \"soon\"",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://x/t\"\nsecret = \"hush\"",
                "`secret` is for webhook sinks",
            ),
            (
                "[[notify.sink]]\nkind = \"ntfy\"\nurl = \"http://x/t\"\n[[notify.sink]]\nkind = \"ntfy\"\nname = \"ntfy-1\"\nurl = \"http://x/t\"",
                "another sink's name",
            ),
            (
                "[[notify.sink]]\nkind = \"webhook\"\nurl = \"http://x\"\nsecrte = \"hush\"",
                "unknown field `secrte`",
            ),
            ("[notify]\nsinks = []", "unknown field `sinks`"),
        ] {
            let err = NotifyConfig::parse(text).expect_err(text);
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains("hush"), "{text}: {err}");
        }
    }
}
