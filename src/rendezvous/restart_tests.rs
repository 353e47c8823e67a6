//! A TCP rendezvous store restarted (shut down, then bound again on its port with no keys) under agents
//! that are running, joining or re-forming: they carry on in the new store; only a store gone for longer
//! than `store_timeout` (refusing connections: for longer than a liveness window) ends them. A store hosted
//! by an agent that is gone ends them at once (`ending.rs`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use super::tests::shared::{agent, join_all, settings, tcp, Backend};
use super::*;
use crate::store::remote::RemoteStore;
use crate::store::tcp::{Server, ServerConfig};

/// Agents whose requests and reconnects give up after half a second, so a store down longer than that
/// fails their requests (`Connect`, `Closed`) rather than being waited out inside the store client.
struct Impatient(SocketAddr);

impl Backend for Impatient {
    type S = RemoteStore;
    fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
        let t = Duration::from_millis(500);
        Box::pin(async move { RemoteStore::connect(self.0, b"", t, t).await.expect("connect") })
    }
}

/// Settings whose liveness window (3 s) outlasts a store restart ([`restart`]): a refusing store is waited
/// for that long at a re-formation.
fn patient(min: u32, max: u32) -> Settings {
    Settings { keep_alive_interval: Duration::from_secs(1), ..settings(min, max) }
}

/// Down long enough for the agents' in-flight requests and reconnects to fail, then up again, empty.
async fn restart(server: Server) -> Server {
    let addr = server.local_addr();
    server.shutdown().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Server::bind(addr, ServerConfig::default()).await.expect("bind the same port again")
}

fn within<T>(secs: u64, f: impl Future<Output = T>) -> impl Future<Output = Result<T, tokio::time::error::Elapsed>> {
    tokio::time::timeout(Duration::from_secs(secs), f)
}

/// The store restarted under a running group: every member re-forms in the new store instead of failing
/// with the store lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_store_makes_the_group_reform_in_it() {
    let b = tcp().await;
    let addr = b.0.local_addr();
    let agents = vec![agent(&b, "a", 1, settings(2, 2)).await, agent(&b, "b", 1, settings(2, 2)).await];
    let joined = join_all(agents).await;
    b.0.shutdown().await;
    let _again = Server::bind(addr, ServerConfig::default()).await.expect("bind the same port again");
    let tasks: Vec<_> = joined
        .into_iter()
        .map(|(mut a, _)| {
            tokio::spawn(async move {
                let event = within(10, a.next_event()).await.expect("seen in time").expect("no error");
                // The old server deletes the other agent's session keys as it closes its connections, so a
                // node may hear of that loss before its own connection ends: either way the group re-forms.
                assert!(matches!(event, RdzvEvent::RoundChanged | RdzvEvent::PeerLost(_)), "{event:?}");
                a.next_round().await.expect("re-formed in the new store")
            })
        })
        .collect();
    for t in tasks {
        let info = within(30, t).await.expect("in time").expect("task");
        assert_eq!(info.group_world_size, 2);
    }
}

/// A node waiting for the others when the store restarts (its wait for the seal in flight) joins the new
/// store's round, which the next node then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restarted_mid_join_is_joined_again() {
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind");
    let b = Impatient(server.local_addr());
    let mut first = agent(&b, "a", 1, patient(2, 2)).await;
    let probe = b.connect().await;
    let joining = tokio::spawn(async move { first.next_round().await });
    assert!(probe.wait("muster/suite/r/0/m/1", Duration::from_secs(10)).await.expect("probe"), "a joined");
    let _server = restart(server).await;
    assert!(!joining.is_finished(), "the join gave up while the store was down: {:?}", joining.await);
    let mut second = agent(&b, "b", 1, patient(2, 2)).await;
    let (a, b) = tokio::join!(within(30, joining), within(30, second.next_round()));
    let a = a.expect("a in time").expect("task").expect("a joined the new store");
    let b = b.expect("b in time").expect("b joined");
    assert_eq!((a.group_world_size, b.group_world_size), (2, 2));
}

