//! The key-value layer: the rendezvous and the worker-facing store.
