//! Machines on one machine, for the hosts tests and benchmarks: Linux network namespaces
//! (each held open by a `sleep` made with `unshare --net`) joined by veth pairs, and in a
//! host's namespace Debian's OpenSSH server with keys the test generated.
//!
//! Every namespace is new and has only its loopback and the veth links made here: nothing in
//! it can reach a real network, and the test's own process uses none of these addresses.
//! Commands run inside a namespace with `nsenter --net=/proc/PID/ns/net`. Dropping a namespace
//! kills what holds it; processes still inside (a daemon the test started) are the test's to
//! end first.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// A network namespace of its own, alive while this value is.
#[derive(Debug)]
pub struct Netns {
    holder: Child,
}

impl Netns {
    /// A new namespace with its loopback up.
    pub fn new() -> anyhow::Result<Netns> {
        let holder = Command::new("unshare")
            .args(["--net", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .context("cannot run `unshare --net` (the hosts tests need root and util-linux)")?;
        let ns = Netns { holder };
        // `unshare` execs `sleep` once the namespace is made.
        let ours = std::fs::read_link("/proc/self/ns/net").ok();
        let made = crate::wait::poll_until_blocking(Duration::from_secs(5), || {
            let theirs = std::fs::read_link(ns.path()).ok()?;
            let exe = std::fs::read_link(format!("/proc/{}/exe", ns.pid())).ok()?;
            (Some(&theirs) != ours.as_ref() && exe.ends_with("sleep")).then_some(())
        });
        if made.is_none() {
            bail!("`unshare --net` made no namespace within 5 s");
        }
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// `/proc/PID/ns/net`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }

    /// `program` to run inside the namespace (through `nsenter`); its environment is the
    /// caller's to set.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program.as_ref());
        command
    }

    /// Runs `argv` inside the namespace; fails unless it succeeds.
    pub fn exec(&self, argv: &[&str]) -> anyhow::Result<Output> {
        let (program, args) = argv.split_first().context("an empty command")?;
        let output = self
            .command(program)
            .args(args)
            .output()
            .with_context(|| format!("cannot run {argv:?} in the namespace"))?;
        if !output.status.success() {
            bail!(
                "{argv:?} in the namespace failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(output)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Joins two namespaces by a veth pair: `a_if` with `a_addr` in `a`, `b_if` with `b_addr` in
/// `b` (addresses with their prefix, `10.77.1.1/24`).
pub fn link(
    a: &Netns,
    a_if: &str,
    a_addr: &str,
    b: &Netns,
    b_if: &str,
    b_addr: &str,
) -> anyhow::Result<()> {
    let (a_pid, b_pid) = (a.pid().to_string(), b.pid().to_string());
    let status = Command::new("ip")
        .args([
            "link", "add", a_if, "netns", &a_pid, "type", "veth", "peer", "name", b_if,
        ])
        .args(["netns", &b_pid])
        .status()
        .context("cannot run `ip` (iproute2)")?;
    if !status.success() {
        bail!("`ip link add {a_if} … peer {b_if}` failed ({status})");
    }
    for (ns, name, addr) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        ns.exec(&["ip", "addr", "add", addr, "dev", name])?;
        ns.exec(&["ip", "link", "set", name, "up"])?;
    }
    Ok(())
}

/// An OpenSSH server in its own namespace, letting in one key the test made, for `root`
/// (whoever runs the tests) with the environment given (`environment=` in its
/// `authorized_keys`: the host's `PATH`, `HOME`, `DROVER_HOME`).
#[derive(Debug)]
pub struct SshServer {
    sshd: Child,
    /// The private key it lets in.
    pub key: PathBuf,
    /// A `known_hosts` file naming its host key at `address`.
    pub known_hosts: PathBuf,
    pub address: String,
}

impl SshServer {
    /// Starts `sshd` in `ns`, listening on `address` port 22, its files in `dir`.
    pub fn start(
        ns: &Netns,
        address: &str,
        dir: &Path,
        environment: &[(&str, &str)],
    ) -> anyhow::Result<SshServer> {
        std::fs::create_dir_all(dir)?;
        // sshd wants its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd")?;
        let host_key = dir.join("host_key");
        let key = dir.join("client_key");
        for path in [&host_key, &key] {
            let _ = std::fs::remove_file(path);
            let status = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(path)
                .stdout(Stdio::null())
                .status()
                .context("cannot run ssh-keygen (openssh-client)")?;
            if !status.success() {
                bail!("ssh-keygen failed ({status})");
            }
        }
        let public = |path: &Path| -> anyhow::Result<String> {
            let text = std::fs::read_to_string(path.with_extension("pub"))?;
            Ok(text.trim().to_string())
        };
        let options: Vec<String> = environment
            .iter()
            .map(|(k, v)| format!("environment=\"{k}={v}\""))
            .collect();
        let authorized = dir.join("authorized_keys");
        std::fs::write(
            &authorized,
            format!("{} {}\n", options.join(","), public(&key)?),
        )?;
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, format!("{address} {}\n", public(&host_key)?))?;
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "ListenAddress {address}:22\nHostKey {}\nAuthorizedKeysFile {}\nPidFile none\n\
                 UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitUserEnvironment yes\nLogLevel ERROR\n",
                host_key.display(),
                authorized.display()
            ),
        )?;
        let sshd = ns
            .command("/usr/sbin/sshd")
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(dir.join("sshd.log"))?))
            .spawn()
            .context("cannot start /usr/sbin/sshd (openssh-server)")?;
        let server = SshServer {
            sshd,
            key,
            known_hosts,
            address: address.to_string(),
        };
        // Listening once `ss` (iproute2) in the namespace shows the port.
        let listening = crate::wait::poll_until_blocking(Duration::from_secs(10), || {
            let out = ns.exec(&["ss", "-ltn"]).ok()?;
            String::from_utf8_lossy(&out.stdout)
                .contains(&format!("{address}:22"))
                .then_some(())
        });
        if listening.is_none() {
            bail!(
                "sshd did not listen on {address}:22 within 10 s: {}",
                std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
            );
        }
        Ok(server)
    }

