//! Fakes of the programs drover talks to, and what drives them without drover.
//!
//! [`scripted_agent`] is an ACP agent whose prompts script its turns (the logic of the
//! `drover-scripted-agent` binary, which drover-e2e declares); [`model`] is a scripted model
//! server on loopback (binary `drover-model`), so that [`real_agents`] (codex, claude, gemini,
//! installed by `scripts/install-agents`) run real turns offline. [`acp_client`] drives one agent
//! process directly, [`mcp_http`] makes one MCP `tools/call` (as the scripted agent does against
//! drover), and [`procs`] reads the process table to find an agent's processes.
//!
//! Nothing here depends on drover's own crates: a fake that shared drover's code could agree
//! with drover's bugs instead of exposing them. (`drover-scripted`, re-exported here, is the
//! scripted agent alone, in a crate of its own so the `drover` binary can ship it as the
//! `demo` provider; it depends on none of drover's crates either.)

pub mod acp_client;
pub mod model;
pub mod procs;
pub mod real_agents;

/// The scripted agent and its MCP client live in `drover-scripted`, which the `drover` binary
/// also links (its `demo` provider); they are the fakes' own all the same.
pub use drover_scripted::{mcp_http, scripted_agent};
