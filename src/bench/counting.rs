//! A store adapter that counts every operation a simulated node makes, and the bytes it carries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::store::{Reach, Store, StoreError, WatchEvent, WatchTarget};

/// Store operations, by kind, as counted by [`CountingStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Op {
    Set,
    Get,
    Add,
    CompareSet,
    Wait,
    MultiGet,
    MultiSet,
    List,
    Scan,
    Delete,
    SetSession,
    Watch,
    /// The heartbeat's write (`Store::beat`).
    Beat,
    /// The heartbeat's round trip between beats (`Store::ping`), sent only while the link is broken.
    Ping,
}

impl Op {
    pub(super) const ALL: [Op; 14] = [
        Op::Set,
        Op::Get,
        Op::Add,
        Op::CompareSet,
        Op::Wait,
        Op::MultiGet,
        Op::MultiSet,
        Op::List,
        Op::Scan,
        Op::Delete,
        Op::SetSession,
        Op::Watch,
        Op::Beat,
        Op::Ping,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
            Op::Add => "add",
            Op::CompareSet => "compare_set",
            Op::Wait => "wait",
            Op::MultiGet => "multi_get",
            Op::MultiSet => "multi_set",
            Op::List => "list",
            Op::Scan => "scan",
            Op::Delete => "delete",
            Op::SetSession => "set_session",
            Op::Watch => "watch",
            Op::Beat => "beat",
            Op::Ping => "ping",
        }
    }
}

/// One node's operation counters, shared between its store adapter and the benchmark.
#[derive(Debug, Default)]
pub(super) struct OpCounts {
    ops: [AtomicU64; Op::ALL.len()],
    /// Value bytes sent and received (keys and framing left out): operations are O(1) per node, but what
    /// they carry need not be.
    pub(super) bytes_written: AtomicU64,
    pub(super) bytes_read: AtomicU64,
}

impl OpCounts {
    fn bump(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn wrote(&self, n: usize) {
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn read(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(super) fn get(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    pub(super) fn total(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.get(op)).sum()
    }
}

/// A [`Store`] that delegates to `inner` and counts each call, so the report can show what one node costs
/// the store (the scaling claim is O(1) operations per node and round).
pub(super) struct CountingStore<S> {
    pub(super) inner: S,
    pub(super) counts: Arc<OpCounts>,
}

impl<S: Store> Store for CountingStore<S> {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.counts.bump(Op::Set);
        self.counts.wrote(value.len());
        self.inner.set(key, value).await
    }

    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        self.counts.bump(Op::Beat);
        self.counts.wrote(value.len());
        self.inner.beat(key, value, timeout).await
    }

    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        self.counts.bump(Op::Ping);
        self.inner.ping(key, timeout).await
    }

    async fn reach(&self, timeout: Duration) -> Reach {
        self.inner.reach(timeout).await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.counts.bump(Op::Get);
        let value = self.inner.get(key).await?;
        self.counts.read(value.as_ref().map_or(0, Vec::len));
        Ok(value)
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.counts.bump(Op::Add);
        self.inner.add(key, delta).await
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.counts.bump(Op::CompareSet);
        self.counts.wrote(expected.len() + desired.len());
        let current = self.inner.compare_set(key, expected, desired).await?;
        self.counts.read(current.len());
        Ok(current)
    }

    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        self.counts.bump(Op::Wait);
        self.inner.wait(key, timeout).await
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.counts.bump(Op::MultiSet);
        self.inner.multi_set(pairs).await
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.counts.bump(Op::MultiGet);
        let values = self.inner.multi_get(keys).await?;
        self.counts.read(values.iter().flatten().map(Vec::len).sum());
        Ok(values)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.counts.bump(Op::List);
        self.inner.list(prefix).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.counts.bump(Op::Scan);
        let pairs = self.inner.scan(prefix).await?;
        self.counts.read(pairs.iter().map(|(_, v)| v.len()).sum());
        Ok(pairs)
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.counts.bump(Op::Delete);
        self.inner.delete(key).await
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.counts.bump(Op::SetSession);
        self.counts.wrote(value.len());
        self.inner.set_session(key, value).await
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.counts.bump(Op::Watch);
        self.inner.watch(targets).await
    }
}
