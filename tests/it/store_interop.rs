//! The embedded store against torch 2.15 itself: torch's own `TCPStore` client must see the
//! same store in muster's server as in torch's libuv and legacy servers (identical logs of
//! `tests/interop/tcpstore_conformance.py`), and muster's client must give the same log
//! against all three.
//!
//! Needs `MUSTER_PYTHON`, a Python with torch 2.15 (`scripts/test.sh` sets it); without it
//! these tests fail rather than pass silently.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use muster::store::tcp::frame::Request;
use muster::store::tcp::Client;
use muster::store::StoreError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TIMEOUT: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(300);

fn python() -> PathBuf {
    match std::env::var_os("MUSTER_PYTHON") {
        Some(python) => python.into(),
        None => panic!(
            "MUSTER_PYTHON is not set: point it at a Python with torch 2.15 \
             (scripts/test.sh uses /root/.cache/muster/venv/bin/python)"
        ),
    }
}

fn interop_script(name: &str) -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "tests", "interop", name]
        .iter()
        .collect()
}

/// A store server in a child process, killed on drop.
struct ServerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl ServerProcess {
    /// torch's own server, `libuv` or `legacy`.
    fn torch(backend: &str) -> ServerProcess {
        let mut command = Command::new(python());
        command
            .arg(interop_script("torch_store_server.py"))
            .arg(backend);
        ServerProcess::spawn(command)
    }

    /// `muster store` on an ephemeral port.
    fn muster() -> ServerProcess {
        let mut command = Command::new(env!("CARGO_BIN_EXE_muster"));
        command.args(["store", "--host", "127.0.0.1", "--port", "0"]);
        ServerProcess::spawn(command)
    }

    fn spawn(mut command: Command) -> ServerProcess {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start store server");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        ServerProcess {
            child,
            stdin,
            stdout,
        }
    }

    /// The address of the next server this process announces.
    fn next_addr(&mut self) -> SocketAddr {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read server announcement");
        let port = line
            .trim()
            .rsplit([' ', ':'])
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in server announcement {line:?}"));
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    }

    /// A fresh torch store in the same process (the torch helper starts one per stdin line).
    fn fresh_torch_store(&mut self) -> SocketAddr {
        let stdin = self.stdin.as_mut().expect("torch helper stdin");
        stdin
            .write_all(b"\n")
            .and_then(|()| stdin.flush())
            .expect("ask for a store");
        self.next_addr()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The key [`Relay`] sets behind the request it is armed with.
const APPLIED: &str = "relay-applied";

/// Passes one client connection's bytes to `server` and back, and slips a SET of [`APPLIED`] in
/// right behind the client request it is armed with, on the same connection. A server applies one
/// connection's requests in order, and all three go on reading past a pending WAIT or BARRIER; so
/// once another client sees the key, that request was applied: a wait on keys not yet there is
/// parked, and what the other client does next is what wakes it (not a write the wait would find
/// already done, which the same log would hide). SET has no reply: the client sees nothing of it.
struct Relay {
    addr: SocketAddr,
    armed: Arc<Mutex<Option<Vec<u8>>>>,
}

impl Relay {
    async fn start(server: SocketAddr) -> Relay {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
        let slot = armed.clone();
        tokio::spawn(async move {
            let (client, _) = listener.accept().await.unwrap();
            let upstream = TcpStream::connect(server).await.unwrap();
            upstream.set_nodelay(true).unwrap();
            client.set_nodelay(true).unwrap();
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = upstream.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
            });
            let mut marker = Vec::new();
            let key = format!("/{APPLIED}");
            Request::Set { key: key.as_bytes(), value: b"" }.encode(&mut marker);
            let mut buf = vec![0; 64 << 10];
            // What is still to pass of the request armed with.
            let mut rest: Vec<u8> = Vec::new();
            loop {
                let n = match from_client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if rest.is_empty() {
                    rest = slot.lock().unwrap().take().unwrap_or_default();
                }
                let mut chunk = &buf[..n];
                if !rest.is_empty() {
                    let k = rest.len().min(chunk.len());
                    assert_eq!(chunk[..k], rest[..k], "the client's request is not the armed one");
                    rest.drain(..k);
                    let mut head = chunk[..k].to_vec();
                    if rest.is_empty() {
                        head.extend_from_slice(&marker);
                    }
                    chunk = &chunk[k..];
                    if to_server.write_all(&head).await.is_err() {
                        break;
                    }
                }
                if to_server.write_all(chunk).await.is_err() {
                    break;
                }
            }
        });
        Relay { addr, armed }
    }

    /// Arms the relay for the client's next request, which must be `request` (keys in wire form).
    fn behind(&self, request: Request<'_>) {
        let mut wire = Vec::new();
        request.encode(&mut wire);
        *self.armed.lock().unwrap() = Some(wire);
    }
}

