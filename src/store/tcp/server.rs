//! The store server: torch's TCPStore protocol over tokio, serving torch's own clients byte for
//! byte and muster's extensions (see [`super::frame`]).
//!
//! One task per connection reads, decodes and applies requests to the shared [`State`] (one
//! short critical section per request, never across I/O) and writes what the state queued for
//! it, so a slow or stuck client holds up nobody but itself.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use thiserror::Error;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

use super::frame::{FrameError, Query, Request, RequestDecoder, VALIDATE_MAGIC};
use super::state::{ConnId, Hello, Overflowed, Refusal, State};
use crate::store::StoreError;
pub use budget::Usage;
use budget::{Account, Budget};

mod budget;

/// Server limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest request or reply in bytes; a client exceeding it is disconnected. (torch's libuv
    /// server closes on keys over 8 KiB and values over 8 MiB; its legacy server has no limit.)
    pub max_frame_bytes: usize,
    /// Connections served at once; further ones are accepted and closed at once.
    pub max_connections: usize,
    /// TCP keepalive idle time (then probes at that interval, 3 tries) on accepted sockets, so
    /// the session keys of a host that vanished without closing its connections end too.
    pub keepalive: Option<Duration>,
    /// The job token an agent's `HELLO` must present; without one, any agent is let in (torch's
    /// clients are kept off muster's keys either way).
    pub token: Option<Vec<u8>>,
    /// A connection that has not completed a valid first request (the handshake) by then is
    /// closed, so idle connections cannot hold the connection slots.
    pub handshake_timeout: Duration,
    /// Bytes all connections together may buffer (unparsed input, output being written); past it
    /// the connections holding the most are closed. At least twice `max_frame_bytes`, or one
    /// largest request and its reply would not fit.
    pub max_buffered_bytes: usize,
}

/// The default `max_buffered_bytes` for a frame limit: four largest frames in flight at once.
pub fn default_buffered_bytes(max_frame_bytes: usize) -> usize {
    max_frame_bytes.saturating_mul(4)
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            max_frame_bytes: 64 << 20,
            max_connections: 16384,
            keepalive: Some(Duration::from_secs(10)),
            token: None,
            handshake_timeout: Duration::from_secs(5),
            max_buffered_bytes: default_buffered_bytes(64 << 20),
        }
    }
}

/// A running store server; dropping it (or [`Server::shutdown`]) stops it.
pub struct Server {
    local_addr: SocketAddr,
    state: Arc<Mutex<State>>,
    budget: Arc<Budget>,
    stop: watch::Sender<bool>,
    accept_tasks: Vec<JoinHandle<()>>,
}

/// Read size; also the output size past which replies are flushed before decoding more.
const CHUNK: usize = 64 << 10;
/// The kernel clamps the backlog to `net.core.somaxconn`, as torch's `listen(fd, -1)` does.
const BACKLOG: i32 = 65535;

impl Server {
    /// Binds `addr` and serves in background tasks. An unspecified address (`0.0.0.0`, `[::]`)
    /// binds dual-stack `[::]` like torch, falling back to `0.0.0.0` where IPv6 is off.
    pub async fn bind(addr: SocketAddr, config: ServerConfig) -> Result<Server, StoreError> {
        Server::bind_each(&[addr.ip()], addr.port(), config).await
    }

    /// Binds `port` on each of `ips` (the first one picks the port when it is 0; the others take
    /// the same), e.g. every address a host name resolves to. `ips` must not be empty.
    pub async fn bind_each(
        ips: &[IpAddr],
        port: u16,
        config: ServerConfig,
    ) -> Result<Server, StoreError> {
        let mut listeners: Vec<TcpListener> = Vec::with_capacity(ips.len());
        let mut local_addr = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
        for ip in ips {
            let addr = SocketAddr::new(*ip, local_addr.port());
            let listener = listen(addr)?;
            let bound = listener
                .local_addr()
                .map_err(|source| StoreError::Bind { addr, source })?;
            if listeners.is_empty() {
                local_addr = bound;
            }
            debug!(%bound, "store listening");
            listeners.push(listener);
        }
        let state = Arc::new(Mutex::new(State::new(config.max_frame_bytes, config.token.clone())));
        let budget = Arc::new(Budget::new(config.max_buffered_bytes));
        let slots = Arc::new(Semaphore::new(config.max_connections));
        let (stop, stopped) = watch::channel(false);
        let accept_tasks = listeners
            .into_iter()
            .map(|listener| {
                let shared = Shared {
                    state: state.clone(),
                    budget: budget.clone(),
                    slots: slots.clone(),
                    config: config.clone(),
                };
                tokio::spawn(accept_loop(listener, shared, stopped.clone()))
            })
            .collect();
        Ok(Server {
            local_addr,
            state,
            budget,
            stop,
            accept_tasks,
        })
    }

