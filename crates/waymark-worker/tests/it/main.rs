#![allow(unreachable_pub)]

//! The SDK and the demo agent against the real control plane (in-process, on 127.0.0.1:0,
//! over a real SQLite file), the real deploy service on its own port, real git and python.

mod support;

mod budget;
mod control;
mod demo_run;
mod effects;
mod run;
mod tls;
