//! One tagged connection to a muster server (see `HELLO` in [`super::frame`]) that carries every
//! request, session key and watch of its owner, so an agent needs one connection in all, whatever
//! runs at once.
//!
//! Requests are written by one writer task, in the order they are issued, and replies come back in
//! that order; watch events arrive in between, tagged. A request's future holds only the receiving
//! end of its reply: dropped anywhere (a `select!`, a timeout), the reply is read and discarded by
//! the reader task, so the connection never goes out of step. Writes without a reply (SET) return
//! once written; TCP's order makes the server apply them before anything this owner sends next. A
//! wait is a watch plus a CHECK, never a blocking WAIT, so nothing queues behind it. When the
//! connection fails (I/O error, the server closed it, a request got no reply in time) every
//! pending request fails, every watch channel closes, and the owner connects again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, watch};

use super::client::connect::{open, retry, OnRefused};
use super::frame::{Reply, ReplyDecoder, ReplyShape, Request, WatchMode, HELLO_OK, HELLO_VERSION};
use crate::store::StoreError;

mod reader;

use reader::{Reader, Subscribers};
pub use reader::Subscription;

/// Largest reply accepted, in bytes.
const MAX_REPLY_BYTES: usize = 1 << 30;
/// Requests written in one go when several are queued.
const BATCH_BYTES: usize = 64 << 10;

/// A request waiting for its reply: the shape to decode it with and where the bytes go.
struct Pending {
    shape: ReplyShape,
    reply: oneshot::Sender<Vec<u8>>,
}

/// What the reader and writer share.
struct Shared {
    /// Requests awaiting a reply, in the order they were written. `None` once the connection failed.
    pending: Mutex<Option<std::collections::VecDeque<Pending>>>,
    subscribers: Mutex<Subscribers>,
    failed: AtomicBool,
    /// Set when the connection fails: ends the reader and the writer.
    stop: watch::Sender<bool>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Option<std::collections::VecDeque<Pending>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn subscribers(&self) -> MutexGuard<'_, Subscribers> {
        self.subscribers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection is done: fail every pending request (their senders dropped), close every watch.
    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.pending().take();
        self.subscribers().close();
        self.stop.send_replace(true);
    }

    /// Resolves once the connection failed.
    async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        let _ = stop.wait_for(|stopped| *stopped).await;
    }
}

struct Command {
    bytes: Vec<u8>,
    pending: Option<Pending>,
    /// Told once the bytes are written (or the connection failed first).
    written: Option<oneshot::Sender<()>>,
}

/// One tagged connection; clone-free, shared by reference.
pub struct Mux {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    addr: SocketAddr,
    timeout: Duration,
}

impl Mux {
    /// Connects and says `HELLO` with `token`, retrying as [`super::Client::connect`] until `timeout`,
    /// which then bounds every request.
    pub async fn connect(addr: SocketAddr, token: &[u8], timeout: Duration) -> Result<Mux, StoreError> {
        retry(addr, timeout, OnRefused::Wait, || Mux::handshake(addr, token, timeout)).await
    }

    /// Connects again to a store that answered before: as [`Mux::connect`], but a refused connection is
    /// [`StoreError::Refused`] at once (the store's process ended), not a store still starting.
    pub async fn reconnect(addr: SocketAddr, token: &[u8], timeout: Duration) -> Result<Mux, StoreError> {
        retry(addr, timeout, OnRefused::Final, || Mux::handshake(addr, token, timeout)).await
    }

