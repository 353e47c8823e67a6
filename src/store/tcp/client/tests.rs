//! Requests dropped at random points (many seeds) leave no stale reply for the next request; a peer that is
//! not a TCPStore is named at once.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::*;
use crate::store::tcp::frame::tests::Rng;
use crate::store::tcp::{Server, ServerConfig};

const TIMEOUT: Duration = Duration::from_secs(5);
pub(crate) const SEEDS: u64 = 200;
pub(crate) const OPS_PER_SEED: u64 = 30;

/// One operation of a random run. Each uses keys of its own, which an oracle connection sets up first, so
/// its correct reply is known whatever earlier (possibly half-done) operations did, and differs from theirs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Set,
    Get,
    Add(i64),
    CompareSet,
    Wait,
    /// A WAIT that times out: the client's cancel protocol must leave the connection in step.
    WaitMissing,
    MultiGet,
    List,
    Delete,
}

/// The keys and values of operation `i`: `x` holds `v` (or, for `Add`, the decimal `base`), `y` holds `w`,
/// `z` is missing.
pub(crate) struct Case {
    pub op: Op,
    pub x: String,
    pub y: String,
    pub z: String,
    pub v: Vec<u8>,
    pub w: Vec<u8>,
    pub base: i64,
}

impl Case {
    pub(crate) fn random(rng: &mut Rng, seed: u64, i: u64) -> Case {
        let op = match rng.below(9) {
            0 => Op::Set,
            1 => Op::Get,
            2 => Op::Add(rng.below(100) as i64 - 50),
            3 => Op::CompareSet,
            4 => Op::Wait,
            5 => Op::WaitMissing,
            6 => Op::MultiGet,
            7 => Op::List,
            _ => Op::Delete,
        };
        let key = |name: &str| format!("s{seed}/{i}/{name}");
        let base = (seed * 1000 + i) as i64;
        let v = match op {
            Op::Add(_) => base.to_string().into_bytes(),
            _ => format!("v{seed}-{i}").into_bytes(),
        };
        Case { op, x: key("x"), y: key("y"), z: key("z"), v, w: format!("w{seed}-{i}").into_bytes(), base }
    }

    /// Writes `x` and `y` through the oracle connection; the PING returns once the server applied them.
    pub(crate) async fn prepare(&self, oracle: &mut Client) {
        let pairs = [(self.x.as_str(), self.v.as_slice()), (self.y.as_str(), self.w.as_slice())];
        oracle.multi_set(&pairs).await.expect("oracle multi_set");
        oracle.ping().await.expect("oracle ping");
    }
}

/// Where a request is cut: after a random number of microseconds, or after the runtime polled it a
/// random number of times.
pub(crate) enum Cut {
    None,
    After(Duration),
    Polls(u32),
}

impl Cut {
    pub(crate) fn random(rng: &mut Rng) -> Cut {
        match rng.below(4) {
            0 => Cut::After(Duration::from_micros(rng.below(400))),
            1 => Cut::Polls(rng.below(6) as u32),
            _ => Cut::None,
        }
    }

    /// Runs `fut` to completion, or drops it at the cut: `None` if it was dropped.
    pub(crate) async fn run<T>(&self, fut: impl std::future::Future<Output = T>) -> Option<T> {
        match self {
            Cut::None => Some(fut.await),
            Cut::After(after) => tokio::time::timeout(*after, fut).await.ok(),
            Cut::Polls(n) => {
                let yields = async {
                    for _ in 0..*n {
                        tokio::task::yield_now().await;
                    }
                };
                tokio::select! {
                    biased;
                    out = fut => Some(out),
                    () = yields => None,
                }
            }
        }
    }
}

/// What the operation's reply looks like, to compare with what it should be.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Done,
    Value(Vec<u8>),
    Int(i64),
    Flag(bool),
    Values(Vec<Vec<u8>>),
}

async fn run_op(c: &mut Client, case: &Case) -> Result<Seen, StoreError> {
    Ok(match case.op {
        Op::Set => c.set(&case.z, &case.w).await.map(|()| Seen::Done)?,
        Op::Get => Seen::Value(c.get(&case.x).await?),
        Op::Add(d) => Seen::Int(c.add(&case.x, d).await?),
        Op::CompareSet => Seen::Value(c.compare_set(&case.x, &case.v, &case.w).await?),
        Op::Wait => c.wait(&[&case.x], TIMEOUT).await.map(|()| Seen::Done)?,
        Op::WaitMissing => match c.wait(&[&case.z], Duration::from_millis(2)).await {
            Err(StoreError::WaitTimeout { .. }) => Seen::Flag(false),
            other => other.map(|()| Seen::Flag(true))?,
        },
        Op::MultiGet => Seen::Values(c.multi_get(&[&case.x, &case.y]).await?),
        Op::List => {
            let keys = c.list_keys().await?;
            Seen::Flag(keys.contains(&case.x) && keys.contains(&case.y))
        }
        Op::Delete => Seen::Flag(c.delete_key(&case.x).await?),
    })
}

fn expected(case: &Case) -> Seen {
    match case.op {
        Op::Set | Op::Wait => Seen::Done,
        Op::Get => Seen::Value(case.v.clone()),
        Op::Add(d) => Seen::Int(case.base + d),
        Op::CompareSet => Seen::Value(case.w.clone()),
        Op::WaitMissing => Seen::Flag(false),
        Op::MultiGet => Seen::Values(vec![case.v.clone(), case.w.clone()]),
        Op::List | Op::Delete => Seen::Flag(true),
    }
}

