//! Connecting: the handshake torch's client does, retried while the store is not up yet, and telling a
//! store that is not up from another program holding the port.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::{sleep, timeout_at, Instant};

use super::super::frame::{Request, VALIDATE_MAGIC};
use super::reply::nonce_of;
use super::Client;
use crate::store::StoreError;

/// Handshakes in a row, each accepted and then closed or answered with garbage, after which the
/// peer is taken for another program rather than a store starting up. With the backoff they take
/// a few hundred milliseconds. (muster's server also closes connections past its
/// `max_connections`, a limit far above any job's node count.)
pub const FOREIGN_ATTEMPTS: u32 = 3;

impl Client {
    /// Connects and handshakes (VALIDATE, then PING with this process id, as torch's client),
    /// retrying with jittered exponential backoff until `timeout`, which then also bounds every
    /// later request. A refused connection or a silent peer is a store not up yet; a peer that
    /// accepts and then closes or answers garbage [`FOREIGN_ATTEMPTS`] times in a row is another
    /// program on the port ([`StoreError::NotAStore`]), reported at once.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Client, StoreError> {
        retry(addr, timeout, OnRefused::Wait, || Client::handshake(addr, timeout)).await
    }

    async fn handshake(addr: SocketAddr, timeout: Duration) -> Result<Client, StoreError> {
        let stream = open(addr).await?;
        let mut client = Client {
            stream,
            addr,
            timeout,
            input: Vec::new(),
            output: Vec::new(),
            broken: false,
            in_flight: false,
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
}

/// What a refused connection means to [`retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::tcp) enum OnRefused {
    /// The store is not up yet: a first connection.
    Wait,
    /// The store that answered before is gone ([`StoreError::Refused`] at once): a reconnection. Its
    /// host's kernel answers for a port nobody listens on; a busy store drops SYNs instead of refusing.
    Final,
}

/// Runs `handshake` until it succeeds, retrying with jittered exponential backoff until `timeout`: a
/// refused connection (unless `refused` says it is final), a full accept queue or a silent peer is a store
/// not up (or too busy) yet, so a burst of thousands of agents all get in; a peer that accepts and then
/// closes or answers garbage [`FOREIGN_ATTEMPTS`] times in a row is another program on the port, reported
/// at once. A wrong job token is final.
pub(in crate::store::tcp) async fn retry<T, F, Fut>(
    addr: SocketAddr,
    timeout: Duration,
    refused: OnRefused,
    handshake: F,
) -> Result<T, StoreError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(50);
    let mut foreign = 0;
    loop {
        let last = match timeout_at(deadline, handshake()).await {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(err @ StoreError::WrongToken { .. })) => return Err(err),
            Ok(Err(StoreError::Io { op: "connect", source, .. }))
                if refused == OnRefused::Final && source.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                return Err(StoreError::Refused { addr })
            }
            Ok(Err(err)) => {
                match foreign_answer(&err) {
                    Some(answer) if foreign + 1 >= FOREIGN_ATTEMPTS => {
                        return Err(StoreError::NotAStore { addr, answer })
                    }
                    Some(_) => foreign += 1,
                    None => foreign = 0,
                }
                err.to_string()
            }
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

/// How long one TCP connect may go unanswered before it is given up and made afresh. A SYN the store's
/// kernel dropped (its accept queue full while thousands of agents connect at once) is sent again only
/// after 1, 3, 7, 15... s, so an unbounded attempt could sit out most of the deadline; a new attempt after
/// the jittered back-off gets in as soon as the queue has room. An answered connect takes one round trip;
/// this leaves room for the kernel's own first retransmission (after 1 s) within each attempt.
pub(in crate::store::tcp) const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// A TCP connection to `addr` with Nagle off, or an error once [`CONNECT_ATTEMPT`] passed unanswered.
pub(in crate::store::tcp) async fn open(addr: SocketAddr) -> Result<TcpStream, StoreError> {
    let io = |source| StoreError::Io { addr, op: "connect", source };
    let unanswered = || {
        let why = format!("no answer within {CONNECT_ATTEMPT:?} (the store's host is cut off, or its accept queue is full)");
        io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
    };
    let stream = tokio::time::timeout(CONNECT_ATTEMPT, TcpStream::connect(addr))
        .await
        .map_err(|_| unanswered())?
        .map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    Ok(stream)
}

/// What a failed handshake says about the peer, if it shows the peer is not a TCPStore: the
/// connection was accepted, then closed or answered with something that is not a PING reply.
fn foreign_answer(err: &StoreError) -> Option<&'static str> {
    match err {
        StoreError::Closed { op: "ping", .. } => Some("it closed the connection"),
        StoreError::Closed { op: "hello", .. } => {
            Some("it closed the connection on muster's HELLO: a torch TCPStore or another program")
        }
        StoreError::Protocol { op: "ping" | "hello", .. } | StoreError::Handshake { .. } => {
            Some("it answered garbage")
        }
        _ => None,
    }
}

pub(super) fn jitter_seed() -> u64 {
    RandomState::new().hash_one(Instant::now())
}

/// `delay` scaled by a random factor in [0.5, 1.5), so many clients retrying do not align.
fn jittered(delay: Duration) -> Duration {
    delay.mul_f64(0.5 + (jitter_seed() % 1000) as f64 / 1000.0)
}
