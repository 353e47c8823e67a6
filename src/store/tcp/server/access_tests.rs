//! Who may touch muster's rendezvous keys, over real sockets: a plain torch client (VALIDATE) is
//! closed on any request naming them and never sees them listed or counted; an agent's tagged
//! connection (HELLO) gets tagged replies and events and is refused blocking waits.

use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::tests::closed;
use super::*;
use crate::store::tcp::frame::{self, WatchMode};
use crate::store::tcp::Client;

const TIMEOUT: Duration = Duration::from_secs(5);

async fn start() -> Server {
    Server::bind((Ipv4Addr::LOCALHOST, 0).into(), ServerConfig::default()).await.expect("bind")
}

async fn send(stream: &mut TcpStream, request: Request<'_>) {
    let mut wire = Vec::new();
    request.encode(&mut wire);
    stream.write_all(&wire).await.expect("write");
}

async fn read(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut reply = vec![0; n];
    tokio::time::timeout(TIMEOUT, stream.read_exact(&mut reply)).await.expect("in time").expect("read");
    reply
}

/// A connection that said HELLO and got its welcome.
async fn agent(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(server.local_addr()).await.expect("connect");
    send(&mut stream, Request::Hello { version: frame::HELLO_VERSION, token: b"" }).await;
    assert_eq!(read(&mut stream, 2).await, [frame::TAG_REPLY, frame::HELLO_OK]);
    stream
}

#[tokio::test]
async fn a_torch_client_is_closed_on_muster_keys_and_never_sees_them() {
    let server = start().await;
    let mut owner = agent(&server).await;
    send(&mut owner, Request::Set { key: b"/muster/run/closed", value: b"0" }).await;
    send(&mut owner, Request::Ping { nonce: 7 }).await;
    assert_eq!(read(&mut owner, 5).await, [frame::TAG_REPLY, 7, 0, 0, 0]);

    let mut torch = Client::connect(server.local_addr(), TIMEOUT).await.expect("torch client");
    torch.set("MASTER_ADDR", b"10.0.0.1").await.expect("torch's own keys work");
    assert_eq!(torch.list_keys().await.expect("list"), ["MASTER_ADDR"]);
    assert_eq!(torch.num_keys().await.expect("num_keys"), 1);
    // Each attack closes the attacker's connection and leaves the key as it was.
    for attack in 0..4 {
        let mut c = Client::connect(server.local_addr(), TIMEOUT).await.expect("attacker");
        let result = match attack {
            0 => c.set("muster/run/closed", b"1").await,
            1 => c.delete_key("muster/run/closed").await.map(|_| ()),
            2 => c.add("muster/run/round", 1).await.map(|_| ()),
            _ => c.get_now("muster/run/closed").await.map(|_| ()),
        };
        // SET has no reply: its refusal shows as the connection closing before the PING's reply.
        let refused = result.is_err() || c.ping().await.is_err();
        assert!(refused, "attack {attack} was served");
    }
    send(&mut owner, Request::Get { key: b"/muster/run/closed" }).await;
    assert_eq!(read(&mut owner, 10).await, [&[frame::TAG_REPLY][..], &1u64.to_le_bytes(), b"0"].concat());
}

#[tokio::test]
async fn a_tagged_connection_gets_events_between_replies_and_no_blocking_waits() {
    let server = start().await;
    let mut a = agent(&server).await;
    send(&mut a, Request::Watch { mode: WatchMode::Prefix, pattern: b"/muster/" }).await;
    let watching = read(&mut a, 1 + 1 + 8 + 8).await;
    assert_eq!(watching[..2], [frame::TAG_REPLY, EventKindByte::WATCHING]);
    send(&mut a, Request::Add { key: b"/muster/n", delta: 1 }).await;
    // Its own reply first, then the event its write caused.
    assert_eq!(read(&mut a, 9).await, [&[frame::TAG_REPLY][..], &1i64.to_le_bytes()].concat());
    let event = read(&mut a, 1 + 1 + 8 + 9).await;
    assert_eq!(event[..2], [frame::TAG_EVENT, EventKindByte::WRITTEN]);
    assert_eq!(&event[10..], b"/muster/n");
    send(&mut a, Request::Unwatch { mode: WatchMode::Prefix, pattern: b"/muster/" }).await;
    send(&mut a, Request::Add { key: b"/muster/n", delta: 1 }).await;
    send(&mut a, Request::Ping { nonce: 1 }).await;
    // No event after the UNWATCH: the ADD's reply, then the PING's.
    assert_eq!(read(&mut a, 9 + 5).await, [&[frame::TAG_REPLY][..], &2i64.to_le_bytes(), &[frame::TAG_REPLY, 1, 0, 0, 0]].concat());
    send(&mut a, Request::Wait { keys: vec![b"/never"] }).await;
    assert!(closed(&mut a).await, "a blocking WAIT on a tagged connection is refused");
}

#[tokio::test]
async fn a_wrong_token_is_told_then_closed() {
    let config = ServerConfig { token: Some(b"right".to_vec()), ..ServerConfig::default() };
    let server = Server::bind((Ipv4Addr::LOCALHOST, 0).into(), config).await.expect("bind");
    let mut stream = TcpStream::connect(server.local_addr()).await.expect("connect");
    send(&mut stream, Request::Hello { version: frame::HELLO_VERSION, token: b"wrong" }).await;
    assert_eq!(read(&mut stream, 2).await, [frame::TAG_REPLY, frame::HELLO_REFUSED]);
    assert!(closed(&mut stream).await);
}

/// Event kinds as wire bytes.
struct EventKindByte;
impl EventKindByte {
    const WATCHING: u8 = frame::EventKind::Watching as u8;
    const WRITTEN: u8 = frame::EventKind::Written as u8;
}