/// Both nodes re-forming (opening the next round, then joining it) while the store restarts: they form
/// the next group in the new store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restarted_mid_reform_is_reformed_in() {
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind");
    let b = Impatient(server.local_addr());
    let agents = vec![agent(&b, "a", 1, patient(2, 2)).await, agent(&b, "b", 1, patient(2, 2)).await];
    let joined = join_all(agents).await;
    let (go, _) = tokio::sync::broadcast::channel::<()>(1);
    let tasks: Vec<_> = joined
        .into_iter()
        .map(|(mut a, _)| {
            let mut down = go.subscribe();
            tokio::spawn(async move {
                down.recv().await.expect("the store went down");
                a.open_next_round().await?;
                a.next_round().await
            })
        })
        .collect();
    let addr = server.local_addr();
    server.shutdown().await;
    go.send(()).expect("two re-forming nodes");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(tasks.iter().all(|t| !t.is_finished()), "a re-form gave up while the store was down");
    let _again = Server::bind(addr, ServerConfig::default()).await.expect("bind the same port again");
    for t in tasks {
        let info = within(30, t).await.expect("in time").expect("task").expect("re-formed in the new store");
        assert_eq!(info.group_world_size, 2);
    }
}

/// A store gone for longer than `store_timeout` ends a re-forming node with the store lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_gone_past_its_timeout_is_lost() {
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind");
    let b = Impatient(server.local_addr());
    let mut s = patient(1, 1);
    s.store_timeout = Duration::from_secs(2);
    let mut a = agent(&b, "a", 1, s).await;
    a.next_round().await.expect("joined alone");
    server.shutdown().await;
    let err = within(30, a.open_next_round()).await.expect("gave up in time").expect_err("the store is gone");
    assert!(matches!(err, RdzvError::StoreLost), "{err}");
    assert!(err.to_string().contains("lost the connection to the rendezvous store"), "{err}");
}

/// The end of a finished job: the host's store goes away as soon as the host is done, and no other member
/// may still need it then (their last requests used to find it gone and wait out a reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_outlives_every_members_last_request() {
    let b = tcp().await;
    let agents = vec![
        agent(&b, "h", 1, settings(3, 3)).await,
        agent(&b, "x", 1, settings(3, 3)).await,
        agent(&b, "y", 1, settings(3, 3)).await,
    ];
    let mut joined = join_all(agents).await.into_iter();
    let (host, _) = joined.next().expect("host");
    let others: Vec<_> = joined
        .map(|(a, _)| {
            tokio::spawn(async move {
                a.exit_barrier().await?;
                a.close(None).await?;
                a.leave_store(false).await
            })
        })
        .collect();
    host.exit_barrier().await.expect("barrier");
    host.close(None).await.expect("close");
    within(15, host.leave_store(true)).await.expect("in time").expect("leave");
    b.0.shutdown().await;
    for task in others {
        within(5, task).await.expect("in time").expect("task").expect("every last request was served");
    }
}

/// An external store that refuses connections for a whole liveness window ends a re-forming node with a
/// line that says so, not after `store_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refusing_for_a_window_ends_a_reforming_node() {
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind");
    let b = Impatient(server.local_addr());
    let mut s = patient(1, 1);
    s.store_timeout = Duration::from_secs(600);
    let mut a = agent(&b, "a", 1, s).await;
    a.next_round().await.expect("joined alone");
    server.shutdown().await;
    let err = within(30, a.open_next_round()).await.expect("gave up in time").expect_err("the store is gone");
    assert!(matches!(err, RdzvError::StoreRefused { waited, .. } if waited == Duration::from_secs(3)), "{err}");
}

/// The agent hosting the store is gone: the other members end at once, while watching the round and while
/// re-forming, naming the host; the host's own round trips never meet a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_host_agent_is_gone_ends_every_member_at_once() {
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind");
    let b = Impatient(server.local_addr());
    let mut host = agent(&b, "h", 1, settings(3, 3)).await;
    host.announce_host().await.expect("announce");
    let agents = vec![host, agent(&b, "m", 1, settings(3, 3)).await, agent(&b, "n", 1, settings(3, 3)).await];
    let mut joined = join_all(agents).await.into_iter();
    drop(joined.next());
    let (mut watching, _) = joined.next().expect("m");
    let (reforming, _) = joined.next().expect("n");
    server.shutdown().await;
    // A graceful shutdown deletes the host's liveness key as it closes its connections: the member may hear
    // of that loss first, and then finds the store gone as it re-forms.
    let watched = match within(5, watching.next_event()).await.expect("at once") {
        Ok(event) => {
            assert!(matches!(event, RdzvEvent::PeerLost(_)), "{event:?}");
            within(5, watching.open_next_round()).await.expect("at once").expect_err("the store went with its host")
        }
        Err(e) => e,
    };
    let reformed = within(5, reforming.open_next_round()).await.expect("at once").expect_err("the store went with its host");
    for err in [watched, reformed] {
        assert!(matches!(&err, RdzvError::StoreHostEnded { node, .. } if node == "h"), "{err}");
    }
}
