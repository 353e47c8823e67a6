//! The connection that holds a [`super::RemoteStore`]'s session keys (its owner's liveness), owned by one
//! task. Every `set_session` runs there to completion even when its caller is cancelled, so the connection
//! never goes out of step, and nothing else (no wait, no read) shares it. Should it break (the server closed
//! it, a write failed), the task connects again and sets every session key this handle set and did not
//! delete: the session is re-established, in one log line. The task ends, closing the connection and so
//! ending the session, when the store handle is dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::store::tcp::Client;
use crate::store::StoreError;

enum Command {
    Set { key: String, value: Vec<u8>, done: oneshot::Sender<Result<(), StoreError>> },
    /// A plain key (a heartbeat): written here so it never waits behind this handle's long requests.
    Beat { key: String, value: Vec<u8>, done: oneshot::Sender<Result<(), StoreError>> },
    Forget(String),
}

pub(super) struct Liveness {
    commands: mpsc::UnboundedSender<Command>,
    addr: SocketAddr,
}

impl Liveness {
    /// Starts the task; it connects on the first session key (torch's servers have none).
    pub(super) fn start(addr: SocketAddr, timeout: Duration) -> Liveness {
        let (commands, rx) = mpsc::unbounded_channel();
        let session = Session { addr, timeout, client: None, keys: BTreeMap::new(), connected_before: false };
        tokio::spawn(session.run(rx));
        Liveness { commands, addr }
    }

    /// Sets a session key; returns once the server applied it. Cancel-safe: dropped, the key is still set.
    pub(super) async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let (done, result) = oneshot::channel();
        let command = Command::Set { key: key.to_owned(), value: value.to_vec(), done };
        let gone = || StoreError::Closed { addr: self.addr, op: "set_session" };
        self.commands.send(command).map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }

    /// Writes a plain key (not a session key) on this connection; returns once the server applied it.
    /// Cancel-safe as `set`.
    pub(super) async fn beat(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let (done, result) = oneshot::channel();
        let command = Command::Beat { key: key.to_owned(), value: value.to_vec(), done };
        let gone = || StoreError::Closed { addr: self.addr, op: "set" };
        self.commands.send(command).map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }

    /// The key is deleted on purpose: a reconnect does not set it again.
    pub(super) fn forget(&self, key: &str) {
        let _ = self.commands.send(Command::Forget(key.to_owned()));
    }
}

struct Session {
    addr: SocketAddr,
    timeout: Duration,
    client: Option<Client>,
    /// Every session key this handle set and did not delete, as it set them.
    keys: BTreeMap<String, Vec<u8>>,
    /// A later connect re-establishes a session (and says so).
    connected_before: bool,
}

impl Session {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let command = match self.client.as_mut() {
                Some(client) => tokio::select! {
                    command = commands.recv() => command,
                    () = client.closed() => {
                        self.client = None;
                        if let Err(e) = self.reconnect().await {
                            tracing::warn!("could not re-establish the session: {e}");
                        }
                        continue;
                    }
                },
                None => commands.recv().await,
            };
            // The store handle is gone: closing the connection ends the session, as it should.
            let Some(command) = command else { return };
            match command {
                Command::Forget(key) => {
                    self.keys.remove(&key);
                }
                Command::Set { key, value, done } => {
                    self.keys.insert(key.clone(), value.clone());
                    let _ = done.send(self.set(&key, &value, Write::Session).await);
                }
                Command::Beat { key, value, done } => {
                    let _ = done.send(self.set(&key, &value, Write::Plain).await);
                }
            }
        }
    }

    /// `write` on the current connection if it works, else on a new one that first gets every session key
    /// again (which already holds a session key being set).
    async fn set(&mut self, key: &str, value: &[u8], kind: Write) -> Result<(), StoreError> {
        if let Some(client) = self.client.as_mut() {
            match write(client, kind, key, value).await {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!("write on the liveness connection failed ({e}); reconnecting"),
            }
            self.client = None;
        }
        self.reconnect().await?;
        match (self.keys.contains_key(key), self.client.as_mut()) {
            (true, _) => Ok(()),
            (false, Some(client)) => write(client, kind, key, value).await,
            (false, None) => Err(StoreError::Closed { addr: self.addr, op: "set" }),
        }
    }

    /// Connects (within the request timeout) and sets every session key of this handle on the new
    /// connection.
    async fn reconnect(&mut self) -> Result<(), StoreError> {
        let mut client = Client::connect(self.addr, self.timeout).await?;
        for (key, value) in &self.keys {
            write(&mut client, Write::Session, key, value).await?;
        }
        if self.connected_before {
            tracing::warn!(
                "the connection holding this agent's session keys broke; re-established the session with the \
                 store at {} ({} key(s) set again)",
                self.addr,
                self.keys.len()
            );
        }
        self.connected_before = true;
        self.client = Some(client);
        Ok(())
    }
}

/// What a write on the liveness connection is.
#[derive(Clone, Copy)]
enum Write {
    Session,
    Plain,
}

/// One write on the liveness connection, confirmed: the PING after it returns once the server applied it,
/// so the caller's next request, on another connection, sees the key.
async fn write(client: &mut Client, kind: Write, key: &str, value: &[u8]) -> Result<(), StoreError> {
    match kind {
        Write::Session => client.set_session(key, value).await?,
        Write::Plain => client.set(key, value).await?,
    }
    client.ping().await
}
