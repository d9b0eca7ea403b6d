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
//! with drover's bugs instead of exposing them.

pub mod acp_client;
pub mod mcp_http;
pub mod model;
pub mod procs;
pub mod real_agents;
pub mod scripted_agent;
