//! The [`Store`] trait over TCP, to a muster server: one tagged connection ([`Mux`]) carries every request,
//! session key, heartbeat, wait and watch of this handle, so an agent holds one connection to the store
//! whatever runs at once.
//!
//! Cancel-safe by construction: a request dropped midway leaves only its reply to be read and discarded
//! by the connection's reader. Writes are ordered by the one connection, so none needs confirming before
//! the next request. Should the connection fail (the store restarted, a request got no reply in time),
//! the next request connects again and first sets every session key this handle set and did not delete:
//! the session is re-established, in one log line. Watches end with their connection (their channels
//! close, which tells the owner the store was gone).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{timeout_at, Instant};

use super::tcp::frame::{Reply, ReplyShape, Request, WatchMode, CHECK_READY};
use super::tcp::mux::{decode, Subscription};
use super::tcp::Mux;
use super::{Reach, Store, StoreError, WatchEvent, WatchEventKind, WatchTarget};

#[cfg(test)]
mod tests;

pub struct RemoteStore {
    addr: SocketAddr,
    token: Vec<u8>,
    timeout: Duration,
    /// The connection in use; replaced when it failed.
    current: Mutex<Option<Arc<Mux>>>,
    /// Held while connecting, so concurrent requests after a failure make one new connection.
    connecting: tokio::sync::Mutex<()>,
    /// Every session key this handle set and did not delete, as it set them.
    sessions: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl RemoteStore {
    /// Connects, retrying until `connect_timeout`, and says `HELLO` with the job `token` (empty for
    /// none); `timeout` then bounds every request (and every later connect).
    pub async fn connect(
        addr: SocketAddr,
        token: &[u8],
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Result<RemoteStore, StoreError> {
        let mux = Mux::connect(addr, token, connect_timeout).await?;
        Ok(RemoteStore {
            addr,
            token: token.to_vec(),
            timeout,
            current: Mutex::new(Some(Arc::new(mux.with_timeout(timeout)))),
            connecting: tokio::sync::Mutex::new(()),
            sessions: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn current(&self) -> MutexGuard<'_, Option<Arc<Mux>>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn sessions(&self) -> MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn working(&self) -> Option<Arc<Mux>> {
        self.current().as_ref().filter(|mux| !mux.is_failed()).cloned()
    }

    /// The working connection, or a new one with this handle's session keys set again on it.
    async fn mux(&self) -> Result<Arc<Mux>, StoreError> {
        if let Some(mux) = self.working() {
            return Ok(mux);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(mux) = self.working() {
            return Ok(mux);
        }
        let mux = Mux::reconnect(self.addr, &self.token, self.timeout).await?.with_timeout(self.timeout);
        let keys = self.sessions().clone();
        for (key, value) in &keys {
            mux.post(&Request::SetSession { key: &wire(key), value }, "set_session").await?;
        }
        tracing::warn!(
            "the connection to the store at {} broke; connected again ({} session key(s) set again)",
            self.addr,
            keys.len()
        );
        let mux = Arc::new(mux);
        *self.current() = Some(mux.clone());
        Ok(mux)
    }

    async fn call(&self, request: &Request<'_>, op: &'static str) -> Result<(Arc<Mux>, Vec<u8>), StoreError> {
        let mux = self.mux().await?;
        let bytes = mux.call(request, op).await?;
        Ok((mux, bytes))
    }

    async fn check(&self, key: &str) -> Result<bool, StoreError> {
        let key = wire(key);
        let (_, bytes) = self.call(&Request::Check { keys: vec![&key] }, "check").await?;
        match decode(ReplyShape::Byte, &bytes, self.addr, "check")? {
            Reply::Byte(b) => Ok(b == CHECK_READY),
            _ => Err(self.shape("check")),
        }
    }

    async fn int(&self, request: &Request<'_>, op: &'static str) -> Result<i64, StoreError> {
        let (_, bytes) = self.call(request, op).await?;
        match decode(ReplyShape::Int, &bytes, self.addr, op)? {
            Reply::Int(n) => Ok(n),
            _ => Err(self.shape(op)),
        }
    }

    async fn value(&self, request: &Request<'_>, op: &'static str) -> Result<Vec<u8>, StoreError> {
        let (_, bytes) = self.call(request, op).await?;
        match decode(ReplyShape::Value, &bytes, self.addr, op)? {
            Reply::Value(v) => Ok(v.to_vec()),
            _ => Err(self.shape(op)),
        }
    }

    async fn post(&self, request: &Request<'_>, op: &'static str) -> Result<(), StoreError> {
        self.mux().await?.post(request, op).await
    }

    fn shape(&self, op: &'static str) -> StoreError {
        let source = super::tcp::frame::FrameError::Malformed("a reply of another shape");
        StoreError::Protocol { addr: self.addr, op, source }
    }

    /// `request` within `timeout`; past it the connection it went on is broken (the next request connects
    /// afresh) rather than left to TCP's retransmission back-off, which on a silent path lasts minutes.
    async fn acknowledged(
        &self,
        timeout: Duration,
        op: &'static str,
        request: impl std::future::Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        match tokio::time::timeout(timeout, request).await {
            Ok(done) => done,
            Err(_) => {
                if let Some(mux) = self.working() {
                    mux.break_off();
                }
                Err(StoreError::Timeout { addr: self.addr, op, timeout })
            }
        }
    }

    /// Follows `targets` on the current connection; the channel closes if that connection fails.
    async fn subscribe(
        &self,
        targets: Vec<(WatchMode, Vec<u8>)>,
    ) -> Result<(Arc<Mux>, Subscription, mpsc::UnboundedReceiver<WatchEvent>), StoreError> {
        let mux = self.mux().await?;
        mux.sweep();
        let (tx, rx) = mpsc::unbounded_channel();
        let subscription = mux.watch(targets, tx).await?;
        Ok((mux, subscription, rx))
    }
}

/// A key as torch's client puts it on the wire (`/` + key).
fn wire(key: &str) -> Vec<u8> {
    let mut wire = Vec::with_capacity(key.len() + 1);
    wire.push(b'/');
    wire.extend_from_slice(key.as_bytes());
    wire
}

/// Ends a wait's subscription however the wait ends (dropped included).
struct Unsubscribe<'a>(&'a Mux, Option<Subscription>);

impl Drop for Unsubscribe<'_> {
    fn drop(&mut self) {
        if let Some(subscription) = self.1.take() {
            self.0.unsubscribe(subscription);
        }
    }
}

impl Store for RemoteStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.post(&Request::Set { key: &wire(key), value }, "set").await
    }

    /// Never waits: a key deleted between the check and the read reads as empty, and is then checked again
    /// (torch's `get` would wait the whole request timeout for it to come back).
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.check(key).await? {
            return Ok(None);
        }
        let value = self.value(&Request::Get { key: &wire(key) }, "get").await?;
        if value.is_empty() && !self.check(key).await? {
            return Ok(None);
        }
        Ok(Some(value))
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.int(&Request::Add { key: &wire(key), delta }, "add").await
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.value(&Request::CompareSet { key: &wire(key), expected, desired }, "compare_set").await
    }

