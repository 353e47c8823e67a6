//! Session keys and watches through agents' tagged connections: a session key goes with its
//! connection (closed by the server, dropped, or its process SIGKILLed) and watchers hear it; a
//! plain torch client may not watch.

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::store::remote::RemoteStore;
use crate::store::{Store, WatchEvent, WatchEventKind, WatchTarget};
use crate::store::tcp::Client;

const TIMEOUT: Duration = Duration::from_secs(5);

async fn start() -> Server {
    Server::bind((Ipv4Addr::LOCALHOST, 0).into(), ServerConfig::default()).await.expect("bind")
}

async fn agent(server: &Server) -> RemoteStore {
    RemoteStore::connect(server.local_addr(), b"", TIMEOUT, TIMEOUT).await.expect("agent")
}

fn event(kind: WatchEventKind, key: &str) -> WatchEvent {
    WatchEvent { kind, key: key.into() }
}

/// The events that arrive until none comes for `quiet`.
async fn drain(events: &mut UnboundedReceiver<WatchEvent>, quiet: Duration) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    while let Ok(Some(e)) = tokio::time::timeout(quiet, events.recv()).await {
        seen.push(e);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keys_vanish_with_their_connection_and_watchers_hear_it() {
    let server = start().await;
    let watcher = agent(&server).await;
    let mut events =
        watcher.watch(&[WatchTarget::Prefix("agents/".into()), WatchTarget::Key("plain".into())]).await.expect("watch");
    let first = agent(&server).await;
    first.set_session("agents/1", b"alive").await.expect("session");
    first.set_session("agents/2", b"alive").await.expect("session");
    // ADD on a non-integer: the server closes this connection, ending its session.
    first.add("agents/2", 0).await.expect_err("refused");
    let second = agent(&server).await;
    second.set_session("agents/1", b"alive").await.expect("session");
    second.set_session("plain", b"x").await.expect("session");
    second.set("plain", b"now ordinary").await.expect("set");
    // A reply on the same connection: every write before it is applied (another connection's read could
    // overtake them).
    assert_eq!(second.get("plain").await.expect("get"), Some(b"now ordinary".to_vec()));
    assert_eq!(watcher.get("agents/1").await.expect("get"), Some(b"alive".to_vec()));
    let mut seen = drain(&mut events, Duration::from_millis(200)).await;
    use WatchEventKind::{Deleted, Written};
    // The first connection's keys went in no particular order.
    seen[2..4].sort_by(|a, b| a.key.cmp(&b.key));
    let expected = [
        event(Written, "agents/1"),
        event(Written, "agents/2"),
        event(Deleted, "agents/1"),
        event(Deleted, "agents/2"),
        event(Written, "agents/1"),
        event(Written, "plain"),
        event(Written, "plain"),
    ];
    assert_eq!(seen, expected);
    let closed_at = Instant::now();
    drop(second);
    let next = tokio::time::timeout(TIMEOUT, events.recv()).await.expect("in time");
    assert_eq!(next, Some(event(Deleted, "agents/1")));
    assert!(closed_at.elapsed() < Duration::from_millis(500));
    assert_eq!(watcher.get("agents/1").await.expect("get"), None);
    assert_eq!(watcher.get("plain").await.expect("get"), Some(b"now ordinary".to_vec()), "SET unbinds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torch_client_may_not_watch() {
    let server = start().await;
    let mut torch = Client::connect(server.local_addr(), TIMEOUT).await.expect("torch client");
    let mut wire = Vec::new();
    crate::store::tcp::frame::Request::Watch { mode: crate::store::tcp::frame::WatchMode::Prefix, pattern: b"/x/" }
        .encode(&mut wire);
    torch.set("x/a", b"1").await.expect("its own keys");
    // The raw WATCH goes out on a fresh socket: the client has no watch call any more.
    let mut raw = tokio::net::TcpStream::connect(server.local_addr()).await.expect("connect");
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(&[0x00, 0xce, 0xf7, 0x85, 0x3c]).await.expect("validate");
    raw.write_all(&wire).await.expect("watch");
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(TIMEOUT, raw.read(&mut buf)).await.expect("in time");
    assert!(matches!(read, Ok(0) | Err(_)), "the server closes a plain client's WATCH: {read:?}");
}

/// Environment variable naming the store a [`session_holder_process`] child connects to.
const HOLDER_ADDR: &str = "MUSTER_TEST_SESSION_HOLDER_ADDR";

/// Not a test by itself: the child process of the next test (this test binary re-run with
/// `HOLDER_ADDR` set), which holds a session key until it is SIGKILLed.
#[test]
fn session_holder_process() {
    let Ok(addr) = std::env::var(HOLDER_ADDR) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let addr = addr.parse().expect("address");
        let store = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("connect");
        store.set_session("agents/child", b"alive").await.expect("session");
        println!("holder ready");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_key_of_a_killed_process_vanishes() {
    let server = start().await;
    let watcher = agent(&server).await;
    let mut events = watcher.watch(&[WatchTarget::Key("agents/child".into())]).await.expect("watch");
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "store::tcp::server::session_tests::session_holder_process", "--nocapture"])
        .env(HOLDER_ADDR, server.local_addr().to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("holder");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    while let Some(line) = tokio::time::timeout(TIMEOUT, lines.next_line()).await.expect("in time").expect("read") {
        if line.contains("holder ready") {
            break;
        }
    }
    let written = tokio::time::timeout(TIMEOUT, events.recv()).await.expect("in time");
    assert_eq!(written, Some(event(WatchEventKind::Written, "agents/child")));
    child.start_kill().expect("SIGKILL the holder");
    let deleted = tokio::time::timeout(TIMEOUT, events.recv()).await.expect("in time");
    assert_eq!(deleted, Some(event(WatchEventKind::Deleted, "agents/child")));
    child.wait().await.expect("reaped");
}
