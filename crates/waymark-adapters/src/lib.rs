//! Runtime adapters: each one speaks a runtime's own protocol on one side and the worker SDK
//! on the other, so a run of Codex, OpenClaw or any ACP agent shows up as a task with its
//! attempts, effects and approvals, and a decision made in the inbox goes back in the
//! runtime's own words (`docs/adapters.md`). Claude Code's hooks are served by the control
//! plane itself (`waymark-server`'s `adapters` module), since they are HTTP calls into it.
//!
//! Every approval an adapter opens carries its durability class; it is reported approved only
//! after the runtime acknowledges the answer, and a runtime that drops it (connection closed)
//! closes it as expired.

pub mod acp;
pub mod bridge;
pub mod codex;
pub mod hermes;
pub mod jsonrpc;
pub mod openclaw;
pub mod own_rules;