async fn server() -> Server {
    Server::bind((Ipv4Addr::LOCALHOST, 0).into(), ServerConfig::default()).await.expect("bind")
}

#[tokio::test]
async fn a_dropped_request_never_hands_its_reply_to_the_next() {
    let (mut cut_count, mut broken_count) = (0, 0);
    for seed in 0..SEEDS {
        let server = server().await;
        let addr = server.local_addr();
        let mut oracle = Client::connect(addr, TIMEOUT).await.expect("oracle");
        let mut client = Client::connect(addr, TIMEOUT).await.expect("client");
        let mut rng = Rng::new(seed);
        for i in 0..OPS_PER_SEED {
            let case = Case::random(&mut rng, seed, i);
            case.prepare(&mut oracle).await;
            let Some(result) = Cut::random(&mut rng).run(run_op(&mut client, &case)).await else {
                cut_count += 1;
                continue;
            };
            match result {
                Ok(seen) => {
                    assert_eq!(seen, expected(&case), "seed {seed} op {i} {:?}", case.op);
                    if let Op::Set = case.op {
                        // SET has no reply: the oracle's read shows it landed (its WAIT covers the race).
                        assert_eq!(oracle.get(&case.z).await.expect("oracle get"), case.w, "seed {seed} op {i}");
                    }
                }
                // A request after a dropped one: refused, never answered with another's reply.
                Err(StoreError::Broken { .. }) => {
                    broken_count += 1;
                    assert!(!client.is_usable());
                    client = Client::connect(addr, TIMEOUT).await.expect("reconnect");
                }
                Err(e) => panic!("seed {seed} op {i} {:?}: {e}", case.op),
            }
        }
    }
    // The cuts did land mid-request, and were caught.
    assert!(cut_count > 0 && broken_count > 0, "cut {cut_count}, broken {broken_count}");
}

/// A listener that accepts every connection and hands it to `answer`.
async fn impostor(answer: fn(tokio::net::TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            answer(stream);
        }
    });
    addr
}

async fn refused_at_once(addr: SocketAddr, answer: &str) {
    // Far longer than the test's bound: only recognising the impostor ends the connect in time.
    let connect = tokio::time::timeout(Duration::from_secs(10), Client::connect(addr, Duration::from_secs(600)));
    let err = connect.await.expect("refused at once").expect_err("not a store");
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    let line = err.to_string();
    assert!(line.contains(&addr.to_string()) && line.contains(answer) && line.contains("--rdzv-endpoint"), "{line}");
    assert!(!line.contains('\n'), "{line}");
}

#[tokio::test]
async fn a_program_that_accepts_and_closes_is_not_a_store() {
    let addr = impostor(drop).await;
    refused_at_once(addr, "closed the connection").await;
}

#[tokio::test]
async fn a_program_that_answers_garbage_is_not_a_store() {
    let addr = impostor(|mut stream| {
        tokio::spawn(async move {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            tokio::time::sleep(TIMEOUT).await;
        });
    })
    .await;
    refused_at_once(addr, "answered garbage").await;
}

#[tokio::test]
async fn a_store_not_up_yet_is_waited_for() {
    // A port with nothing listening: refused connections are retried until the timeout.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind").local_addr().expect("addr").port();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let err = Client::connect(addr, Duration::from_millis(300)).await.expect_err("nothing there");
    assert!(matches!(err, StoreError::Connect { .. }), "{err}");
}

/// A loopback listener that never accepts, with room for one queued connection (backlog 0), and that
/// connection made: the kernel drops every further SYN, as a store's in a burst beyond its accept queue.
async fn full_listener() -> (std::net::TcpListener, SocketAddr, tokio::net::TcpStream) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into()).expect("bind");
    socket.listen(0).expect("listen");
    let listener: std::net::TcpListener = socket.into();
    let addr = listener.local_addr().expect("addr");
    let queued = tokio::net::TcpStream::connect(addr).await.expect("the one queued connection");
    (listener, addr, queued)
}

// Paused time: the attempt bound passes at once, while the kernel (real time) would send the dropped SYN
// again only after a second; so only a bounded attempt followed by a fresh one gets in.
#[tokio::test(start_paused = true)]
async fn a_connect_whose_syn_is_dropped_is_made_again_once_the_queue_has_room() {
    let (listener, addr, _queued) = full_listener().await;
    let connecting = tokio::spawn(connect::retry(addr, Duration::from_secs(600), connect::OnRefused::Wait, move || connect::open(addr)));
    // Past the first attempt's bound (its SYN dropped), then the listener starts accepting.
    tokio::time::sleep(connect::CONNECT_ATTEMPT * 2).await;
    assert!(!connecting.is_finished(), "got in while the accept queue was full");
    let listener = TcpListener::from_std({
        listener.set_nonblocking(true).expect("nonblocking");
        listener
    })
    .expect("listener");
    let accepting = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    connecting.await.expect("joined").expect("got in once the queue had room");
    accepting.abort();
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_connect_is_given_up_after_its_bound() {
    let (_listener, addr, _queued) = full_listener().await;
    let err = connect::open(addr).await.expect_err("the SYN was dropped");
    let line = err.to_string();
    assert!(line.contains(&addr.to_string()) && line.contains("no answer within 2s"), "{line}");
}
