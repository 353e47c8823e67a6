//! muster: a per-node launcher for PyTorch distributed training, a drop-in for `torchrun`.
//!
//! `main.rs` is thin; every concept lives in one module here. See `ARCHITECTURE.md` for the map.

pub mod store;
