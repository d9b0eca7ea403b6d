//! drover's end-to-end tests, in one test binary: each module was a test file of its own, and
//! every test binary here links the whole daemon, so one binary instead of twelve saves most
//! of the link time of `cargo test`. A module's tests are named after it
//! (`workspaces::…`), so `cargo test -p drover-e2e -- workspaces::` runs one part, and
//! `--skip real_agents` leaves out the real agents.

mod acp_sessions;
mod crash;
mod durability;
mod durability_disk;
mod hibernation;
mod import_sessions;
mod jobs;
mod mcp;
mod metrics;
mod notify;
mod orphans;
mod own_subagents;
mod processes;
mod protocol;
mod protocol_smoke;
mod providers_reload;
mod real_agents;
mod real_agents_daemon;
mod real_agents_limits;
mod real_agents_mcp;
mod real_agents_orphans;
mod real_agents_signin;
mod runtime;
mod schedules;
mod scripted_agent;
mod security;
mod signin;
mod streaming;
mod terminals;
mod ui;
mod unattended;
mod warm;
mod wiring;
mod workspace_terminals;
mod workspaces;