    /// The first address bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn port(&self) -> u16 {
        self.local_addr.port()
    }

    /// Deletes every key and queue, e.g. before workers (re)start: torch's agent store keeps
    /// stale keys across restarts (pytorch issue #135712). Pending waits stay pending.
    pub async fn clear(&self) {
        lock(&self.state).clear();
    }

    /// Like [`Server::clear`], but keeps the keys under `keep` (as the client names them, without
    /// torch's leading `/`), e.g. the agents' rendezvous keys in a store the workers share.
    pub async fn clear_except(&self, keep: &str) {
        let mut wire = Vec::with_capacity(keep.len() + 1);
        wire.push(b'/');
        wire.extend_from_slice(keep.as_bytes());
        lock(&self.state).clear_except(&wire);
    }

    /// Connections parked in a WAIT or BARRIER on `key` (as the client names it, without torch's
    /// leading `/`).
    #[cfg(test)]
    pub(crate) fn waiters(&self, key: &str) -> usize {
        let wire = [b"/", key.as_bytes()].concat();
        lock(&self.state).waiters_on(&wire)
    }

    /// What the connections buffer (see [`ServerConfig::max_buffered_bytes`]).
    pub fn buffered(&self) -> Usage {
        self.budget.usage()
    }

    /// Stops accepting, closes every connection and waits for their tasks to end.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for task in self.accept_tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

fn listen(addr: SocketAddr) -> Result<TcpListener, StoreError> {
    if !addr.ip().is_unspecified() {
        return listen_on(addr, false);
    }
    let dual = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), addr.port());
    listen_on(dual, true).or_else(|err| {
        debug!("dual-stack listen failed ({err}); trying IPv4 only");
        listen_on(SocketAddr::new([0, 0, 0, 0].into(), addr.port()), false)
    })
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> Result<TcpListener, StoreError> {
    let bind = || -> io::Result<TcpListener> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        if dual_stack {
            socket.set_only_v6(false)?;
        }
        socket.bind(&addr.into())?;
        socket.listen(BACKLOG)?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    };
    bind().map_err(|source| StoreError::Bind { addr, source })
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // State methods do not panic; should one ever, its data is still consistent per request.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What every listener's connections share.
struct Shared {
    state: Arc<Mutex<State>>,
    budget: Arc<Budget>,
    slots: Arc<Semaphore>,
    config: ServerConfig,
}

async fn accept_loop(listener: TcpListener, shared: Shared, mut stop: watch::Receiver<bool>) {
    let Shared {
        state,
        budget,
        slots,
        config,
    } = shared;
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        warn!(%peer, max_connections = config.max_connections,
                            "store refused a connection: too many open");
                        continue;
                    };
                    tune(&stream, config.keepalive);
                    let wake = Arc::new(Notify::new());
                    let id = lock(&state).connect(wake.clone());
                    let conn = Connection {
                        stream,
                        peer,
                        state: state.clone(),
                        id,
                        wake,
                        max_frame: config.max_frame_bytes,
                        handshake_timeout: config.handshake_timeout,
                        account: budget.open(id),
                        stop: stop.clone(),
                    };
                    connections.spawn(conn.serve(slot));
                }
                Err(err) => {
                    // E.g. EMFILE: back off instead of spinning; established clients go on.
                    warn!("store accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

fn tune(stream: &TcpStream, keepalive: Option<Duration>) {
    let result = stream.set_nodelay(true).and_then(|()| match keepalive {
        Some(idle) => SockRef::from(stream).set_tcp_keepalive(
            &TcpKeepalive::new()
                .with_time(idle)
                .with_interval(idle)
                .with_retries(3),
        ),
        None => Ok(()),
    });
    if let Err(err) = result {
        debug!("store could not set socket options: {err}");
    }
}

/// Why the server closed a connection.
#[derive(Debug, Error)]
enum Closed {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("{0}")]
    Refused(#[from] Refusal),
    #[error("first request is {0:?}, not VALIDATE (not a torch TCPStore client)")]
    NotValidated(Query),
    #[error("VALIDATE with wrong magic {0:#x} (not a torch >= 2.2 TCPStore client)")]
    BadMagic(u32),
    #[error("it stopped reading its watch events")]
    Overflowed,
    #[error("HELLO with a wrong or missing job token (MUSTER_RDZV_TOKEN)")]
    WrongToken,
    #[error("HELLO of protocol version {0}, which this muster does not speak (mixed muster versions?)")]
    UnknownVersion(u32),
    #[error("it sent no valid first request within {0:?} (handshake_timeout)")]
    NoHandshake(Duration),
    #[error(
        "it held {held} bytes when all connections together passed {limit} (max_buffered_bytes)"
    )]
    OverBudget { held: usize, limit: usize },
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl From<Overflowed> for Closed {
    fn from(_: Overflowed) -> Closed {
        Closed::Overflowed
    }
}

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<Mutex<State>>,
    id: ConnId,
    /// Signalled when other connections queue bytes (wake-ups, events) for this one.
    wake: Arc<Notify>,
    max_frame: usize,
    handshake_timeout: Duration,
    /// This connection's share of the server's buffered bytes.
    account: Account,
    stop: watch::Receiver<bool>,
}

