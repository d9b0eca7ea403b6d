//! `drover-crashdriver HOME CWD SEED`: mutates a registry in bursts until the crash test kills
//! it; its code and line protocol are in `drover_testkit::crashdriver` and `drover_testkit::crash`.

fn main() -> anyhow::Result<()> {
    drover_testkit::crashdriver::main()
}
