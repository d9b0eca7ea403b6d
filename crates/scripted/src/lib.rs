//! The scripted ACP agent: a real ACP agent whose prompts script its turns
//! ([`scripted_agent`], with its directives), and the MCP client it calls drover with
//! ([`mcp_http`]).
//!
//! Two users: drover's tests, through `drover-fakes` (which re-exports both modules) and the
//! `drover-scripted-agent` binary of drover-e2e; and the `drover` binary, which runs it as the
//! built-in `demo` provider (`drover demo-agent`), so drover can be tried without a model or
//! a key (see `docs/demo.md`).
//!
//! Like the rest of the fakes it depends on none of drover's crates: a fake that shared
//! drover's code could agree with drover's bugs instead of exposing them. It is a crate of its
//! own so that the `drover` binary links the agent and nothing else of the test fakes.

pub mod mcp_http;
pub mod scripted_agent;
