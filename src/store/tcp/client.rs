//! Async client for torch's TCPStore protocol: talks to torch's libuv and legacy servers and to
//! muster's, whose extensions (session-bound keys, watches) it also speaks.
//!
//! Keys are namespaced exactly as torch's client does (`/` + key), so muster and torch
//! processes sharing a store see the same keys. Every network wait has a deadline: the client's
//! timeout, or the one given to `wait`/`barrier`. After a timeout or an I/O error mid-request
//! the connection is out of step with the server and every later call fails with
//! [`StoreError::Broken`]; reconnect.

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout_at, Instant};

use super::frame::{
    EventKind, FrameError, Reply, ReplyDecoder, ReplyShape, Request, WatchMode, STOP_WAITING,
    VALIDATE_MAGIC, WAIT_CANCELED,
};
use crate::store::StoreError;

/// Largest reply accepted, in bytes.
const MAX_REPLY_BYTES: usize = 1 << 30;

/// One connection to a store.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    addr: SocketAddr,
    timeout: Duration,
    input: Vec<u8>,
    output: Vec<u8>,
    broken: bool,
}

impl Client {
    /// Connects and handshakes (VALIDATE, then PING with this process id, as torch's client),
    /// retrying with jittered exponential backoff until `timeout`, which then also bounds every
    /// later request.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(50);
        loop {
            let last = match timeout_at(deadline, Client::handshake(addr, timeout)).await {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(err)) => err.to_string(),
                Err(_) => "handshake timed out".to_owned(),
            };
            let delay_now = jittered(delay);
            if Instant::now() + delay_now >= deadline {
                return Err(StoreError::Connect {
                    addr,
                    timeout,
                    last,
                });
            }
            sleep(delay_now).await;
            delay = (delay * 3 / 2).min(Duration::from_secs(2));
        }
    }

    async fn handshake(addr: SocketAddr, timeout: Duration) -> Result<Client, StoreError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| StoreError::Io {
                addr,
                op: "connect",
                source,
            })?;
        stream.set_nodelay(true).map_err(|source| StoreError::Io {
            addr,
            op: "connect",
            source,
        })?;
        let mut client = Client {
            stream,
            addr,
            timeout,
            input: Vec::new(),
            output: Vec::new(),
            broken: false,
        };
        // One write: torch's libuv server drops a client whose VALIDATE arrives split.
        let nonce = std::process::id();
        Request::Validate {
            magic: VALIDATE_MAGIC,
        }
        .encode(&mut client.output);
        let got = client
            .call(&Request::Ping { nonce }, "ping", nonce_of)
            .await?;
        if got != nonce {
            return Err(StoreError::Handshake {
                addr,
                expected: nonce,
                got,
            });
        }
        Ok(client)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    pub async fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(
            &Request::Set {
                key: &wire(key),
                value,
            },
            "set",
        )
        .await
    }

    /// The key's value, waiting up to the client timeout for it to be set (torch's `get`).
    pub async fn get(&mut self, key: &str) -> Result<Vec<u8>, StoreError> {
        let key = wire(key);
        self.await_keys(&[&key], self.timeout, "get").await?;
        self.call(&Request::Get { key: &key }, "get", value_of)
            .await
    }

    /// Adds `delta` to the key's decimal value (missing = 0) and returns the sum.
    pub async fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.call(
            &Request::Add {
                key: &wire(key),
                delta,
            },
            "add",
            int_of,
        )
        .await
    }

    /// Sets the key to `desired` if its value is `expected` (or it is missing and `expected` is
    /// empty); returns the value now stored — or `expected` when the key is missing.
    pub async fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let request = Request::CompareSet {
            key: &wire(key),
            expected,
            desired,
        };
        self.call(&request, "compare_set", value_of).await
    }

    /// Whether every key is set.
    pub async fn check(&mut self, keys: &[&str]) -> Result<bool, StoreError> {
        let keys = wires(keys);
        let request = Request::Check {
            keys: keys.iter().map(Vec::as_slice).collect(),
        };
        Ok(self.call(&request, "check", byte_of).await? == super::frame::CHECK_READY)
    }

    /// Waits until every key is set, or fails with [`StoreError::WaitTimeout`] after `timeout`.
    pub async fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let keys = wires(keys);
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.await_keys(&keys, timeout, "wait").await
    }

    /// Deletes the key; true if it existed.
    pub async fn delete_key(&mut self, key: &str) -> Result<bool, StoreError> {
        Ok(self
            .call(
                &Request::DeleteKey { key: &wire(key) },
                "delete_key",
                int_of,
            )
            .await?
            == 1)
    }

    /// Number of keys in the whole store (not only this client's namespace, as torch).
    pub async fn num_keys(&mut self) -> Result<i64, StoreError> {
        self.call(&Request::GetNumKeys, "num_keys", int_of).await
    }

    /// The keys' values in order, waiting up to the client timeout for all of them.
    pub async fn multi_get(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        let keys = wires(keys);
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.await_keys(&keys, self.timeout, "multi_get").await?;
        self.call(&Request::MultiGet { keys }, "multi_get", values_of)
            .await
    }

    pub async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
        let keys = wires(&pairs.iter().map(|(k, _)| *k).collect::<Vec<_>>());
        let pairs = keys
            .iter()
            .zip(pairs)
            .map(|(k, (_, v))| (k.as_slice(), *v))
            .collect();
        self.send(&Request::MultiSet { pairs }, "multi_set").await
    }

    /// Appends to the key's value, creating it if missing.
    pub async fn append(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(
            &Request::Append {
                key: &wire(key),
                value,
            },
            "append",
        )
        .await
    }

    /// Pushes onto a queue (torch's libuv server and muster's only).
    pub async fn queue_push(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(
            &Request::QueuePush {
                key: &wire(key),
                value,
            },
            "queue_push",
        )
        .await
    }

    /// Pops the queue's head; with `block`, first waits up to the client timeout for an item,
    /// else returns `None` on an empty queue.
    pub async fn queue_pop(
        &mut self,
        key: &str,
        block: bool,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let key = wire(key);
        if block {
            self.await_keys(&[&key], self.timeout, "queue_pop").await?;
        }
        self.call(&Request::QueuePop { key: &key }, "queue_pop", item_of)
            .await
    }

    pub async fn queue_len(&mut self, key: &str) -> Result<i64, StoreError> {
        self.call(&Request::QueueLen { key: &wire(key) }, "queue_len", int_of)
            .await
    }

    /// The store's keys in this client's namespace (torch's own `init/` key is not listed).
    pub async fn list_keys(&mut self) -> Result<Vec<String>, StoreError> {
        self.call(&Request::ListKeys, "list_keys", keys_of).await
    }

    /// Blocks until `world_size` callers reached the barrier `key`, at most `timeout`.
    pub async fn barrier(
        &mut self,
        key: &str,
        world_size: i64,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let key = wire(key);
        self.send(
            &Request::Barrier {
                key: &key,
                world_size,
            },
            "barrier",
        )
        .await?;
        self.await_release("barrier", timeout, &[&key]).await
    }

    /// Round trip to the server.
    pub async fn ping(&mut self) -> Result<(), StoreError> {
        let nonce = jitter_seed() as u32;
        let got = self
            .call(&Request::Ping { nonce }, "ping", nonce_of)
            .await?;
        if got != nonce {
            self.broken = true;
            return Err(StoreError::Handshake {
                addr: self.addr,
                expected: nonce,
                got,
            });
        }
        Ok(())
    }

    /// Sets a key that the server deletes when this connection closes (muster servers only;
    /// torch's close the connection).
    pub async fn set_session(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(
            &Request::SetSession {
                key: &wire(key),
                value,
            },
            "set_session",
        )
        .await
    }

    /// Turns this connection into a watch connection (muster servers only). It keeps the
    /// session keys it set, and can still set more.
    pub async fn watch(self, target: WatchTarget) -> Result<Watcher, StoreError> {
        let mut watcher = Watcher {
            client: self,
            events: VecDeque::new(),
        };
        watcher.watch(target).await?;
        Ok(watcher)
    }

    /// WAIT on `keys` with torch's timeout protocol.
    async fn await_keys(
        &mut self,
        keys: &[&[u8]],
        timeout: Duration,
        op: &'static str,
    ) -> Result<(), StoreError> {
        self.send(
            &Request::Wait {
                keys: keys.to_vec(),
            },
            op,
        )
        .await?;
        self.await_release(op, timeout, keys).await
    }

    /// Reads the STOP_WAITING of a WAIT/BARRIER. At the deadline it sends CANCEL_WAIT and
    /// reads its WAIT_CANCELED (after a STOP_WAITING that may have raced it), as torch does,
    /// so the connection stays usable.
    async fn await_release(
        &mut self,
        op: &'static str,
        timeout: Duration,
        keys: &[&[u8]],
    ) -> Result<(), StoreError> {
        let deadline = Instant::now() + timeout;
        if let Some(byte) = self
            .try_receive(ReplyShape::Byte, op, deadline, byte_of)
            .await?
        {
            return self.expect_byte(byte, STOP_WAITING, op);
        }
        self.send(&Request::CancelWait, "cancel_wait").await?;
        let deadline = Instant::now() + self.timeout;
        let mut byte = self
            .receive(ReplyShape::Byte, "cancel_wait", deadline, byte_of)
            .await?;
        if byte == STOP_WAITING {
            byte = self
                .receive(ReplyShape::Byte, "cancel_wait", deadline, byte_of)
                .await?;
        }
        self.expect_byte(byte, WAIT_CANCELED, "cancel_wait")?;
        let keys = keys
            .iter()
            .map(|k| String::from_utf8_lossy(k))
            .collect::<Vec<_>>()
            .join(", ");
        Err(StoreError::WaitTimeout {
            addr: self.addr,
            op,
            timeout,
            keys,
        })
    }

    fn expect_byte(&mut self, got: u8, expected: u8, op: &'static str) -> Result<(), StoreError> {
        if got == expected {
            return Ok(());
        }
        self.broken = true;
        let source = FrameError::Malformed("unexpected reply byte");
        Err(StoreError::Protocol {
            addr: self.addr,
            op,
            source,
        })
    }

    /// Sends `request` (after anything already in the output buffer) and reads its reply.
    async fn call<T>(
        &mut self,
        request: &Request<'_>,
        op: &'static str,
        convert: impl FnOnce(Reply<'_>) -> Option<T>,
    ) -> Result<T, StoreError> {
        let shape = request.reply_shape().unwrap_or(ReplyShape::Byte);
        self.send(request, op).await?;
        let deadline = Instant::now() + self.timeout;
        self.receive(shape, op, deadline, convert).await
    }

    async fn send(&mut self, request: &Request<'_>, op: &'static str) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::Broken { addr: self.addr });
        }
        request.encode(&mut self.output);
        let deadline = Instant::now() + self.timeout;
        let result = timeout_at(deadline, self.stream.write_all(&self.output)).await;
        self.output.clear();
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(self.io_error(op, source)),
            Err(_) => Err(self.fail(StoreError::Timeout {
                addr: self.addr,
                op,
                timeout: self.timeout,
            })),
        }
    }

    async fn receive<T>(
        &mut self,
        shape: ReplyShape,
        op: &'static str,
        deadline: Instant,
        convert: impl FnOnce(Reply<'_>) -> Option<T>,
    ) -> Result<T, StoreError> {
        match self.try_receive(shape, op, deadline, convert).await? {
            Some(value) => Ok(value),
            None => Err(self.fail(StoreError::Timeout {
                addr: self.addr,
                op,
                timeout: self.timeout,
            })),
        }
    }

    /// Reads one reply of `shape`; `Ok(None)` if the deadline passes first.
    async fn try_receive<T>(
        &mut self,
        shape: ReplyShape,
        op: &'static str,
        deadline: Instant,
        convert: impl FnOnce(Reply<'_>) -> Option<T>,
    ) -> Result<Option<T>, StoreError> {
        let mut decoder = ReplyDecoder::new(shape, MAX_REPLY_BYTES);
        loop {
            match decoder.decode(&self.input) {
                Ok(Some((reply, n))) => {
                    let value = convert(reply);
                    self.input.drain(..n);
                    let source = FrameError::Malformed("reply of another shape");
                    let error = StoreError::Protocol {
                        addr: self.addr,
                        op,
                        source,
                    };
                    return value.map(Some).ok_or_else(|| self.fail(error));
                }
                Ok(None) => {}
                Err(source) => {
                    return Err(self.fail(StoreError::Protocol {
                        addr: self.addr,
                        op,
                        source,
                    }))
                }
            }
            self.input.reserve(4096);
            match timeout_at(deadline, self.stream.read_buf(&mut self.input)).await {
                Ok(Ok(0)) => {
                    return Err(self.fail(StoreError::Closed {
                        addr: self.addr,
                        op,
                    }))
                }
                Ok(Ok(_)) => {}
                Ok(Err(source)) => return Err(self.io_error(op, source)),
                Err(_) => return Ok(None),
            }
        }
    }

    /// A reset is how torch's legacy server refuses a request; report it as a close.
    fn io_error(&mut self, op: &'static str, source: io::Error) -> StoreError {
        let addr = self.addr;
        self.fail(match source.kind() {
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => StoreError::Closed { addr, op },
            _ => StoreError::Io { addr, op, source },
        })
    }

    fn fail(&mut self, error: StoreError) -> StoreError {
        self.broken = true;
        error
    }
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

/// A connection in watch mode (muster servers only): receives change events for the keys and
/// prefixes it watches. Watch first, then read the current state on another connection, to
/// miss no change.
#[derive(Debug)]
pub struct Watcher {
    client: Client,
    /// Events that arrived while waiting for a WATCH to be acknowledged.
    events: VecDeque<WatchEvent>,
}

impl Watcher {
    /// Adds a key or prefix to watch; returns once the server registered it.
    pub async fn watch(&mut self, target: WatchTarget) -> Result<(), StoreError> {
        let (mode, pattern) = match &target {
            WatchTarget::Key(key) => (WatchMode::Key, wire(key)),
            WatchTarget::Prefix(prefix) => (WatchMode::Prefix, wire(prefix)),
        };
        self.client
            .send(
                &Request::Watch {
                    mode,
                    pattern: &pattern,
                },
                "watch",
            )
            .await?;
        let deadline = Instant::now() + self.client.timeout;
        loop {
            let (kind, key) = self
                .client
                .receive(ReplyShape::Event, "watch", deadline, event_of)
                .await?;
            match kind {
                EventKind::Watching => return Ok(()),
                EventKind::Written => self
                    .events
                    .push_back(user_event(WatchEventKind::Written, &key)),
                EventKind::Deleted => self
                    .events
                    .push_back(user_event(WatchEventKind::Deleted, &key)),
            }
        }
    }

    /// The next event, or `None` if none comes within `timeout`.
    pub async fn next_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<WatchEvent>, StoreError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        let deadline = Instant::now() + timeout;
        loop {
            let Some((kind, key)) = self
                .client
                .try_receive(ReplyShape::Event, "watch", deadline, event_of)
                .await?
            else {
                return Ok(None);
            };
            let kind = match kind {
                EventKind::Watching => continue,
                EventKind::Written => WatchEventKind::Written,
                EventKind::Deleted => WatchEventKind::Deleted,
            };
            return Ok(Some(user_event(kind, &key)));
        }
    }

    /// [`Client::set_session`] on this connection (allowed in watch mode: it has no reply).
    pub async fn set_session(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.client.set_session(key, value).await
    }
}

fn user_event(kind: WatchEventKind, key: &[u8]) -> WatchEvent {
    let key = key.strip_prefix(b"/").unwrap_or(key);
    WatchEvent {
        kind,
        key: String::from_utf8_lossy(key).into_owned(),
    }
}

fn wire(key: &str) -> Vec<u8> {
    let mut wire = Vec::with_capacity(key.len() + 1);
    wire.push(b'/');
    wire.extend_from_slice(key.as_bytes());
    wire
}

fn wires(keys: &[&str]) -> Vec<Vec<u8>> {
    keys.iter().map(|k| wire(k)).collect()
}

fn byte_of(reply: Reply<'_>) -> Option<u8> {
    match reply {
        Reply::Byte(b) => Some(b),
        _ => None,
    }
}

fn nonce_of(reply: Reply<'_>) -> Option<u32> {
    match reply {
        Reply::Nonce(n) => Some(n),
        _ => None,
    }
}

fn int_of(reply: Reply<'_>) -> Option<i64> {
    match reply {
        Reply::Int(n) => Some(n),
        _ => None,
    }
}

fn value_of(reply: Reply<'_>) -> Option<Vec<u8>> {
    match reply {
        Reply::Value(v) => Some(v.to_vec()),
        _ => None,
    }
}

fn values_of(reply: Reply<'_>) -> Option<Vec<Vec<u8>>> {
    match reply {
        Reply::Values(values) => Some(values.into_iter().map(<[u8]>::to_vec).collect()),
        _ => None,
    }
}

fn item_of(reply: Reply<'_>) -> Option<Option<Vec<u8>>> {
    match reply {
        Reply::QueueItem { value, .. } => Some(value.map(<[u8]>::to_vec)),
        _ => None,
    }
}

/// Keys in the client namespace, without their `/`; others (torch's `init/`) left out.
fn keys_of(reply: Reply<'_>) -> Option<Vec<String>> {
    match reply {
        Reply::Keys(keys) => Some(
            keys.into_iter()
                .filter_map(|k| k.strip_prefix(b"/"))
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect(),
        ),
        _ => None,
    }
}

fn event_of(reply: Reply<'_>) -> Option<(EventKind, Vec<u8>)> {
    match reply {
        Reply::Event { kind, key } => Some((kind, key.to_vec())),
        _ => None,
    }
}

fn jitter_seed() -> u64 {
    RandomState::new().hash_one(Instant::now())
}

/// `delay` scaled by a random factor in [0.5, 1.5), so many clients retrying do not align.
fn jittered(delay: Duration) -> Duration {
    delay.mul_f64(0.5 + (jitter_seed() % 1000) as f64 / 1000.0)
}
