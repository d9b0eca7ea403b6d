//! The hosts a daemon links to, kept in `$DROVER_HOME/hosts.json` (a private file, replaced
//! whole on each change), and the command that reaches each.

use std::path::Path;

use drover_protocol::HostConfig;

/// The file, in the data directory.
pub(crate) const HOSTS_FILE: &str = "hosts.json";

/// What the remote side runs: its own `drover`, found on the user's `PATH` or where
/// `drover host add --install` puts it.
pub(crate) const REMOTE_COMMAND: &str =
    "PATH=\"$HOME/.local/bin:$PATH\" exec drover connect --stdio";

/// Reads the hosts file; none yet is no hosts.
pub(crate) fn load(home: &Path) -> Result<Vec<HostConfig>, String> {
    let path = home.join(HOSTS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let hosts: Vec<HostConfig> = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{} is not a list of hosts ({e}); fix or remove it",
            path.display()
        )
    })?;
    for host in &hosts {
        validate(host).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(hosts)
}

/// Replaces the hosts file with `hosts`.
pub(crate) fn save(home: &Path, hosts: &[HostConfig]) -> Result<(), String> {
    let json = serde_json::to_vec_pretty(hosts).unwrap_or_default();
    drover_core::store::write_atomic(&home.join(HOSTS_FILE), &json).map_err(|e| e.to_string())
}

/// Whether `host` can be linked to: a good name, and one way to reach it.
pub(crate) fn validate(host: &HostConfig) -> Result<(), String> {
    let name = &host.name;
    let good = !name.is_empty()
        && name.len() <= 40
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if !good {
        return Err(format!(
            "host name `{name}`: use 1 to 40 lower-case letters, digits and `-`"
        ));
    }
    if name == "auto" || name == "local" {
        return Err(format!(
            "host name `{name}` is reserved (`--host auto` places an agent, `local` is this machine)"
        ));
    }
    match (&host.ssh, &host.command) {
        (Some(url), None) => SshTarget::parse(url).map(|_| ()),
        (None, Some(command)) if !command.is_empty() => Ok(()),
        (None, Some(_)) => Err("the link command is empty".to_string()),
        (Some(_), Some(_)) => {
            Err("give either an ssh:// address or a link command, not both".to_string())
        }
        (None, None) => Err("give an ssh://[user@]host[:port] address or a link command".into()),
    }
}

/// `ssh://[user@]host[:port]`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SshTarget {
    pub(crate) user: Option<String>,
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
}

impl SshTarget {
    pub(crate) fn parse(url: &str) -> Result<SshTarget, String> {
        let bad = |why: &str| format!("`{url}`: {why}; write ssh://[user@]host[:port]");
        let rest = url
            .strip_prefix("ssh://")
            .ok_or_else(|| bad("not an ssh:// address"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (user, rest) = match rest.rsplit_once('@') {
            Some((user, rest)) if !user.is_empty() => (Some(user.to_string()), rest),
            Some(_) => return Err(bad("the user is empty")),
            None => (None, rest),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !host.contains(':') || host.starts_with('[') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| bad(&format!("`{port}` is not a port")))?;
                (host.to_string(), Some(port))
            }
            _ => (rest.to_string(), None),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        if host.is_empty() || host.starts_with('-') || host.contains(['/', ' ']) {
            return Err(bad("no host name"));
        }
        Ok(SshTarget { user, host, port })
    }
}

/// The program and arguments whose stdin and stdout are the link to `host`.
pub(crate) fn link_command(host: &HostConfig) -> Vec<String> {
    if let Some(command) = &host.command {
        return command.clone();
    }
    ssh_command(host, REMOTE_COMMAND).unwrap_or_default()
}

/// `ssh` to an `ssh://` host running `remote` there (`None` for a host reached otherwise):
/// never a password prompt (`BatchMode`), the host's identity and options.
pub fn ssh_command(host: &HostConfig, remote: &str) -> Option<Vec<String>> {
    let target = SshTarget::parse(host.ssh.as_deref()?).ok()?;
    let mut argv: Vec<String> = [
        "ssh",
        "-T",
        // Never a prompt: a link that needs a password fails, saying so.
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=3",
    ]
    .map(String::from)
    .to_vec();
    if let Some(port) = target.port {
        argv.extend(["-p".to_string(), port.to_string()]);
    }
    if let Some(identity) = &host.identity {
        argv.extend(["-i".to_string(), identity.clone()]);
    }
    for option in &host.ssh_options {
        argv.extend(["-o".to_string(), option.clone()]);
    }
    let destination = match &target.user {
        Some(user) => format!("{user}@{}", target.host),
        None => target.host,
    };
    // `--` ends ssh's options: the rest is the destination and the remote command.
    argv.extend(["--".to_string(), destination, remote.to_string()]);
    Some(argv)
}

/// How a host is shown: its ssh address or its command.
pub(crate) fn target(host: &HostConfig) -> String {
    match (&host.ssh, &host.command) {
        (Some(url), _) => url.clone(),
        (None, Some(command)) => command.join(" "),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_addresses_parse() {
        assert_eq!(
            SshTarget::parse("ssh://me@box:2222").expect("parses"),
            SshTarget {
                user: Some("me".into()),
                host: "box".into(),
                port: Some(2222)
            }
        );
        assert_eq!(
            SshTarget::parse("ssh://10.0.0.2").expect("parses"),
            SshTarget {
                user: None,
                host: "10.0.0.2".into(),
                port: None
            }
        );
        for bad in [
            "box",
            "ssh://",
            "ssh://me@box:port",
            "ssh://-oProxyCommand=x",
        ] {
            assert!(SshTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_checked() {
        let host = |name: &str| HostConfig {
            name: name.into(),
            ssh: Some("ssh://box".into()),
            identity: None,
            ssh_options: Vec::new(),
            command: None,
        };
        assert!(validate(&host("build-box-2")).is_ok());
        for bad in ["", "Box", "a b", "auto", "-x"] {
            assert!(validate(&host(bad)).is_err(), "{bad}");
        }
    }
}
