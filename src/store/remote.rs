//! The [`Store`] trait over TCP: a client of muster's store server (or, for everything but session keys and
//! watches, torch's). Requests and session keys share one connection, so the session keys (this agent's
//! liveness) live exactly as long as that connection; each watch gets a connection of its own.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};

use super::tcp::Client;
use super::{Store, StoreError, WatchEvent, WatchTarget};

pub struct RemoteStore {
    client: Mutex<Client>,
    addr: SocketAddr,
    timeout: Duration,
}

impl RemoteStore {
    /// Connects, retrying until `connect_timeout`; `timeout` then bounds every request.
    pub async fn connect(addr: SocketAddr, connect_timeout: Duration, timeout: Duration) -> Result<RemoteStore, StoreError> {
        let mut client = Client::connect(addr, connect_timeout).await?;
        client.set_timeout(timeout);
        Ok(RemoteStore { client: Mutex::new(client), addr, timeout })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Store for RemoteStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.client.lock().await.set(key, value).await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut c = self.client.lock().await;
        if !c.check(&[key]).await? {
            return Ok(None);
        }
        c.get(key).await.map(Some)
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.client.lock().await.add(key, delta).await
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.client.lock().await.compare_set(key, expected, desired).await
    }

    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        match self.client.lock().await.wait(&[key], timeout).await {
            Ok(()) => Ok(true),
            Err(StoreError::WaitTimeout { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
        self.client.lock().await.multi_set(&pairs).await
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.client.lock().await.multi_get(&keys).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let keys = self.client.lock().await.list_keys().await?;
        Ok(keys.into_iter().filter(|k| k.starts_with(prefix)).collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.client.lock().await.delete_key(key).await
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.client.lock().await.set_session(key, value).await
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
