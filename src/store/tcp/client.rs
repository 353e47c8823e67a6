//! Async client for torch's TCPStore protocol, as torch's own client speaks it: talks to torch's libuv
//! and legacy servers and to muster's (muster's agents use one tagged connection instead: `super::mux`).
//!
//! Keys are namespaced exactly as torch's client does (`/` + key), so muster and torch
//! processes sharing a store see the same keys. Every network wait has a deadline: the client's
//! timeout, or the one given to `wait`/`barrier`. After a timeout or an I/O error mid-request,
//! or a request whose future was dropped before its reply was read (inside `select!` or
//! `timeout`), the connection is out of step with the server and every later call fails with
//! [`StoreError::Broken`] rather than read another request's reply; reconnect.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use super::frame::{
    FrameError, Reply, ReplyDecoder, ReplyShape, Request, STOP_WAITING,
    WAIT_CANCELED,
};
use crate::store::StoreError;
use reply::{
    byte_of, int_of, item_of, keys_of, nonce_of, value_of, values_of, wire, wires,
};

pub(super) mod connect;
mod reply;
#[cfg(test)]
pub(crate) mod tests;

pub use connect::FOREIGN_ATTEMPTS;
use connect::jitter_seed;

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
    /// A request was begun and has not completed; seen by the next [`Client::begin`], it means
    /// the request's future was dropped midway and the connection is out of step.
    in_flight: bool,
}

impl Client {
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
        self.post(
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

    /// The key's value at once, without waiting: a missing key reads as empty on muster's and
    /// libuv's servers (torch's legacy server closes the connection instead).
    pub async fn get_now(&mut self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.call(&Request::Get { key: &wire(key) }, "get", value_of)
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
        self.post(&Request::MultiSet { pairs }, "multi_set").await
    }

    /// Appends to the key's value, creating it if missing.
    pub async fn append(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.post(
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
        self.post(
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
        self.begin()?;
        let request = Request::Barrier {
            key: &key,
            world_size,
        };
        let result = match self.send(&request, "barrier").await {
            Ok(()) => self.await_release("barrier", timeout, &[&key]).await,
            Err(e) => Err(e),
        };
        self.end(result)
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

    /// WAIT on `keys` with torch's timeout protocol.
    async fn await_keys(
        &mut self,
        keys: &[&[u8]],
        timeout: Duration,
        op: &'static str,
    ) -> Result<(), StoreError> {
        self.begin()?;
        let request = Request::Wait {
            keys: keys.to_vec(),
        };
        let result = match self.send(&request, op).await {
            Ok(()) => self.await_release(op, timeout, keys).await,
            Err(e) => Err(e),
        };
        self.end(result)
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
        self.begin()?;
        let result = match self.send(request, op).await {
            Ok(()) => {
                let deadline = Instant::now() + self.timeout;
                self.receive(shape, op, deadline, convert).await
            }
            Err(e) => Err(e),
        };
        self.end(result)
    }

    /// Sends a request that has no reply.
    async fn post(&mut self, request: &Request<'_>, op: &'static str) -> Result<(), StoreError> {
        self.begin()?;
        let result = self.send(request, op).await;
        self.end(result)
    }

    /// Starts a request: refuses a connection that is broken or whose previous request was
    /// abandoned midway (its future dropped, so its reply may still arrive).
    pub(super) fn begin(&mut self) -> Result<(), StoreError> {
        self.usable()?;
        self.in_flight = true;
        Ok(())
    }

    /// Ends a request that ran to completion, successfully or with an error that already marked
    /// the connection broken where it must be.
    pub(super) fn end<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        self.in_flight = false;
        result
    }

    pub(super) fn usable(&mut self) -> Result<(), StoreError> {
        if self.in_flight {
            self.broken = true;
        }
        if self.broken {
            return Err(StoreError::Broken { addr: self.addr });
        }
        Ok(())
    }

    /// Whether the next request can use this connection: no error left it out of step and no
    /// request was abandoned midway.
    pub fn is_usable(&self) -> bool {
        !self.broken && !self.in_flight
    }

    /// Returns when the server closes this idle connection (or sends something unasked, which
    /// leaves it out of step): for a connection that holds session keys, the moment they are
    /// gone. Cancel-safe; the connection is broken afterwards.
    pub async fn closed(&mut self) {
        if self.usable().is_ok() {
            self.input.reserve(64);
            // Whatever the read returns (end of file, bytes nobody asked for, an error), the
            // connection is no longer one whose next reply can be trusted.
            let _ = self.stream.read_buf(&mut self.input).await;
            self.broken = true;
        }
    }

    /// Writes `request` after anything already in the output buffer. Part of a request begun
    /// with [`Client::begin`].
    pub(super) async fn send(&mut self, request: &Request<'_>, op: &'static str) -> Result<(), StoreError> {
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

    pub(super) async fn receive<T>(
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
    pub(super) async fn try_receive<T>(
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