/// Waits (10 s at most) until the relay's [`APPLIED`] key is set, then deletes it (the log counts
/// keys).
async fn applied(other: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !other.check(&[APPLIED]).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the server did not apply the relayed request within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(other.delete_key(APPLIED).await.unwrap());
}

/// The log of torch's own client running the conformance steps against `addr`.
fn torch_client_log(addr: SocketAddr, queues: bool) -> String {
    let mut command = Command::new(python());
    command.arg(interop_script("tcpstore_conformance.py"));
    command
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string());
    if !queues {
        command.arg("--no-queues");
    }
    let output = command.output().expect("run tcpstore_conformance.py");
    assert!(
        output.status.success(),
        "tcpstore_conformance.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 log")
}

/// How the conformance log prints a result.
trait Show {
    fn show(self) -> String;
}

impl Show for () {
    fn show(self) -> String {
        "ok".into()
    }
}

impl Show for bool {
    fn show(self) -> String {
        self.to_string()
    }
}

impl Show for i64 {
    fn show(self) -> String {
        self.to_string()
    }
}

impl Show for Vec<u8> {
    fn show(self) -> String {
        self.iter()
            .fold("0x".to_owned(), |s, b| s + &format!("{b:02x}"))
    }
}

impl Show for Vec<Vec<u8>> {
    fn show(self) -> String {
        let items: Vec<String> = self.into_iter().map(Show::show).collect();
        format!("[{}]", items.join(", "))
    }
}

impl Show for Vec<String> {
    fn show(mut self) -> String {
        self.sort();
        format!("[{}]", self.join(", "))
    }
}

/// torch raises QueueEmptyError where muster's client returns `None`.
impl Show for Option<Vec<u8>> {
    fn show(self) -> String {
        self.map_or_else(|| "error:QueueEmptyError".into(), Show::show)
    }
}

fn shown<T: Show>(result: Result<T, StoreError>) -> String {
    match result {
        Ok(value) => value.show(),
        // torch raises DistStoreError for wait and barrier timeouts.
        Err(StoreError::WaitTimeout { .. }) => "error:DistStoreError".into(),
        Err(other) => format!("error:{other}"),
    }
}