impl Connection {
    async fn serve(mut self, _slot: OwnedSemaphorePermit) {
        let result = self.run().await;
        lock(&self.state).disconnect(self.id);
        let peer = self.peer;
        match result {
            Ok(()) => debug!(%peer, "store connection ended"),
            Err(Closed::Io(err)) => debug!(%peer, "store connection failed: {err}"),
            // Idle connections by the thousand (a scan, a flood) must not flood the log as well.
            Err(why @ Closed::NoHandshake(_)) => {
                debug!(%peer, "store closed the connection: {why}")
            }
            Err(why) => warn!(%peer, "store closed the connection: {why}"),
        }
    }

    /// Serves until the client leaves (`Ok`), the server stops (`Ok`) or an error. Closes a
    /// connection that does not complete its handshake in time or that the budget evicts.
    async fn run(&mut self) -> Result<(), Closed> {
        // Buffers are allocated only while bytes are in flight: an idle connection holds none.
        let mut input = Vec::new();
        let mut output = Vec::new();
        let mut decoder = RequestDecoder::new(self.max_frame);
        let mut validated = false;
        let handshake = tokio::time::sleep(self.handshake_timeout);
        tokio::pin!(handshake);
        loop {
            let backlog = match self.process(&mut input, &mut output, &mut decoder, &mut validated) {
                // The refusal is queued: send it, so the agent can say why, then close.
                Err(Closed::WrongToken) => {
                    let _ = self.stream.write_all(&output).await;
                    return Err(Closed::WrongToken);
                }
                result => result?,
            };
            self.account.set(input.len() + output.len());
            if !output.is_empty() {
                tokio::select! {
                    written = self.stream.write_all(&output) => written?,
                    () = self.account.evicted() => return Err(self.over_budget()),
                    _ = self.stop.changed() => return Ok(()),
                }
                output.clear();
                if output.capacity() > 4 * CHUNK {
                    output = Vec::new();
                }
                self.account.set(input.len());
            }
            if backlog {
                continue;
            }
            if input.is_empty() {
                input = Vec::new();
            }
            tokio::select! {
                // Data that arrived counts before the deadline: a busy server never closes a client
                // whose first request is waiting to be read.
                biased;
                ready = self.stream.readable() => {
                    ready?;
                    if !self.read(&mut input)? {
                        return Ok(());
                    }
                }
                () = self.wake.notified() => {}
                () = &mut handshake, if !validated => {
                    return Err(Closed::NoHandshake(self.handshake_timeout));
                }
                () = self.account.evicted() => return Err(self.over_budget()),
                _ = self.stop.changed() => return Ok(()),
            }
        }
    }

    /// Reads what the socket has into `input`; false at end of stream.
    fn read(&mut self, input: &mut Vec<u8>) -> io::Result<bool> {
        input.reserve(CHUNK);
        match self.stream.try_read_buf(input) {
            Ok(0) => Ok(false),
            Ok(_) => {
                self.account.set(input.len());
                Ok(true)
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Ok(true),
            Err(err) => Err(err),
        }
    }

    fn over_budget(&self) -> Closed {
        Closed::OverBudget {
            held: self.account.bytes(),
            limit: self.account.limit(),
        }
    }

    /// Applies the complete requests in `input`, drops them from it and moves the output
    /// queued for this connection into `output`, all in one critical section. Returns true when
    /// it stopped early because enough output is queued to flush first.
    fn process(
        &mut self,
        input: &mut Vec<u8>,
        output: &mut Vec<u8>,
        decoder: &mut RequestDecoder,
        validated: &mut bool,
    ) -> Result<bool, Closed> {
        let mut consumed = 0;
        let mut backlog = false;
        let mut state = lock(&self.state);
        while let Some((request, n)) = decoder.decode(&input[consumed..])? {
            consumed += n;
            // Strict like torch's legacy server; libuv lets a client skip VALIDATE, an
            // artifact of its parser (docs/tcpstore-protocol.md, "Handshake").
            if !*validated {
                match request {
                    Request::Validate {
                        magic: VALIDATE_MAGIC,
                    } => *validated = true,
                    Request::Hello { version, token } => match state.hello(self.id, version, token) {
                        Hello::Welcome => *validated = true,
                        Hello::WrongToken => {
                            state.take_output(self.id, output)?;
                            return Err(Closed::WrongToken);
                        }
                        Hello::UnknownVersion(v) => return Err(Closed::UnknownVersion(v)),
                    },
                    Request::Validate { magic } => return Err(Closed::BadMagic(magic)),
                    other => return Err(Closed::NotValidated(other.query())),
                }
                continue;
            }
            state.apply(self.id, request)?;
            if state.pending_output(self.id) > CHUNK {
                backlog = true;
                break;
            }
        }
        state.take_output(self.id, output)?;
        drop(state);
        input.drain(..consumed);
        Ok(backlog)
    }
}

#[cfg(test)]
mod bound_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod access_tests;
#[cfg(test)]
mod session_tests;
