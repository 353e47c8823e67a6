//! The `Store` trait: the operations the rendezvous needs from a key-value store, implemented by the TCP
//! store client (`store::remote`), etcd v3 (`store::etcd`) and the in-process store (`memory`, for tests and
//! simulations).
//!
//! Semantics every implementation keeps: `get` never blocks; `compare_set` sets when the current value
//! (absent counts as empty) equals `expected` and returns the value after the call; `set_session` keys are
//! deleted when this handle's owner goes away (its connection closes, its lease ends); `watch` delivers every
//! later write and delete of its keys and prefixes, and its channel closes when the store is lost.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;

use super::StoreError;

pub trait Store: Send + Sync + 'static {
    fn set(&self, key: &str, value: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send;
    fn add(&self, key: &str, delta: i64) -> impl Future<Output = Result<i64, StoreError>> + Send;
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> impl Future<Output = Result<Vec<u8>, StoreError>> + Send;
    /// Waits until `key` exists: true, or false after `timeout`.
    fn wait(&self, key: &str, timeout: Duration) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Sets several keys in one request.
    fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// The value of each key, in one request and in the keys' order: None where it is absent. Empty reads
    /// as absent on every store (torch's TCPStore protocol cannot tell the two apart).
    fn multi_get(&self, keys: &[String]) -> impl Future<Output = Result<Vec<Option<Vec<u8>>>, StoreError>> + Send;
    /// Every key under `prefix`.
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;
    /// Every key under `prefix` with its value (empty values left out, as `multi_get` reads them): one
    /// request where the store can read a prefix's values at once (etcd), else a `list` and a `multi_get`.
    fn scan(&self, prefix: &str) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>, StoreError>> + Send {
        async move {
            let keys = self.list(prefix).await?;
            let values = self.multi_get(&keys).await?;
            Ok(keys.into_iter().zip(values).filter_map(|(k, v)| Some((k, v?))).collect())
        }
    }
    fn delete(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// This handle's heartbeat: `set`, acknowledged by the store within `timeout` (Ok means the store has it,
    /// not that it sits in a send buffer), on a path where it never queues behind a long wait of this handle
    /// (over TCP, the connection that holds the session keys). A beat not acknowledged in time replaces
    /// that path: a connection with requests unanswered would otherwise wait out TCP's retransmissions.
    fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// A round trip that changes nothing, on the heartbeat's path and bounded as it is: between two beats,
    /// it tells this handle that the store still answers.
    fn ping(&self, key: &str, timeout: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Whether the network still leads to the store, asked on a fresh connection within `timeout`: a host
    /// that completes (or refuses) a TCP handshake is there, whatever its store process does; a refusal
    /// from every endpoint also says that no store listens there.
    fn reach(&self, timeout: Duration) -> impl Future<Output = Reach> + Send;
    /// A key deleted when this handle's owner goes away.
    fn set_session(&self, key: &str, value: &[u8]) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Once a job finished, its state in a store that outlives it in the user's space (the API server's
    /// objects in the job's namespace): deleted, but for what is under `keep` (the lemon memory a requeued
    /// job with the same id reads). Elsewhere nothing: an embedded store ends with its host, and etcd
    /// keeps a job's keys as it keeps any others.
    fn forget_job(&self, keep: &str) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = keep;
        async { Ok(()) }
    }
    /// Every later write and delete of the given keys and prefixes, on one channel; dropping the receiver
    /// ends the watch.
    fn watch(
        &self,
        targets: &[WatchTarget],
    ) -> impl Future<Output = Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError>> + Send;
}

/// What [`Store::reach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The store's host answered at the TCP level: its process may be stopped or overloaded, but this node
    /// is not cut off from it.
    Path,
    /// The host answered with a refusal: nothing listens on the store's port (its process ended), but
    /// this node is not cut off from it.
    Refused,
    /// No handshake completed in time (no SYN-ACK, no RST, or no route): this node is cut off.
    NoPath,
}

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    Key(String),
    Prefix(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventKind {
    /// Set or changed by any request.
    Written,
    /// Deleted, including by its session's end or a store clear.
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    pub key: String,
}
