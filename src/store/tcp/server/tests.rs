//! The server driven over real sockets: by muster's client, by raw bytes (torch's edge cases,
//! `docs/tcpstore-protocol.md`, "Test vectors"), by hostile and random input, and by a killed process.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::store::tcp::frame::tests::{fuzz_cases, random_frame, Rng};
use crate::store::tcp::Client;

pub(super) const TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const VALIDATE: [u8; 5] = [0x00, 0xce, 0xf7, 0x85, 0x3c];

pub(super) async fn start(config: ServerConfig) -> Server {
    Server::bind((Ipv4Addr::LOCALHOST, 0).into(), config)
        .await
        .unwrap()
}

pub(super) async fn client(server: &Server) -> Client {
    Client::connect(server.local_addr(), TIMEOUT).await.unwrap()
}

/// A raw connection that already sent VALIDATE.
pub(super) async fn raw(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
    stream.write_all(&VALIDATE).await.unwrap();
    stream
}

pub(super) async fn request(
    stream: &mut TcpStream,
    request: Request<'_>,
    reply_len: usize,
) -> Vec<u8> {
    let mut wire = Vec::new();
    request.encode(&mut wire);
    stream.write_all(&wire).await.unwrap();
    let mut reply = vec![0; reply_len];
    tokio::time::timeout(TIMEOUT, stream.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    reply
}

/// Polls `done` until it holds; panics naming `what` after 10 s. For states of the server that the
/// sending side cannot observe (a waiter parked, bytes read), so a test never writes the next step
/// before the server reached the one it is testing.
pub(super) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until `n` connections are parked in a WAIT or BARRIER on `key`: then what the test writes
/// next wakes them, rather than being found at once by a wait that came late.
pub(super) async fn parked(server: &Server, key: &str, n: usize) {
    until(&format!("{n} waiter(s) parked on {key:?}"), || {
        server.waiters(key) == n
    })
    .await
}

/// True when the server closed the connection (EOF or reset) within the timeout.
pub(super) async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 64];
    loop {
        match tokio::time::timeout(TIMEOUT, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_through_the_client() {
    let server = start(ServerConfig::default()).await;
    let mut c = client(&server).await;
    c.set("k", b"v1").await.unwrap();
    assert_eq!(c.get("k").await.unwrap(), b"v1");
    assert_eq!(c.add("cnt", 5).await.unwrap(), 5);
    assert_eq!(c.add("cnt", -2).await.unwrap(), 3);
    assert_eq!(c.get("cnt").await.unwrap(), b"3");
    assert_eq!(c.compare_set("k", b"v1", b"v2").await.unwrap(), b"v2");
    assert_eq!(c.compare_set("k", b"zz", b"v3").await.unwrap(), b"v2");
    assert_eq!(c.compare_set("new", b"", b"n1").await.unwrap(), b"n1");
    assert_eq!(c.compare_set("missing", b"x", b"y").await.unwrap(), b"x");
    assert!(c.check(&["k", "cnt"]).await.unwrap());
    assert!(!c.check(&["k", "nope"]).await.unwrap());
    assert_eq!(c.num_keys().await.unwrap(), 3);
    assert!(c.delete_key("k").await.unwrap());
    assert!(!c.delete_key("k").await.unwrap());
    c.append("ap", b"ab").await.unwrap();
    c.append("ap", b"cd").await.unwrap();
    assert_eq!(
        c.multi_get(&["ap", "cnt"]).await.unwrap(),
        [b"abcd".to_vec(), b"3".to_vec()]
    );
    c.multi_set(&[("m1", b"x"), ("m2", b"yy")]).await.unwrap();
    let mut keys = c.list_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, ["ap", "cnt", "m1", "m2", "new"]);
    c.queue_push("q", b"item1").await.unwrap();
    assert_eq!(c.queue_len("q").await.unwrap(), 1);
    assert_eq!(
        c.queue_pop("q", false).await.unwrap().as_deref(),
        Some(&b"item1"[..])
    );
    assert_eq!(c.queue_pop("q", false).await.unwrap(), None);
    c.barrier("bar", 1, TIMEOUT).await.unwrap();
    c.ping().await.unwrap();
    c.wait(&["ap", "m1"], TIMEOUT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_time_out_cleanly_and_are_woken_by_other_clients() {
    let server = start(ServerConfig::default()).await;
    let mut a = client(&server).await;
    let started = Instant::now();
    let err = a
        .wait(&["nope"], Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::WaitTimeout { .. }), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    // The connection is still in step after CANCEL_WAIT.
    a.set("x", b"1").await.unwrap();
    assert_eq!(a.get("x").await.unwrap(), b"1");

    let waiter = tokio::spawn(async move {
        a.wait(&["late", "later"], TIMEOUT).await.unwrap();
        a.get("later").await.unwrap()
    });
    let mut b = client(&server).await;
    parked(&server, "late", 1).await;
    parked(&server, "later", 1).await;
    b.set("late", b"1").await.unwrap();
    b.ping().await.unwrap(); // SET has no reply: make sure it was applied.
    assert_eq!(server.waiters("later"), 1, "one of two keys set: still waiting");
    assert!(!waiter.is_finished());
    b.add("later", 7).await.unwrap();
    assert_eq!(waiter.await.unwrap(), b"7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_and_blocking_queue_pop_release_other_clients() {
    let server = start(ServerConfig::default()).await;
    let (mut a, mut b) = (client(&server).await, client(&server).await);
    let first = tokio::spawn(async move {
        a.barrier("b", 2, TIMEOUT).await.unwrap();
        a.queue_pop("jobs", true).await.unwrap()
    });
    parked(&server, "b", 1).await;
    assert!(!first.is_finished());
    b.barrier("b", 2, TIMEOUT).await.unwrap();
    parked(&server, "jobs", 1).await;
    b.queue_push("jobs", b"j1").await.unwrap();
    assert_eq!(first.await.unwrap().as_deref(), Some(&b"j1"[..]));
    // The count is never reset: a third arrival passes at once.
    b.barrier("b", 2, TIMEOUT).await.unwrap();
    assert_eq!(b.get("b").await.unwrap(), b"3");
    let err = b
        .barrier("solo", 2, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::WaitTimeout { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_deletes_keys_and_keeps_pending_waits() {
    let server = start(ServerConfig::default()).await;
    let mut a = client(&server).await;
    a.set("stale", b"1").await.unwrap();
    a.queue_push("q", b"1").await.unwrap();
    a.ping().await.unwrap();
    let mut waiter = client(&server).await;
    let pending = tokio::spawn(async move { waiter.get("fresh").await.unwrap() });
    parked(&server, "fresh", 1).await;
    server.clear().await;
    assert_eq!(a.num_keys().await.unwrap(), 0);
    assert_eq!(a.queue_len("q").await.unwrap(), 0);
    assert_eq!(server.waiters("fresh"), 1, "the wait survived the clear");
    assert!(!pending.is_finished());
    a.set("fresh", b"new").await.unwrap();
    assert_eq!(pending.await.unwrap(), b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_edge_cases_byte_for_byte() {
    let server = start(ServerConfig::default()).await;
    let mut s = raw(&server).await;
    // libuv: a missing key reads as empty, also inside MULTI_GET.
    assert_eq!(
        request(&mut s, Request::Get { key: b"/missing" }, 8).await,
        [0; 8]
    );
    request(
        &mut s,
        Request::Set {
            key: b"/mg1",
            value: b"a",
        },
        0,
    )
    .await;
    let reply = request(
        &mut s,
        Request::MultiGet {
            keys: vec![b"/mg1", b"/missing"],
        },
        17,
    )
    .await;
    assert_eq!(
        reply,
        [1, 0, 0, 0, 0, 0, 0, 0, b'a', 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        request(&mut s, Request::Wait { keys: vec![] }, 1).await,
        [0]
    );
    assert_eq!(
        request(&mut s, Request::Check { keys: vec![] }, 1).await,
        [0]
    );
    assert_eq!(request(&mut s, Request::CancelWait, 1).await, [1]);
    // A pending WAIT does not stop other requests on the same connection.
    request(&mut s, Request::Wait { keys: vec![b"/w"] }, 0).await;
    assert_eq!(
        request(&mut s, Request::GetNumKeys, 8).await,
        [1, 0, 0, 0, 0, 0, 0, 0]
    );
    let mut other = raw(&server).await;
    request(
        &mut other,
        Request::Set {
            key: b"/w",
            value: b"",
        },
        0,
    )
    .await;
    let mut woken = [0; 1];
    s.read_exact(&mut woken).await.unwrap();
    assert_eq!(woken, [0]);
    // ADD parses like std::stoll.
    request(
        &mut s,
        Request::Set {
            key: b"/n",
            value: b" 12xyz",
        },
        0,
    )
    .await;
    assert_eq!(
        request(
            &mut s,
            Request::Add {
                key: b"/n",
                delta: 1
            },
            8
        )
        .await,
        [13, 0, 0, 0, 0, 0, 0, 0]
    );
    // Requests split byte by byte and pipelined requests both work.
    let mut wire = Vec::new();
    Request::Ping { nonce: 7 }.encode(&mut wire);
    Request::Ping { nonce: 8 }.encode(&mut wire);
    for byte in &wire {
        s.write_all(&[*byte]).await.unwrap();
    }
    let mut pongs = [0; 8];
    s.read_exact(&mut pongs).await.unwrap();
    assert_eq!(pongs, [7, 0, 0, 0, 8, 0, 0, 0]);
    // Errors close the connection, as in torch.
    request(
        &mut s,
        Request::Set {
            key: b"/abc",
            value: b"abc",
        },
        0,
    )
    .await;
    request(
        &mut s,
        Request::Add {
            key: b"/abc",
            delta: 1,
        },
        0,
    )
    .await;
    assert!(closed(&mut s).await);
    for bad in [&[0x7f][..], &VALIDATE] {
        let mut s = raw(&server).await;
        s.write_all(bad).await.unwrap();
        assert!(closed(&mut s).await, "after {bad:02x?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_is_required() {
    let server = start(ServerConfig::default()).await;
    for first in [&[0x00, 0xde, 0xad, 0xbe, 0xef][..], &[0x07]] {
        let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
        s.write_all(first).await.unwrap();
        assert!(closed(&mut s).await, "after {first:02x?}");
    }
    // Unlike torch's libuv server, a VALIDATE split across segments is fine: the server holds the
    // first byte alone (the refused connections' bytes gone first) before the rest is sent.
    until("the refused connections' bytes freed", || server.buffered().now == 0).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    s.write_all(&VALIDATE[..1]).await.unwrap();
    until("the server read the first byte of VALIDATE", || {
        server.buffered().now == 1
    })
    .await;
    s.write_all(&VALIDATE[1..]).await.unwrap();
    assert_eq!(
        request(&mut s, Request::Ping { nonce: 9 }, 4).await,
        [9, 0, 0, 0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_and_stuck_clients_do_not_affect_others() {
    let server = start(ServerConfig {
        max_frame_bytes: 1024,
        ..ServerConfig::default()
    })
    .await;
    let mut good = client(&server).await;
    // A SET declaring a value over the limit is refused from its header.
    let mut big = raw(&server).await;
    big.write_all(&[0x01, 1, 0, 0, 0, 0, 0, 0, 0, b'k', 0, 4, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    assert!(closed(&mut big).await);
    // A reply over the limit is refused too.
    good.set("v", &[1; 600]).await.unwrap();
    good.ping().await.unwrap(); // SET has no reply: make sure it was applied.
    let mut greedy = raw(&server).await;
    let mut wire = Vec::new();
    Request::MultiGet {
        keys: vec![b"/v", b"/v"],
    }
    .encode(&mut wire);
    greedy.write_all(&wire).await.unwrap();
    assert!(closed(&mut greedy).await);
    // Half a frame, then silence: held by the server (the closed connections' bytes gone first).
    until("the closed connections' bytes freed", || server.buffered().now == 0).await;
    let mut stuck = raw(&server).await;
    stuck.write_all(&[0x01, 200, 0, 0]).await.unwrap();
    until("the server holds the half frame", || server.buffered().now == 4).await;
    // And a client that never reads its replies: the server is answering it.
    let (mut deaf, mut deaf_out) = raw(&server).await.into_split();
    let mut pings = Vec::new();
    for _ in 0..100_000 {
        Request::Ping { nonce: 1 }.encode(&mut pings);
    }
    let flood = tokio::spawn(async move {
        let _ = deaf_out.write_all(&pings).await;
        deaf_out
    });
    let mut first = [0; 1];
    tokio::time::timeout(Duration::from_secs(10), deaf.peek(&mut first))
        .await
        .expect("the server answers the deaf client's pings within 10 s")
        .unwrap();
    // Served while the stuck and the deaf clients hold their connections (the client's own deadline fails
    // a request that waits on them).
    for i in 0..100 {
        assert_eq!(good.add("n", 1).await.unwrap(), i + 1);
    }
    drop((stuck, deaf, flood));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_closed() {
    let server = start(ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    })
    .await;
    let mut a = client(&server).await;
    let _b = client(&server).await;
    let mut third = raw(&server).await;
    assert!(closed(&mut third).await);
    drop(_b);
    // The slot frees once the server saw the close.
    let mut c = Client::connect(server.local_addr(), TIMEOUT).await.unwrap();
    c.ping().await.unwrap();
    a.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_input_never_stops_the_server() {
    let server = start(ServerConfig {
        max_frame_bytes: 4096,
        ..ServerConfig::default()
    })
    .await;
    let mut rng = Rng::new(0xf022);
    let cases = fuzz_cases(300);
    for case in 0..cases {
        let mut s = if rng.below(4) == 0 {
            TcpStream::connect(server.local_addr()).await.unwrap()
        } else {
            raw(&server).await
        };
        let mut wire = Vec::new();
        for _ in 0..1 + rng.below(4) {
            wire.extend(random_frame(&mut rng));
        }
        wire.truncate(rng.below(wire.len() as u64 + 1) as usize);
        // The server may close mid-write; that is its right.
        let _ = s.write_all(&wire).await;
        if case % 50 == 0 {
            let mut c = client(&server).await;
            c.set("alive", b"1").await.unwrap();
        }
    }
    let mut c = client(&server).await;
    assert_eq!(c.add("still-serving", 1).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unspecified_address_listens_dual_stack() {
    let server = Server::bind((Ipv4Addr::UNSPECIFIED, 0).into(), ServerConfig::default())
        .await
        .unwrap();
    assert_eq!(server.local_addr().ip(), Ipv6Addr::UNSPECIFIED);
    for ip in [Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()] {
        let mut c = Client::connect(SocketAddr::new(ip, server.port()), TIMEOUT)
            .await
            .unwrap();
        c.ping().await.unwrap();
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_clients() {
    let server = start(ServerConfig::default()).await;
    let addr = server.local_addr();
    let mut c = client(&server).await;
    let waiting = tokio::spawn(async move { c.wait(&["never"], TIMEOUT).await });
    parked(&server, "never", 1).await;
    server.shutdown().await;
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::Closed { .. }), "{err}");
    assert!(TcpStream::connect(addr).await.is_err());
}
