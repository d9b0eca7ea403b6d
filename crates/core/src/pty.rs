//! Pseudo-terminals: a program started on the slave side of a new PTY, in a session of its
//! own whose controlling terminal that PTY is, the way a terminal emulator starts a shell.
//! The daemon's workspace terminals (`drover_daemon::ptys`) are built on it.
//!
//! The child is started like every other child (see [`crate::child`]): from the spawner
//! thread, killed by the kernel when the daemon dies, marked and put in a cgroup of its own
//! for the guard. It is not put in a process group of its own first: `setsid` makes it the
//! leader of a new session *and* process group, and refuses a process that already leads a
//! group.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::pty::{Winsize, openpty};

/// A program running on a PTY: the child, and the master side (reading it gives what the
/// program writes; writing it is typing).
#[derive(Debug)]
pub struct PtyChild {
    pub child: Child,
    pub master: File,
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Starts `command` (its program, arguments, cwd and environment set; stdio is replaced) on a
/// new PTY of `cols` × `rows`, as the leader of a new session whose controlling terminal is
/// that PTY. Awaits the fork on the spawner thread (see [`crate::child::on_spawner`]).
pub async fn spawn(mut command: Command, cols: u16, rows: u16) -> io::Result<PtyChild> {
    crate::child::die_with_daemon(&mut command);
    crate::child::on_spawner(move || {
        // Opened on the spawner, the one thread that forks: no other child can inherit the
        // master between its opening and its close-on-exec flag.
        let pty = openpty(Some(&winsize(cols, rows)), None).map_err(io::Error::from)?;
        for fd in [&pty.master, &pty.slave] {
            fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
        }
        let slave: OwnedFd = pty.slave;
        command
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave));
        become_session_leader(&mut command);
        let child = command.spawn()?;
        // The command (and its copies of the slave) is dropped here: only the child holds
        // the slave now, so reading the master ends once the child's session closed it.
        Ok(PtyChild {
            child,
            master: File::from(pty.master),
        })
    })
    .await?
}

/// Makes the child leader of a new session with its stdin (the PTY's slave) as its
/// controlling terminal.
#[expect(unsafe_code)] // `pre_exec` is unsafe: the closure runs between fork and exec.
fn become_session_leader(command: &mut Command) {
    // SAFETY: setsid and ioctl are async-signal-safe; nothing is allocated or locked.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sets the size of the PTY whose master is `master`; the kernel sends `SIGWINCH` to its
/// foreground process group.
#[expect(unsafe_code)] // `ioctl` is unsafe: it writes through the pointer it is given.
pub fn resize(master: &File, cols: u16, rows: u16) -> io::Result<()> {
    let size = winsize(cols, rows);
    // SAFETY: TIOCSWINSZ reads one `winsize` from a pointer to a live, initialized one.
    let done = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &raw const size) };
    if done == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[tokio::test]
    async fn a_shell_on_a_pty_is_interactive_and_sees_its_size() {
        let dir = tempfile::tempdir().expect("dir");
        let mut command = Command::new("/bin/sh");
        command.current_dir(dir.path()).env_clear().env("PS1", "$ ");
        let PtyChild {
            mut child,
            mut master,
        } = spawn(command, 91, 17).await.expect("spawn");
        master
            .write_all(b"stty size; tty; echo $((6*7)); exit 3\n")
            .expect("type");
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // The master reads EIO once the session closed the slave.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("17 91"), "{text}");
        assert!(text.contains("/dev/pts/"), "{text}");
        assert!(text.contains("42"), "{text}");
        assert_eq!(child.wait().expect("wait").code(), Some(3));
    }
}
