//! muster: a per-node launcher for PyTorch distributed training, a drop-in for `torchrun`.
//!
//! `main.rs` is thin; every concept lives in one module here. See `ARCHITECTURE.md` for the map.

pub mod agent;
pub mod bench;
pub mod cli;
pub mod config;
pub mod console;
pub mod context;
pub mod exit;
pub mod gate;
pub mod gpu;
pub mod hang;
pub mod host;
pub mod inplace;
pub mod limits;
pub mod observe;
pub mod rendezvous;
pub mod runtime;
pub mod signals;
pub mod status;
pub mod store;
pub mod straggler;
pub mod supervisor;
pub mod telemetry;
pub mod template;
pub mod tools;
