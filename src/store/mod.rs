//! The key-value layer: the rendezvous and the worker-facing store.

mod error;
mod standalone;
pub mod tcp;

pub use error::StoreError;
pub use standalone::{run_standalone, store_main};
