//! `drover-daemon-proc HOME`: the daemon in a process of its own, for tests that kill it; its
//! code is in `drover_testkit::daemonproc`.

fn main() -> anyhow::Result<()> {
    drover_testkit::daemonproc::main()
}
