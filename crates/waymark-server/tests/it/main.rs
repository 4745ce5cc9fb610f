#![allow(unreachable_pub)]

//! End-to-end tests of the control plane: the real server on 127.0.0.1:0 over a real SQLite
//! file, driven over real HTTP.

mod support;

mod at_rest;
mod bad_input;
mod chain;
mod claude_code;
mod delegation;
mod deliveries;
mod escalation;
mod events;
mod followups;
mod junit;
mod limits;
mod machines;
mod openapi;
mod push;
mod recovery;
mod replicas;
mod rules;
mod runtime_approvals;
mod steer;
mod tls;
mod webapp;
mod worker_api;
