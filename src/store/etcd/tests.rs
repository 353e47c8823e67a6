//! The `Store` semantics on a real etcd (single member, loopback).

use std::time::Duration;

use super::testing::{until, TestEtcd};
use crate::store::{Store, WatchEventKind, WatchTarget};

#[tokio::test]
async fn keys_counters_and_compare_set() {
    let etcd = TestEtcd::start();
    let s = etcd.store("/t/").await;
    assert_eq!(s.get("a").await.unwrap(), None);
    s.set("a", b"1").await.unwrap();
    assert_eq!(s.get("a").await.unwrap(), Some(b"1".to_vec()));
    assert!(s.add("a", 1).await.is_ok(), "an integer value adds");
    crate::store::conformance::counters_and_compare_set(&s).await;
    s.multi_set(&[("m/1".into(), b"a".to_vec()), ("m/2".into(), b"b".to_vec())]).await.unwrap();
    let keys: Vec<String> = (0..300).map(|i| format!("m/{i}")).collect();
    let values = s.multi_get(&keys).await.unwrap();
    assert_eq!(values.len(), 300, "one value or None per key, in order");
    assert_eq!(values[1..3], [Some(b"a".to_vec()), Some(b"b".to_vec())]);
    assert!(values[3..].iter().chain(&values[..1]).all(Option::is_none));
    let mut listed = s.list("m/").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["m/1", "m/2"]);
    assert!(s.delete("m/1").await.unwrap());
    assert!(!s.delete("m/1").await.unwrap());
    // Another namespace sees none of it.
    let other = etcd.store("/u/").await;
    assert_eq!(other.get("a").await.unwrap(), None);
    assert!(other.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn session_keys_end_with_their_handle_and_watches_see_it() {
    let etcd = TestEtcd::start();
    let observer = etcd.store("/t/").await;
    let member = etcd.store("/t/").await;
    member.set_session("alive/x", b"1").await.unwrap();
    member.beat("hb/x", b"1", Duration::from_secs(2)).await.unwrap();
    let mut events = observer.watch(&[WatchTarget::Key("alive/x".into()), WatchTarget::Prefix("w/".into())]).await.unwrap();
    observer.set("w/1", b"j").await.unwrap();
    let e = events.recv().await.unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Written, "w/1"));
    drop(member);
    let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Deleted, "alive/x"));
    assert_eq!(observer.get("hb/x").await.unwrap(), None, "the heartbeat is on the lease too");
}

#[tokio::test]
async fn waits_end_when_the_key_comes_or_the_time_is_up() {
    let etcd = TestEtcd::start();
    let s = etcd.store("/t/").await;
    assert!(!s.wait("k", Duration::from_millis(300)).await.unwrap());
    // A handle of its own, whose only watch is this wait's; the key is written once the wait found
    // it missing and etcd created its watch, so it is the event that ends the wait.
    let waiter = etcd.store("/t/").await;
    let writer = etcd.store("/t/").await;
    let (waited, ()) = tokio::join!(waiter.wait("k", Duration::from_secs(20)), async {
        until("the wait parked on a created watch", || {
            waiter.parked_waits() == 1 && waiter.open_watches() == 1
        })
        .await;
        writer.set("k", b"v").await.unwrap();
    });
    assert!(waited.unwrap());
    assert!(s.wait("k", Duration::from_millis(1)).await.unwrap());
}

#[tokio::test]
async fn a_killed_handle_is_gone_after_its_lease() {
    let etcd = TestEtcd::start();
    let observer = etcd.store("/t/").await;
    let member = etcd.store("/t/").await;
    member.set_session("alive/y", b"1").await.unwrap();
    let mut events = observer.watch(&[WatchTarget::Key("alive/y".into())]).await.unwrap();
    // As a SIGKILLed agent: no revoke, no keepalive.
    member.session.abandon();
    drop(member);
    let e = tokio::time::timeout(Duration::from_secs(15), events.recv()).await.unwrap().unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Deleted, "alive/y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_each_count_once_and_adding_zero_only_reads() {
    let etcd = TestEtcd::start();
    let txns = || async { crate::bench::etcd::requests_handled(&etcd.endpoint).await.and_then(|m| m.get("Txn").copied()).unwrap_or(0) };
    let txns_before = txns().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..32 {
        let s = std::sync::Arc::new(etcd.store("/t/").await);
        // Half increment, half poll, as joiners and waiting nodes do with a round's slot counter.
        tasks.spawn(async move { (i % 2 == 0, s.add("slot", if i % 2 == 0 { 1 } else { 0 }).await.unwrap()) });
    }
    let (mut slots, mut polled) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (adder, n) = done.unwrap();
        if adder { slots.push(n) } else { polled.push(n) }
    }
    slots.sort_unstable();
    assert_eq!(slots, (1..=16).collect::<Vec<i64>>(), "each adder got its own value");
    // One transaction an adder, the one that created the counter and those racing it included: each is a
    // write to etcd's log, whatever its comparison finds.
    assert_eq!(txns().await - txns_before, 16, "transactions for 16 adds");
    assert!(polled.iter().all(|&n| (0..=16).contains(&n)), "{polled:?}");
    let s = etcd.store("/t/").await;
    assert_eq!(s.add("slot", 0).await.unwrap(), 16);
    assert_eq!(s.add("never", 0).await.unwrap(), 0);
    assert_eq!(s.get("never").await.unwrap(), None, "adding 0 writes nothing");
}

