//! `drover-msgdriver HOME CWD AGENT SEED run|settle`: sends messages to live agents and
//! archives them until the durability test kills it; its code and line protocol are in
//! `drover_testkit::msgdriver`.

fn main() -> anyhow::Result<()> {
    drover_testkit::msgdriver::main()
}