    /// A watch on the key, then a CHECK: nothing queues behind the wait on the connection.
    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        let deadline = Instant::now() + timeout;
        let (mux, subscription, mut events) = self.subscribe(vec![(WatchMode::Key, wire(key))]).await?;
        let _unsubscribe = Unsubscribe(&mux, Some(subscription));
        if self.check(key).await? {
            return Ok(true);
        }
        loop {
            match timeout_at(deadline, events.recv()).await {
                Ok(Some(WatchEvent { kind: WatchEventKind::Written, .. })) => return Ok(true),
                Ok(Some(_)) => {}
                Ok(None) => return Err(StoreError::Closed { addr: self.addr, op: "wait" }),
                Err(_) => return Ok(false),
            }
        }
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let keys: Vec<Vec<u8>> = pairs.iter().map(|(k, _)| wire(k)).collect();
        let pairs = keys.iter().zip(pairs).map(|(k, (_, v))| (k.as_slice(), v.as_slice())).collect();
        self.post(&Request::MultiSet { pairs }, "multi_set").await
    }

    /// Missing (and empty) keys are left out; nothing waits for them.
    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wires: Vec<Vec<u8>> = keys.iter().map(|k| wire(k)).collect();
        let request = Request::MultiGet { keys: wires.iter().map(Vec::as_slice).collect() };
        let (_, bytes) = self.call(&request, "multi_get").await?;
        match decode(ReplyShape::Values(keys.len() as u64), &bytes, self.addr, "multi_get")? {
            Reply::Values(values) => Ok(values.into_iter().map(|v| (!v.is_empty()).then(|| v.to_vec())).collect()),
            _ => Err(self.shape("multi_get")),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (_, bytes) = self.call(&Request::ListKeys, "list_keys").await?;
        let Reply::Keys(keys) = decode(ReplyShape::Keys, &bytes, self.addr, "list_keys")? else {
            return Err(self.shape("list_keys"));
        };
        Ok(keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(b"/"))
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .filter(|k| k.starts_with(prefix))
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        // A session key deleted on purpose (leaving, no longer waiting) is not set again on a reconnect.
        self.sessions().remove(key);
        Ok(self.int(&Request::DeleteKey { key: &wire(key) }, "delete_key").await? == 1)
    }

    /// Recorded before it is sent: a reconnect in between sets it too. Cancel-safe: once the call got as
    /// far as sending, the key is set.
    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.sessions().insert(key.to_owned(), value.to_vec());
        self.post(&Request::SetSession { key: &wire(key), value }, "set_session").await
    }

    /// A `set` and a CHECK behind it, whose reply (replies come in order) says the store has the set. On
    /// the one connection a heartbeat never waits behind a long wait.
    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        self.acknowledged(timeout, "heartbeat", async {
            self.set(key, value).await?;
            self.check(key).await.map(drop)
        })
        .await
    }

    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        self.acknowledged(timeout, "ping", async { self.check(key).await.map(drop) }).await
    }

    async fn reach(&self, timeout: Duration) -> Reach {
        crate::store::reach_any(&[self.addr.to_string()], timeout).await
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        if targets.is_empty() {
            return Ok(mpsc::unbounded_channel().1);
        }
        let patterns = targets
            .iter()
            .map(|t| match t {
                WatchTarget::Key(key) => (WatchMode::Key, wire(key)),
                WatchTarget::Prefix(prefix) => (WatchMode::Prefix, wire(prefix)),
            })
            .collect();
        // Ends when its receiver is dropped (swept at a later watch or wait) or the connection fails.
        let (_, _, events) = self.subscribe(patterns).await?;
        Ok(events)
    }
}