#[tokio::test]
async fn counters_read_as_their_count_and_other_adds_still_add() {
    let etcd = TestEtcd::start();
    let s = etcd.store("/t/").await;
    assert_eq!(s.add("c", 1).await.unwrap(), 1);
    assert_eq!(s.add("c", 1).await.unwrap(), 2);
    assert_eq!(s.get("c").await.unwrap(), Some(b"2".to_vec()), "a counter reads as its count");
    assert_eq!(s.multi_get(&["c".into()]).await.unwrap(), vec![Some(b"2".to_vec())]);
    assert_eq!(s.add("c", 5).await.unwrap(), 7, "another delta adds to the count");
    assert_eq!(s.add("c", 1).await.unwrap(), 8);
    assert_eq!(s.get("c").await.unwrap(), Some(b"8".to_vec()));
    s.set("p", b"40").await.unwrap();
    assert_eq!(s.add("p", 1).await.unwrap(), 41, "a value set as text adds as before");
    assert_eq!(s.add("p", -41).await.unwrap(), 0);
    assert!(s.delete("c").await.unwrap());
    assert_eq!(s.add("c", 1).await.unwrap(), 1, "a deleted counter starts again");
}

/// etcd forgot this handle's lease (it expired while etcd was frozen): one new lease carries every session
/// key, and it is the one kept alive, however busy the heartbeat is meanwhile. A second lease granted
/// beside it would leave the liveness key on a lease nobody keeps alive, gone one TTL later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_replaced_once_with_every_session_key_on_it() {
    let etcd = TestEtcd::start();
    let observer = etcd.store("/t/").await;
    let member = std::sync::Arc::new(etcd.store("/t/").await);
    member.set_session("alive/x", b"1").await.unwrap();
    let first = member.session.current().unwrap();
    let mut events = observer.watch(&[WatchTarget::Key("alive/x".into())]).await.unwrap();
    let beating = {
        let member = member.clone();
        tokio::spawn(async move {
            loop {
                let _ = member.beat("hb/x", b"1", Duration::from_secs(2)).await;
                tokio::task::yield_now().await;
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let revoke = super::pb::LeaseRevokeRequest { id: first };
    member.cluster.call::<_, super::pb::LeaseRevokeResponse>(super::pb::path::LEASE_REVOKE, &revoke, deadline).await.unwrap();
    for kind in [WatchEventKind::Deleted, WatchEventKind::Written] {
        let e = tokio::time::timeout(Duration::from_secs(15), events.recv()).await.unwrap().unwrap();
        assert_eq!((e.kind, e.key.as_str()), (kind, "alive/x"));
    }
    member.set_session("alive/y", b"1").await.unwrap();
    beating.abort();
    let kept = member.session.current().unwrap();
    assert_ne!(kept, first, "a new lease");
    for key in ["alive/x", "alive/y"] {
        let range = super::wire::range(&observer.full(key), false, false);
        let reply: super::pb::RangeResponse = observer.cluster.call(super::pb::path::RANGE, &range, deadline).await.unwrap();
        assert_eq!(reply.kvs.first().map(|kv| kv.lease), Some(kept), "{key} is on the lease kept alive");
    }
}

/// A watch and the lease's keepalive are streams that live as long as the store: a request's deadline
/// (a couple of seconds) must not go with them, or etcd ends them when it passes and they are opened again
/// and again (etcd's own count of the streams it began says so).
#[tokio::test]
async fn streams_outlive_a_request_deadline() {
    let etcd = TestEtcd::start();
    let s = etcd.store("/t/").await;
    let creates = || async { crate::bench::etcd::calls_started(&etcd.endpoint).await.and_then(|m| m.get("Watch").copied()) };
    let mut events = s.watch(&[WatchTarget::Key("k".into())]).await.unwrap();
    let before = creates().await;
    assert_eq!(before, Some(1), "one watch stream opened");
    // Time passing is the point here: past the bound a request carries.
    tokio::time::sleep(super::cluster::ATTEMPT + Duration::from_secs(1)).await;
    s.set("k", b"1").await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Written, "k"));
    assert_eq!(creates().await, before, "the watch stream was not opened again");
}

/// A member that cannot take a cancelled read-only transaction (etcd 3.5.0 to 3.5.4) is sent its reads
/// uncancelled, with the same answers: values in the keys' order, a prefix's values, and watches that start
/// after their reads.
#[tokio::test]
async fn reads_sent_uncancelled_answer_as_the_others_do() {
    let etcd = TestEtcd::start();
    let writer = etcd.store("/k/").await;
    writer.multi_set(&[("m/1".into(), b"a".to_vec()), ("m/2".into(), b"b".to_vec())]).await.unwrap();
    writer.add("c", 1).await.unwrap();
    // More keys than one transaction holds.
    let mut keys: Vec<String> = ["m/2", "x", "m/1", "c"].map(String::from).to_vec();
    keys.extend((0..200).map(|i| format!("none/{i}")));
    for cancel_reads in [true, false] {
        let mut s = etcd.store("/k/").await;
        s.cancel_reads = cancel_reads;
        let values = s.multi_get(&keys).await.unwrap();
        let got: Vec<Option<&[u8]>> = values.iter().take(4).map(Option::as_deref).collect();
        assert_eq!(got, [Some(&b"b"[..]), None, Some(b"a"), Some(b"1")], "cancel_reads {cancel_reads}");
        assert!(values[4..].iter().all(Option::is_none) && values.len() == keys.len());
        let scanned = s.scan("m/").await.unwrap();
        assert_eq!(scanned, [("m/1".to_string(), b"a".to_vec()), ("m/2".to_string(), b"b".to_vec())]);
        let mut events = s.follow(&[WatchTarget::Key("m/1".into()), WatchTarget::Prefix("w/".into())]).await.unwrap();
        writer.set(&format!("w/{cancel_reads}"), b"j").await.unwrap();
        let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
        assert_eq!((e.kind, e.key), (WatchEventKind::Written, format!("w/{cancel_reads}")));
    }
}
