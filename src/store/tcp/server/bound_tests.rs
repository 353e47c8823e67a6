//! The server's resource bounds over real sockets: the handshake deadline, the buffered-bytes
//! budget against stalled senders and deaf readers, APPEND bounded like SET.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::tests::{client, closed, raw, request, start};
use super::*;

/// Waits (bounded) until `done` holds for the server's accounting: the budget acts on bytes the
/// server has read, which the sending side cannot observe.
async fn accounted(server: &Server, done: impl Fn(Usage) -> bool) -> Usage {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let usage = server.buffered();
        if done(usage) || tokio::time::Instant::now() > give_up {
            return usage;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// As [`accounted`], but also done once the accounting has not moved for half a second.
async fn settled(server: &Server, done: impl Fn(Usage) -> bool) -> Usage {
    let mut last = server.buffered();
    loop {
        let usage = accounted(server, |u| done(u) || u != last).await;
        if done(usage) {
            return usage;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        if server.buffered() == usage {
            return usage;
        }
        last = usage;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_without_a_handshake_are_closed_at_the_deadline() {
    let server = start(ServerConfig {
        handshake_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await;
    let mut validated = client(&server).await;
    let mut silent = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut partial = TcpStream::connect(server.local_addr()).await.unwrap();
    partial.write_all(&[0x00, 0xce]).await.unwrap();
    assert!(closed(&mut silent).await);
    assert!(closed(&mut partial).await);
    // The validated connection outlived the deadline.
    validated.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_large_sets_stay_within_the_budget() {
    const FRAME: usize = 1 << 20;
    const LIMIT: usize = 4 << 20;
    let server = start(ServerConfig {
        max_frame_bytes: FRAME,
        max_buffered_bytes: LIMIT,
        ..ServerConfig::default()
    })
    .await;
    // 20 SETs of a value just under the frame limit, each stopped 1 KiB before its end.
    let value_len = FRAME - 1024;
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut s = raw(&server).await;
        let mut wire = Vec::new();
        Request::Set {
            key: b"/big",
            value: &vec![7; value_len],
        }
        .encode(&mut wire);
        wire.truncate(wire.len() - 1024);
        let _ = s.write_all(&wire).await;
        stalled.push(s);
    }
    // At most four 1 MiB partial frames fit 4 MiB: sixteen senders are closed.
    let usage = accounted(&server, |u| u.evictions >= 16).await;
    println!("stalled SETs: {usage:?} (limit {LIMIT})");
    assert!(usage.evictions >= 16, "{usage:?}");
    // A connection told to close holds what it held until its task runs (later on a loaded machine), and
    // no more: the bound is the limit, a frame per worker thread, and one frame per closed sender.
    assert!(usage.peak <= LIMIT + 2 * FRAME + usage.evictions * FRAME, "{usage:?}");
    let mut good = client(&server).await;
    good.set("small", b"1").await.unwrap();
    assert_eq!(good.get("small").await.unwrap(), b"1");
    drop(stalled);
    let usage = accounted(&server, |u| u.now == 0).await;
    assert_eq!(usage.now, 0, "{usage:?}");
}

/// A validated connection whose kernel receive buffer is tiny, so what it does not read stays in the
/// server's buffers (loopback's autotuned buffers would otherwise absorb megabytes, more or less each run).
async fn deaf_reader(server: &Server) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(server.local_addr()).await.unwrap();
    stream.write_all(&[0x00, 0xce, 0xf7, 0x85, 0x3c]).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_gets_that_are_never_read_stay_within_the_budget() {
    const FRAME: usize = 2 << 20;
    const LIMIT: usize = 8 << 20;
    let server = start(ServerConfig {
        max_frame_bytes: FRAME,
        max_buffered_bytes: LIMIT,
        ..ServerConfig::default()
    })
    .await;
    let mut owner = client(&server).await;
    owner.set("value", &vec![1; 1 << 20]).await.unwrap();
    let mut gets = Vec::new();
    for _ in 0..40 {
        Request::Get { key: b"/value" }.encode(&mut gets);
    }
    let mut deaf = Vec::new();
    for _ in 0..20 {
        let mut s = deaf_reader(&server).await;
        s.write_all(&gets).await.unwrap();
        deaf.push(s);
    }
    // Each deaf reader ends up holding a 1 MiB reply, unless the kernel's send buffer took it (loopback
    // autotunes it up to tcp_wmem's 4 MiB, more or less each run): then the server holds less and closes
    // fewer. Whatever the kernel took, what the server keeps stays within the budget.
    let usage = settled(&server, |u| u.evictions >= 12).await;
    println!("pipelined GETs: {usage:?} (limit {LIMIT})");
    assert!(usage.now <= LIMIT + FRAME, "{usage:?}");
    // As above: a closed reader's one reply may still be held while its task gets to run.
    assert!(usage.peak <= LIMIT + 2 * FRAME + usage.evictions * (1 << 20), "{usage:?}");
    assert_eq!(owner.get("value").await.unwrap().len(), 1 << 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_cannot_grow_a_value_past_the_frame_limit() {
    let server = start(ServerConfig {
        max_frame_bytes: 1024,
        ..ServerConfig::default()
    })
    .await;
    let mut s = raw(&server).await;
    let append = |value: &'static [u8]| Request::Append { key: b"/v", value };
    let mut wire = Vec::new();
    append(&[1; 600]).encode(&mut wire);
    s.write_all(&wire).await.unwrap();
    assert_eq!(
        request(&mut s, Request::Ping { nonce: 1 }, 4).await,
        [1, 0, 0, 0]
    );
    let mut wire = Vec::new();
    append(&[2; 600]).encode(&mut wire);
    s.write_all(&wire).await.unwrap();
    assert!(closed(&mut s).await);
    let mut good = client(&server).await;
    assert_eq!(good.get("v").await.unwrap(), vec![1; 600]);
}
