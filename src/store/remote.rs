//! The [`Store`] trait over TCP: a client of muster's store server (or, for everything but session keys and
//! watches, torch's).
//!
//! Cancel-safe by construction: a request checks a connection out of a small pool (or connects a new one,
//! within the request timeout) and only a request that completed gives it back, so a request dropped inside
//! `select!` or `timeout` takes its connection with it and no later request can read its reply. Session keys
//! (this agent's liveness) and heartbeats live on a connection of their own, owned by a task ([`liveness`])
//! that runs every `set_session` and `beat` to completion even if its caller gives up, and sets the session
//! keys again on a new connection should it break. An agent holds three connections (the pool's one, the
//! liveness one, the round watch), a fourth only while a long wait runs beside another request. Each watch gets a connection of its own.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;

use super::tcp::Client;
use super::{Store, StoreError, WatchEvent, WatchTarget};

mod liveness;
#[cfg(test)]
mod tests;

use liveness::Liveness;

/// Idle connections kept for reuse; more are opened while more requests run at once (a long WAIT, the
/// heartbeat, the round watch's reads), and closed when they come back to a full pool.
const MAX_IDLE: usize = 4;

pub struct RemoteStore {
    idle: Mutex<Vec<Client>>,
    liveness: Liveness,
    addr: SocketAddr,
    timeout: Duration,
}

/// Runs one request on a pooled connection: `$c` is the connection, checked out before and given back after
/// only if the request left it usable. Dropped midway, the future drops the connection.
macro_rules! pooled {
    ($store:expr, $c:ident => $body:expr) => {{
        let mut $c = $store.checkout().await?;
        let result = $body;
        $store.checkin($c);
        result
    }};
}

impl RemoteStore {
    /// Connects, retrying until `connect_timeout`; `timeout` then bounds every request (and every later
    /// connect).
    pub async fn connect(addr: SocketAddr, connect_timeout: Duration, timeout: Duration) -> Result<RemoteStore, StoreError> {
        let mut client = Client::connect(addr, connect_timeout).await?;
        client.set_timeout(timeout);
        Ok(RemoteStore { idle: Mutex::new(vec![client]), liveness: Liveness::start(addr, timeout), addr, timeout })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Client>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn checkout(&self) -> Result<Client, StoreError> {
        let reused = self.idle().pop();
        match reused {
            Some(client) => Ok(client),
            None => Client::connect(self.addr, self.timeout).await,
        }
    }

    fn checkin(&self, client: Client) {
        let mut idle = self.idle();
        if client.is_usable() && idle.len() < MAX_IDLE {
            idle.push(client);
        }
    }
}

async fn get_now(c: &mut Client, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    if !c.check(&[key]).await? {
        return Ok(None);
    }
    let value = c.get_now(key).await?;
    if value.is_empty() && !c.check(&[key]).await? {
        return Ok(None);
    }
    Ok(Some(value))
}

impl Store for RemoteStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        // SET has no reply: the PING after it returns once the server applied it, so a request this agent
        // sends next on another connection cannot overtake it.
        pooled!(self, c => match c.set(key, value).await {
            Ok(()) => c.ping().await,
            Err(e) => Err(e),
        })
    }

    /// Never waits: a key deleted between the check and the read reads as empty, and is then checked again
    /// (torch's `get` would wait the whole request timeout for it to come back).
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        pooled!(self, c => get_now(&mut c, key).await)
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        pooled!(self, c => c.add(key, delta).await)
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        pooled!(self, c => c.compare_set(key, expected, desired).await)
    }

    /// A long wait holds its own connection; nothing else waits behind it.
    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        pooled!(self, c => match c.wait(&[key], timeout).await {
            Ok(()) => Ok(true),
            Err(StoreError::WaitTimeout { .. }) => Ok(false),
            Err(e) => Err(e),
        })
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
        // As `set`: applied before the next request (the rendezvous writes assignments before the seal).
        pooled!(self, c => match c.multi_set(&pairs).await {
            Ok(()) => c.ping().await,
            Err(e) => Err(e),
        })
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        pooled!(self, c => c.multi_get(&keys).await)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let keys = pooled!(self, c => c.list_keys().await)?;
        Ok(keys.into_iter().filter(|k| k.starts_with(prefix)).collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        // A session key deleted on purpose (leaving, no longer waiting) is not set again on a reconnect.
        self.liveness.forget(key);
        pooled!(self, c => c.delete_key(key).await)
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.liveness.set(key, value).await
    }

    async fn beat(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.liveness.beat(key, value).await
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        let Some((first, rest)) = targets.split_first() else {
            return Ok(mpsc::unbounded_channel().1);
        };
        let client = Client::connect(self.addr, self.timeout).await?;
        let mut watcher = client.watch(first.clone()).await?;
        for target in rest {
            watcher.watch(target.clone()).await?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // The owner dropped the receiver: close this connection.
                    () = tx.closed() => return,
                    event = watcher.next_event(Duration::from_secs(3600)) => match event {
                        Ok(Some(event)) => {
                            if tx.send(event).is_err() {
                                return;
                            }
                        }
                        Ok(None) => {}
                        // The channel closing tells the owner the store is gone.
                        Err(e) => {
                            tracing::debug!("watch connection ended: {e}");
                            return;
                        }
                    },
                }
            }
        });
        Ok(rx)
    }
}
