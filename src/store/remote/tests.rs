//! The store over TCP under requests dropped at random points: every later request gets its own correct
//! reply (a dropped request's reply is read and discarded), on one connection; session keys outlive a
//! cancelled caller and a broken connection; a wrong job token is refused.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::store::tcp::client::tests::{Case, Cut, Op, OPS_PER_SEED, SEEDS};
use crate::store::tcp::frame::tests::Rng;
use crate::store::tcp::{Client, Server, ServerConfig};

const TIMEOUT: Duration = Duration::from_secs(5);

async fn server() -> Server {
    Server::bind((Ipv4Addr::LOCALHOST, 0).into(), ServerConfig::default()).await.expect("bind")
}

/// Runs the operation and says whether its reply is the one it should be.
async fn correct(store: &RemoteStore, case: &Case) -> Result<bool, StoreError> {
    Ok(match case.op {
        Op::Set => {
            store.set(&case.z, &case.w).await?;
            store.get(&case.z).await? == Some(case.w.clone())
        }
        Op::Get => store.get(&case.x).await? == Some(case.v.clone()),
        Op::Add(d) => store.add(&case.x, d).await? == case.base + d,
        Op::CompareSet => store.compare_set(&case.x, &case.v, &case.w).await? == case.w,
        Op::Wait => store.wait(&case.x, TIMEOUT).await?,
        Op::WaitMissing => !store.wait(&case.z, Duration::from_millis(2)).await?,
        Op::MultiGet => store.multi_get(&[case.x.clone(), case.y.clone()]).await? == [Some(case.v.clone()), Some(case.w.clone())],
        Op::List => {
            let prefix = case.x.trim_end_matches('x');
            let keys = store.list(prefix).await?;
            keys.contains(&case.x) && keys.contains(&case.y)
        }
        Op::Delete => store.delete(&case.x).await? && store.get(&case.x).await?.is_none(),
    })
}

#[tokio::test]
async fn every_request_after_a_dropped_one_gets_its_own_reply() {
    let mut cuts = 0;
    for seed in 0..SEEDS {
        let server = server().await;
        let addr = server.local_addr();
        let mut oracle = Client::connect(addr, TIMEOUT).await.expect("oracle");
        let store = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("store");
        let mut rng = Rng::new(seed);
        for i in 0..OPS_PER_SEED {
            let case = Case::random(&mut rng, seed, i);
            case.prepare(&mut oracle).await;
            match Cut::random(&mut rng).run(correct(&store, &case)).await {
                None => cuts += 1,
                Some(Ok(ok)) => assert!(ok, "seed {seed} op {i} {:?}: wrong reply", case.op),
                Some(Err(e)) => panic!("seed {seed} op {i} {:?}: {e}", case.op),
            }
        }
        assert!(store.working().is_some(), "seed {seed}: cuts never cost the connection");
    }
    assert!(cuts > 0);
}

#[tokio::test]
async fn a_cancelled_session_write_still_lands_and_a_broken_session_is_set_again() {
    let server = server().await;
    let addr = server.local_addr();
    let store = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("store");
    let observer = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("observer");
    // Dropped at its first poll: the key was sent, so it is still set.
    let cut = Cut::Polls(0).run(store.set_session("alive/a", b"1")).await;
    assert!(cut.is_none());
    store.set_session("alive/b", b"2").await.expect("session key");
    assert_eq!(observer.get("alive/a").await.expect("get"), Some(b"1".to_vec()));
    // A key deleted on purpose is not set again on a reconnect.
    store.delete("alive/b").await.expect("delete");
    // The store restarts on the same port: the next request reconnects and sets the keys again first.
    let mut watch = observer.watch(&[WatchTarget::Key("alive/a".into())]).await.expect("watch");
    server.shutdown().await;
    let server = Server::bind(addr, ServerConfig::default()).await.expect("rebind the same port");
    let observer = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("observer again");
    // The old watch ends with the old server (after, perhaps, the key's deletion as the session ended).
    let ends = async { while watch.recv().await.is_some() {} };
    tokio::time::timeout(TIMEOUT, ends).await.expect("the watch ends with its server");
    store.get("anything").await.expect("the store connects again");
    let reset = async {
        while observer.get("alive/a").await.expect("get").is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(TIMEOUT, reset).await.expect("the session was re-established");
    assert_eq!(observer.get("alive/b").await.expect("get"), None, "a deleted key stays deleted");
    drop(store);
    let ended = async {
        while observer.get("alive/a").await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(TIMEOUT, ended).await.expect("dropping the store ends its session");
    drop(server);
}

#[tokio::test]
async fn an_agent_with_a_wrong_token_is_refused_and_one_with_the_right_token_served() {
    let config = ServerConfig { token: Some(b"s3cret".to_vec()), ..ServerConfig::default() };
    let server = Server::bind((Ipv4Addr::LOCALHOST, 0).into(), config).await.expect("bind");
    let addr = server.local_addr();
    for wrong in [&b""[..], b"s3cre", b"guess"] {
        match RemoteStore::connect(addr, wrong, TIMEOUT, TIMEOUT).await {
            Err(StoreError::WrongToken { addr: a }) => assert_eq!(a, addr),
            Err(e) => panic!("token {wrong:?}: {e}"),
            Ok(_) => panic!("token {wrong:?} was let in"),
        }
    }
    let store = RemoteStore::connect(addr, b"s3cret", TIMEOUT, TIMEOUT).await.expect("the right token");
    store.set("muster/run/k", b"v").await.expect("set");
    assert_eq!(store.get("muster/run/k").await.expect("get"), Some(b"v".to_vec()));
}

#[tokio::test]
async fn waits_and_watches_share_the_connection_with_other_requests() {
    let server = server().await;
    let addr = server.local_addr();
    let store = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("store");
    let writer = RemoteStore::connect(addr, b"", TIMEOUT, TIMEOUT).await.expect("writer");
    let mut events = store.watch(&[WatchTarget::Prefix("r/".into())]).await.expect("watch");
    // A long wait runs beside other requests and a watch on the one connection.
    let waiting = store.wait("r/go", Duration::from_secs(30));
    let others = async {
        assert_eq!(store.add("r/n", 2).await.expect("add"), 2);
        writer.set("r/go", b"1").await.expect("set");
    };
    let (waited, ()) = tokio::join!(waiting, others);
    assert!(waited.expect("wait"));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(TIMEOUT, events.recv()).await.expect("event").expect("open");
        seen.push(event.key);
    }
    assert_eq!(seen, ["r/n", "r/go"]);
    // A missing key times out without holding anything up.
    assert!(!store.wait("r/never", Duration::from_millis(20)).await.expect("wait"));
    assert_eq!(store.get("r/go").await.expect("get"), Some(b"1".to_vec()));
}