    /// The `ssh -o` options a client needs for this server and nothing of the machine's own
    /// (`~/.ssh` of the user running the tests is never read for hosts or keys).
    pub fn ssh_options(&self) -> Vec<String> {
        vec![
            format!("UserKnownHostsFile={}", self.known_hosts.display()),
            "GlobalKnownHostsFile=/dev/null".to_string(),
            "StrictHostKeyChecking=yes".to_string(),
            "IdentitiesOnly=yes".to_string(),
        ]
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
    }
}

/// One machine of a test fleet: a namespace of its own, its user's home, drover's data
/// directory there, a directory for its agents to work in, and the `drover` binary it runs.
/// Its daemon (if one was started) is killed (SIGKILL) when it is dropped.
#[derive(Debug)]
pub struct Machine {
    pub ns: Netns,
    pub home: PathBuf,
    pub drover_home: PathBuf,
    pub work: PathBuf,
    drover: PathBuf,
}

impl Machine {
    /// A machine named `name` under `root`, running `drover`.
    pub fn new(root: &Path, name: &str, drover: &Path) -> anyhow::Result<Machine> {
        let dir = root.join(name);
        let machine = Machine {
            ns: Netns::new()?,
            home: dir.join("home"),
            drover_home: dir.join("drover"),
            work: dir.join("work"),
            drover: drover.to_path_buf(),
        };
        for path in [&machine.home, &machine.work] {
            std::fs::create_dir_all(path)?;
        }
        Ok(machine)
    }

    /// `drover ARGS` on this machine, as its user: the test's environment only
    /// (`crate::hermetic`), its `DROVER_HOME`, its daemon on 127.0.0.1:7717 (the namespace is
    /// its own, so every machine has that port).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = self.ns.command(&self.drover);
        crate::hermetic::apply(&mut command, &self.home)
            .env("DROVER_HOME", &self.drover_home)
            .env("DROVER_LISTEN", "127.0.0.1:7717")
            .args(args);
        command
    }

    /// Its daemon's pid, while one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        let info: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.drover_home.join("daemon.json")).ok()?)
                .ok()?;
        let pid = u32::try_from(info.get("pid")?.as_u64()?).ok()?;
        Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// SIGKILLs its daemon, if one runs, and waits (5 s at most) until it is gone; whether it
    /// is.
    pub fn kill_daemon(&self) -> bool {
        let Some(pid) = self.daemon_pid() else {
            return true;
        };
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        crate::wait::poll_until_blocking(Duration::from_secs(5), || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        })
        .is_some()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.kill_daemon();
    }
}
