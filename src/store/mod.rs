//! The key-value layer: the rendezvous and the worker-facing store.

#[cfg(test)]
pub(crate) mod conformance;
mod error;
mod kv;
mod outage;
mod reach;
pub mod memory;
pub mod remote;
mod standalone;
mod either;
pub mod etcd;
pub mod k8s;
pub mod tcp;

pub use either::RdzvStore;
pub use error::StoreError;
pub use kv::{Reach, Store, WatchEvent, WatchEventKind, WatchTarget};
pub use outage::{Outage, OUTAGE_AFTER};
pub use reach::reach_any;
pub use standalone::run_standalone;
