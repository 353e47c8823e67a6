//! The store over TCP under requests dropped at random points: every later request gets its own correct
//! reply (a dropped request takes its connection with it), and session keys outlive a cancelled caller and a
//! broken liveness connection.

use std::net::Ipv4Addr;
use std::time::Duration;

use super::*;
use crate::store::tcp::client::tests::{Case, Cut, Op, OPS_PER_SEED, SEEDS};
use crate::store::tcp::frame::tests::Rng;
use crate::store::tcp::{Server, ServerConfig};

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
        Op::MultiGet => store.multi_get(&[case.x.clone(), case.y.clone()]).await? == [case.v.clone(), case.w.clone()],
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
        let store = RemoteStore::connect(addr, TIMEOUT, TIMEOUT).await.expect("store");
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
        assert!(store.idle().len() <= MAX_IDLE);
    }
    assert!(cuts > 0);
}

#[tokio::test]
async fn a_cancelled_session_write_still_lands_and_a_broken_session_is_set_again() {
    let server = server().await;
    let addr = server.local_addr();
    let store = RemoteStore::connect(addr, TIMEOUT, TIMEOUT).await.expect("store");
    let observer = RemoteStore::connect(addr, TIMEOUT, TIMEOUT).await.expect("observer");
    // Dropped at its first poll: the liveness task still sets the key.
    let cut = Cut::Polls(0).run(store.set_session("alive/a", b"1")).await;
    assert!(cut.is_none());
    store.set_session("alive/b", b"2").await.expect("session key");
    assert_eq!(observer.get("alive/a").await.expect("get"), Some(b"1".to_vec()));
    // A key deleted on purpose is not set again on a reconnect.
    store.delete("alive/b").await.expect("delete");
    // The store restarts on the same port: the liveness task reconnects and sets its keys again.
    let mut watch = observer.watch(&[WatchTarget::Key("alive/a".into())]).await.expect("watch");
    server.shutdown().await;
    let server = Server::bind(addr, ServerConfig::default()).await.expect("rebind the same port");
    let observer = RemoteStore::connect(addr, TIMEOUT, TIMEOUT).await.expect("observer again");
    // The old watch ends with the old server (after, perhaps, the key's deletion as the session ended).
    let ends = async { while watch.recv().await.is_some() {} };
    tokio::time::timeout(TIMEOUT, ends).await.expect("the watch ends with its server");
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