/// muster's client through the steps of `tcpstore_conformance.py`, in its log format.
async fn muster_client_log(addr: SocketAddr, queues: bool) -> String {
    let mut log = String::new();
    // Through the relay, which shows when a wait of `s` is parked.
    let relay = Relay::start(addr).await;
    let mut s = Client::connect(relay.addr, TIMEOUT).await.unwrap();
    let mut other = Client::connect(addr, TIMEOUT).await.unwrap();
    macro_rules! step {
        ($name:expr, $call:expr) => {
            writeln!(log, "{} -> {}", $name, shown($call.await)).unwrap()
        };
    }
    // `$call` once the server applied `s`'s next request, `$parks` (so it is parked).
    macro_rules! later {
        ($parks:expr, $client:ident, $call:expr) => {{
            relay.behind($parks);
            tokio::spawn(async move {
                applied(&mut $client).await;
                $call.await.unwrap();
                $client
            })
        }};
    }
    step!("set k v1", s.set("k", b"v1"));
    step!("get k", s.get("k"));
    step!("set bin 00ff", s.set("bin", b"\x00\xff"));
    step!("get bin", s.get("bin"));
    step!("add cnt 5", s.add("cnt", 5));
    step!("add cnt -2", s.add("cnt", -2));
    step!("get cnt", s.get("cnt"));
    step!(
        "compare_set k v1 v2 (match)",
        s.compare_set("k", b"v1", b"v2")
    );
    step!(
        "compare_set k zz v3 (mismatch)",
        s.compare_set("k", b"zz", b"v3")
    );
    step!(
        "compare_set new '' n1 (missing, empty expected)",
        s.compare_set("new", b"", b"n1")
    );
    step!(
        "compare_set missing2 x y (missing)",
        s.compare_set("missing2", b"x", b"y")
    );
    step!("check [k]", s.check(&["k"]));
    step!("check [k, nope]", s.check(&["k", "nope"]));
    step!("wait [k, cnt]", s.wait(&["k", "cnt"], TIMEOUT));
    step!("wait [k, cnt] 300ms", s.wait(&["k", "cnt"], SHORT));
    step!("wait [nope] 300ms", s.wait(&["nope"], SHORT));
    let setter = later!(
        Request::Wait {
            keys: vec![b"/later"]
        },
        other,
        other.set("later", b"x")
    );
    step!(
        "wait [later] set by another client",
        s.wait(&["later"], Duration::from_secs(5))
    );
    other = setter.await.unwrap();
    step!("num_keys", s.num_keys());
    step!("delete_key k", s.delete_key("k"));
    step!("delete_key k again", s.delete_key("k"));
    step!("check [k] after delete", s.check(&["k"]));
    step!("append ap ab", s.append("ap", b"ab"));
    step!("append ap cd", s.append("ap", b"cd"));
    step!("get ap", s.get("ap"));
    step!("multi_get [ap, cnt]", s.multi_get(&["ap", "cnt"]));
    step!(
        "multi_set [m1, m2]",
        s.multi_set(&[("m1", b"x"), ("m2", b"yy")])
    );
    step!("multi_get [m1, m2]", s.multi_get(&["m1", "m2"]));
    step!("list_keys (sorted)", s.list_keys());
    if queues {
        step!("queue_push q item1", s.queue_push("q", b"item1"));
        step!("queue_push q item2", s.queue_push("q", b"item2"));
        step!("queue_len q", s.queue_len("q"));
        step!("check [q] (non-empty queue)", s.check(&["q"]));
        step!("queue_pop q", s.queue_pop("q", false));
        step!("queue_pop q blocking", s.queue_pop("q", true));
        step!("queue_pop q empty", s.queue_pop("q", false));
        step!("queue_len q empty", s.queue_len("q"));
        let pusher = later!(
            Request::Wait { keys: vec![b"/q2"] },
            other,
            other.queue_push("q2", b"late")
        );
        step!(
            "queue_pop q2 blocking, pushed by another client",
            s.queue_pop("q2", true)
        );
        other = pusher.await.unwrap();
    }
    step!("barrier bar 1", s.barrier("bar", 1, TIMEOUT));
    step!("barrier bar2 2 300ms (alone)", s.barrier("bar2", 2, SHORT));
    step!("get bar2", s.get("bar2"));
    let peer = later!(
        Request::Barrier {
            key: b"/bar3",
            world_size: 2
        },
        other,
        other.barrier("bar3", 2, TIMEOUT)
    );
    step!(
        "barrier bar3 2 with another client",
        s.barrier("bar3", 2, Duration::from_secs(5))
    );
    peer.await.unwrap();
    step!("add bar3 0", s.add("bar3", 0));
    step!("num_keys at end", s.num_keys());
    step!("list_keys at end (sorted)", s.list_keys());
    s.ping().await.unwrap();
    log
}

fn assert_same_log(expected: &str, actual: &str, what: &str) {
    assert!(
        expected.lines().count() > 30,
        "conformance log too short:\n{expected}"
    );
    assert_eq!(
        expected, actual,
        "{what} differs from torch's libuv/legacy reference log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_behaviour_as_torch_libuv_server() {
    let mut torch = ServerProcess::torch("libuv");
    let reference = torch_client_log(torch.next_addr(), true);
    let mut muster = ServerProcess::muster();
    assert_same_log(
        &reference,
        &torch_client_log(muster.next_addr(), true),
        "torch client vs muster server",
    );
    let addr = torch.fresh_torch_store();
    assert_same_log(
        &reference,
        &muster_client_log(addr, true).await,
        "muster client vs torch libuv server",
    );
    let mut muster = ServerProcess::muster();
    assert_same_log(
        &reference,
        &muster_client_log(muster.next_addr(), true).await,
        "muster client vs muster server",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_behaviour_as_torch_legacy_server() {
    let mut torch = ServerProcess::torch("legacy");
    let reference = torch_client_log(torch.next_addr(), false);
    let mut muster = ServerProcess::muster();
    assert_same_log(
        &reference,
        &torch_client_log(muster.next_addr(), false),
        "torch client vs muster server",
    );
    let addr = torch.fresh_torch_store();
    assert_same_log(
        &reference,
        &muster_client_log(addr, false).await,
        "muster client vs torch legacy server",
    );
    // The legacy server has no queues: it closes the connection, which the client reports.
    let mut client = Client::connect(addr, TIMEOUT).await.unwrap();
    let err = client.queue_len("q").await.unwrap_err();
    assert!(matches!(err, StoreError::Closed { .. }), "{err}");
}
