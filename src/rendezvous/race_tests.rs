//! Interleavings the concurrent suite reaches only by luck, made certain: one agent's store is held at a
//! chosen request until the test lets it go.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::tests::shared::{agent, join_all, memory, settings, tcp, Backend, Etcd};
use super::*;
use crate::store::{Reach, StoreError, WatchEvent, WatchTarget};

/// A store whose first `add` of a slot counter after `arm` waits: `reached` says it got there, `release`
/// lets it go on.
struct Held<S> {
    inner: S,
    armed: Arc<AtomicBool>,
    reached: Arc<Notify>,
    release: Arc<Notify>,
}

impl<S: Store> Held<S> {
    fn new(inner: S) -> Self {
        Held { inner, armed: Arc::default(), reached: Arc::default(), release: Arc::default() }
    }
}

impl<S: Store> Store for Held<S> {
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        if delta > 0 && key.ends_with("/slot") && self.armed.swap(false, Ordering::SeqCst) {
            self.reached.notify_one();
            self.release.notified().await;
        }
        self.inner.add(key, delta).await
    }
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set(key, value).await
    }
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key).await
    }
    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.inner.compare_set(key, expected, desired).await
    }
    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        self.inner.wait(key, timeout).await
    }
    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.inner.multi_set(pairs).await
    }
    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.multi_get(keys).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix).await
    }
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        self.inner.scan(prefix).await
    }
    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        self.inner.beat(key, value, timeout).await
    }
    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        self.inner.ping(key, timeout).await
    }
    async fn reach(&self, timeout: Duration) -> Reach {
        self.inner.reach(timeout).await
    }
    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.inner.set_session(key, value).await
    }
    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.inner.watch(targets).await
    }
}

/// Agents of `B` whose stores can be held.
struct Holding<B>(B);

impl<B: Backend> Backend for Holding<B> {
    type S = Held<B::S>;
    fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
        Box::pin(async move { Held::new(self.0.connect().await) })
    }
}

/// A node opens the next round and drains (its gate failed) while the other is between reading the
/// round's expected count and taking its slot: the drain lowers the count and finds no slot taken, the
/// joiner takes its slot against the count it read. It must still see the lowered count, and seal the
/// round at once rather than after its 30 s last call.
async fn a_drain_between_a_joiners_read_and_its_slot_is_seen<B: Backend>(b: B) {
    let b = Holding(b);
    let slow = Settings { last_call_timeout: Duration::from_secs(30), ..settings(1, 2) };
    let (joiner, leaver) = (agent(&b, "a", 1, slow.clone()).await, agent(&b, "b", 1, slow).await);
    let mut joined = join_all(vec![joiner, leaver]).await;
    let ((mut leaver, info), (mut joiner, _)) = (joined.pop().expect("b"), joined.pop().expect("a"));
    leaver.open_next_round().await.expect("open");
    let held = joiner.store.clone();
    held.armed.store(true, Ordering::SeqCst);
    let joining = tokio::spawn(async move { joiner.next_round().await.expect("round") });
    held.reached.notified().await;
    leaver.leave().await.expect("leave");
    held.release.notify_one();
    // Far below the last call: only a joiner that saw the count lowered finishes in time.
    let again = tokio::time::timeout(Duration::from_secs(5), joining).await.expect("sealed at once").expect("task");
    assert_eq!((again.round, again.group_world_size), (info.round + 1, 1), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store() {
    a_drain_between_a_joiners_read_and_its_slot_is_seen(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_store() {
    a_drain_between_a_joiners_read_and_its_slot_is_seen(tcp().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store() {
    a_drain_between_a_joiners_read_and_its_slot_is_seen(Etcd(crate::store::etcd::testing::TestEtcd::start())).await;
}
