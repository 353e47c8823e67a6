//! An in-process store with the TCP store's semantics, for tests of the rendezvous algorithm and for
//! simulations. Each [`MemoryHandle`] is one "connection": its session keys vanish when it is dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::{Reach, Store, StoreError, WatchEvent, WatchEventKind, WatchTarget};

#[derive(Default)]
struct Inner {
    data: BTreeMap<String, Vec<u8>>,
    /// Session keys by owning handle.
    sessions: HashMap<u64, Vec<String>>,
    watchers: Vec<(Vec<WatchTarget>, mpsc::UnboundedSender<WatchEvent>)>,
    next_handle: u64,
}

impl Inner {
    fn notify(&mut self, kind: WatchEventKind, key: &str) {
        let matches = |t: &WatchTarget| match t {
            WatchTarget::Key(k) => k == key,
            WatchTarget::Prefix(p) => key.starts_with(p.as_str()),
        };
        self.watchers.retain(|(targets, tx)| {
            !targets.iter().any(matches) || tx.send(WatchEvent { kind, key: key.to_string() }).is_ok()
        });
    }

    fn write(&mut self, key: &str, value: Vec<u8>) {
        self.data.insert(key.to_string(), value);
        self.notify(WatchEventKind::Written, key);
    }

    fn remove(&mut self, key: &str) -> bool {
        let existed = self.data.remove(key).is_some();
        if existed {
            self.notify(WatchEventKind::Deleted, key);
        }
        existed
    }
}

/// The shared store; hand out one handle per simulated agent.
#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

/// One client of a [`MemoryStore`].
pub struct MemoryHandle {
    store: MemoryStore,
    id: u64,
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn handle(&self) -> MemoryHandle {
        let mut inner = self.lock();
        inner.next_handle += 1;
        MemoryHandle { store: self.clone(), id: inner.next_handle }
    }

    /// Drops every watcher, as a store that went away would.
    pub fn disconnect_watchers(&self) {
        self.lock().watchers.clear();
    }
}

impl Drop for MemoryHandle {
    fn drop(&mut self) {
        let mut inner = self.store.lock();
        for key in inner.sessions.remove(&self.id).unwrap_or_default() {
            inner.remove(&key);
        }
        drop(inner);
        self.store.changed.notify_waiters();
    }
}

impl MemoryHandle {
    fn mutate<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let out = f(&mut self.store.lock());
        self.store.changed.notify_waiters();
        out
    }
}

impl Store for MemoryHandle {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.mutate(|i| i.write(key, value.to_vec()));
        Ok(())
    }

    async fn beat(&self, key: &str, value: &[u8], _timeout: Duration) -> Result<(), StoreError> {
        self.set(key, value).await
    }

    async fn ping(&self, _key: &str, _timeout: Duration) -> Result<(), StoreError> {
        Ok(())
    }

    /// In-process: always there.
    async fn reach(&self, _timeout: Duration) -> Reach {
        Reach::Path
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.store.lock().data.get(key).cloned())
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        Ok(self.mutate(|i| {
            let now = i.data.get(key).and_then(|v| String::from_utf8_lossy(v).parse::<i64>().ok()).unwrap_or(0);
            let new = now + delta;
            i.write(key, new.to_string().into_bytes());
            new
        }))
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(self.mutate(|i| {
            let current = i.data.get(key).cloned().unwrap_or_default();
            if current == expected {
                i.write(key, desired.to_vec());
                desired.to_vec()
            } else {
                current
            }
        }))
    }

    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.store.changed.notified();
            if self.store.lock().data.contains_key(key) {
                return Ok(true);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(self.store.lock().data.contains_key(key));
            }
        }
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.mutate(|i| pairs.iter().for_each(|(k, v)| i.write(k, v.clone())));
        Ok(())
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let inner = self.store.lock();
        Ok(keys.iter().map(|k| inner.data.get(k).filter(|v| !v.is_empty()).cloned()).collect())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.store.lock().data.range(prefix.to_string()..).take_while(|(k, _)| k.starts_with(prefix)).map(|(k, _)| k.clone()).collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.mutate(|i| i.remove(key)))
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let id = self.id;
        self.mutate(|i| {
            i.write(key, value.to_vec());
            i.sessions.entry(id).or_default().push(key.to_string());
        });
        Ok(())
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.store.lock().watchers.push((targets.to_vec(), tx));
        Ok(rx)
    }
}