    async fn handshake(addr: SocketAddr, token: &[u8], timeout: Duration) -> Result<Mux, StoreError> {
        let (read, write) = open(addr).await?.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(Default::default())),
            subscribers: Mutex::new(Subscribers::default()),
            failed: AtomicBool::new(false),
            stop: watch::Sender::new(false),
        });
        let (commands, queue) = mpsc::unbounded_channel();
        tokio::spawn(Reader::new(read, shared.clone(), MAX_REPLY_BYTES).run());
        tokio::spawn(write_loop(write, queue, shared.clone()));
        let mux = Mux { commands, shared, addr, timeout };
        let answer = mux.call(&Request::Hello { version: HELLO_VERSION, token }, "hello").await?;
        match decode(ReplyShape::Byte, &answer, addr, "hello")? {
            Reply::Byte(HELLO_OK) => Ok(mux),
            Reply::Byte(_) => Err(StoreError::WrongToken { addr }),
            _ => Err(StoreError::Protocol { addr, op: "hello", source: shape_error() }),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bounds every later request by `timeout` (connecting may have had another deadline).
    pub fn with_timeout(mut self, timeout: Duration) -> Mux {
        self.timeout = timeout;
        self
    }

    /// Gives the connection up (its owner found it unanswered): pending requests fail, watches close, the
    /// owner connects again.
    pub fn break_off(&self) {
        self.shared.fail();
    }

    /// Whether the connection failed (the owner should connect again).
    pub fn is_failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Sends a request that has a reply and returns the reply's bytes (decode them with
    /// [`decode`]). No reply within the timeout fails the connection.
    pub async fn call(&self, request: &Request<'_>, op: &'static str) -> Result<Vec<u8>, StoreError> {
        let Some(shape) = request.reply_shape() else {
            return Err(StoreError::Protocol { addr: self.addr, op, source: shape_error() });
        };
        let (reply, answer) = oneshot::channel();
        self.submit(request, Some(Pending { shape, reply }), None, op)?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(_)) => Err(StoreError::Closed { addr: self.addr, op }),
            Err(_) => {
                // The server is stuck or gone without closing: nothing later would be answered either.
                self.shared.fail();
                Err(StoreError::Timeout { addr: self.addr, op, timeout: self.timeout })
            }
        }
    }

    /// Sends a request that has no reply; returns once it is written.
    pub async fn post(&self, request: &Request<'_>, op: &'static str) -> Result<(), StoreError> {
        let (written, done) = oneshot::channel();
        self.submit(request, None, Some(written), op)?;
        match tokio::time::timeout(self.timeout, done).await {
            Ok(Ok(())) if !self.is_failed() => Ok(()),
            Ok(_) => Err(StoreError::Closed { addr: self.addr, op }),
            Err(_) => {
                self.shared.fail();
                Err(StoreError::Timeout { addr: self.addr, op, timeout: self.timeout })
            }
        }
    }

    fn submit(
        &self,
        request: &Request<'_>,
        pending: Option<Pending>,
        written: Option<oneshot::Sender<()>>,
        op: &'static str,
    ) -> Result<(), StoreError> {
        let mut bytes = Vec::new();
        request.encode(&mut bytes);
        let command = Command { bytes, pending, written };
        self.commands.send(command).map_err(|_| StoreError::Closed { addr: self.addr, op })
    }

    /// Follows `targets` (key or prefix patterns in wire form); returns once the server registered
    /// every one, so a read issued next misses no change. Events go to `events` until
    /// [`Mux::unsubscribe`], until its receiver is dropped (then the next [`Mux::sweep`] unwatches),
    /// or until the connection fails (the sender is dropped: the channel closes).
    pub async fn watch(
        &self,
        targets: Vec<(WatchMode, Vec<u8>)>,
        events: mpsc::UnboundedSender<crate::store::WatchEvent>,
    ) -> Result<Subscription, StoreError> {
        let (subscription, new) = self.shared.subscribers().add(targets, events);
        // Registered in the table first: events of a pattern already watched reach it from now on.
        for (mode, pattern) in new {
            self.call(&Request::Watch { mode, pattern: &pattern }, "watch").await?;
        }
        Ok(subscription)
    }

    /// Sends the UNWATCHes a dropped subscription left due (patterns no other subscription follows).
    fn unwatch(&self, patterns: Vec<(WatchMode, Vec<u8>)>) {
        for (mode, pattern) in patterns {
            let _ = self.submit(&Request::Unwatch { mode, pattern: &pattern }, None, None, "unwatch");
        }
    }

    /// Ends a subscription now (rather than at the next event it would have missed).
    pub fn unsubscribe(&self, subscription: Subscription) {
        let due = self.shared.subscribers().remove(subscription);
        self.unwatch(due);
    }

    /// Sends the UNWATCHes of subscriptions whose receivers were dropped.
    pub fn sweep(&self) {
        let due = self.shared.subscribers().take_due();
        self.unwatch(due);
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        // Ends the reader too: the writer's half closes, the server closes its side.
        self.shared.fail();
    }
}

/// Decodes reply bytes [`Mux::call`] returned.
pub fn decode<'a>(shape: ReplyShape, bytes: &'a [u8], addr: SocketAddr, op: &'static str) -> Result<Reply<'a>, StoreError> {
    match ReplyDecoder::new(shape, MAX_REPLY_BYTES).decode(bytes) {
        Ok(Some((reply, _))) => Ok(reply),
        Ok(None) => Err(StoreError::Protocol { addr, op, source: super::frame::FrameError::Malformed("truncated reply") }),
        Err(source) => Err(StoreError::Protocol { addr, op, source }),
    }
}

fn shape_error() -> super::frame::FrameError {
    super::frame::FrameError::Malformed("a reply of another shape")
}

/// Writes queued requests in order, several per write when they queue up, until the connection fails
/// or its owner is gone.
async fn write_loop(mut write: OwnedWriteHalf, mut queue: mpsc::UnboundedReceiver<Command>, shared: Arc<Shared>) {
    let mut buf = Vec::new();
    let mut acks = Vec::new();
    loop {
        let command = tokio::select! {
            command = queue.recv() => command,
            () = shared.stopped() => None,
        };
        let Some(mut command) = command else { break };
        loop {
            if !enqueue(&shared, &mut command) {
                break;
            }
            buf.append(&mut command.bytes);
            acks.extend(command.written.take());
            match queue.try_recv() {
                Ok(next) if buf.len() < BATCH_BYTES => command = next,
                Ok(next) => {
                    // Too much for one write: this one waits for the next round.
                    if !flush(&mut write, &mut buf, &mut acks, &shared).await {
                        return;
                    }
                    command = next;
                }
                Err(_) => break,
            }
        }
        if !flush(&mut write, &mut buf, &mut acks, &shared).await {
            return;
        }
    }
    shared.fail();
    let _ = write.shutdown().await;
}

/// Registers the command's reply slot before its bytes go out, so the reader always finds it; false
/// when the connection already failed.
fn enqueue(shared: &Shared, command: &mut Command) -> bool {
    match shared.pending().as_mut() {
        Some(pending) => {
            pending.extend(command.pending.take());
            true
        }
        None => false,
    }
}

async fn flush(write: &mut OwnedWriteHalf, buf: &mut Vec<u8>, acks: &mut Vec<oneshot::Sender<()>>, shared: &Shared) -> bool {
    if buf.is_empty() {
        return true;
    }
    let result = tokio::select! {
        written = write.write_all(buf) => written,
        () = shared.stopped() => Err(std::io::ErrorKind::ConnectionAborted.into()),
    };
    buf.clear();
    if result.is_err() {
        shared.fail();
    }
    acks.drain(..).for_each(|ack| {
        let _ = ack.send(());
    });
    result.is_ok()
}

