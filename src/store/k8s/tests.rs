//! The `Store` semantics on a real kube-apiserver (loopback, in front of its own etcd).

use std::time::Duration;

use super::testing::{TestKube, User};
use super::{names, KubeStore};
use crate::store::{Store, StoreError, WatchEventKind, WatchTarget};

fn granted() -> TestKube {
    let kube = TestKube::start();
    kube.grant();
    kube
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_counters_and_compare_set() {
    let kube = granted();
    let s = kube.store("/t/").await;
    assert_eq!(s.get("a").await.unwrap(), None);
    s.set("a", b"1").await.unwrap();
    assert_eq!(s.get("a").await.unwrap(), Some(b"1".to_vec()));
    s.set("a", b"2").await.unwrap();
    assert_eq!(s.get("a").await.unwrap(), Some(b"2".to_vec()), "a set replaces");
    assert_eq!(s.add("never", 0).await.unwrap(), 0);
    assert_eq!(s.get("never").await.unwrap(), None, "adding 0 writes nothing");
    crate::store::conformance::counters_and_compare_set(&s).await;
    s.multi_set(&[("m/1".into(), b"a".to_vec()), ("m/2".into(), b"b".to_vec()), ("m/d/3".into(), b"c".to_vec())]).await.unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("m/{i}")).collect();
    let values = s.multi_get(&keys).await.unwrap();
    assert_eq!(values.len(), 40, "one value or None per key, in order");
    assert_eq!(values[1..3], [Some(b"a".to_vec()), Some(b"b".to_vec())]);
    let mut listed = s.list("m/").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["m/1", "m/2", "m/d/3"], "a prefix holds its keys at every depth");
    assert_eq!(s.scan("m/d/").await.unwrap(), [("m/d/3".to_string(), b"c".to_vec())]);
    assert!(s.delete("m/1").await.unwrap());
    assert!(!s.delete("m/1").await.unwrap());
    // Another job sees none of it, though its keys have the same names.
    let other = kube.store("/u/").await;
    assert_eq!(other.get("a").await.unwrap(), None);
    assert!(other.list("").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_each_count_once() {
    let kube = granted();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let s = std::sync::Arc::new(kube.store("/t/").await);
        tasks.spawn(async move { s.add("slot", 1).await.unwrap() });
    }
    let mut slots = Vec::new();
    while let Some(done) = tasks.join_next().await {
        slots.push(done.unwrap());
    }
    slots.sort_unstable();
    assert_eq!(slots, (1..=8).collect::<Vec<i64>>(), "each adder got its own value");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_see_writes_and_deletes_of_keys_and_prefixes_from_their_start() {
    let kube = granted();
    let (observer, writer) = (kube.store("/t/").await, kube.store("/t/").await);
    writer.set("w/before", b"0").await.unwrap();
    let targets = [WatchTarget::Key("k".into()), WatchTarget::Key("j".into()), WatchTarget::Prefix("w/".into())];
    let mut events = observer.watch(&targets).await.unwrap();
    writer.set("other", b"x").await.unwrap();
    writer.set("k", b"1").await.unwrap();
    writer.set("w/deep/1", b"2").await.unwrap();
    writer.delete("k").await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
        seen.push((e.kind, e.key));
    }
    seen.sort_by(|a, b| a.1.cmp(&b.1).then(format!("{:?}", a.0).cmp(&format!("{:?}", b.0))));
    assert_eq!(
        seen,
        [(WatchEventKind::Deleted, "k".to_string()), (WatchEventKind::Written, "k".into()), (WatchEventKind::Written, "w/deep/1".into())],
        "nothing from before the watch nor outside it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_end_when_the_key_comes_or_the_time_is_up() {
    let kube = granted();
    let s = kube.store("/t/").await;
    assert!(!s.wait("k", Duration::from_millis(300)).await.unwrap());
    let writer = kube.store("/t/").await;
    let (waited, ()) = tokio::join!(s.wait("k", Duration::from_secs(20)), async {
        writer.set("k", b"v").await.unwrap();
    });
    assert!(waited.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keys_end_with_their_handle() {
    let kube = granted();
    let observer = kube.store("/t/").await;
    let member = kube.store("/t/").await;
    member.set_session("alive/x", b"1").await.unwrap();
    let mut events = observer.watch(&[WatchTarget::Key("alive/x".into())]).await.unwrap();
    drop(member);
    let e = tokio::time::timeout(Duration::from_secs(10), events.recv()).await.unwrap().unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Deleted, "alive/x"));
}

/// A finished job deletes its objects, its session's too, but those under the prefix it keeps; another
/// job's stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_forgets_all_but_what_it_keeps() {
    let kube = granted();
    let (job, other) = (kube.store("/t/").await, kube.store("/u/").await);
    for key in ["round", "r/1/members", "culprits/h1/1-5-crash"] {
        job.set(key, b"1").await.unwrap();
    }
    job.set_session("alive/x", b"1").await.unwrap();
    other.set("round", b"2").await.unwrap();
    job.forget_job("culprits/").await.unwrap();
    assert_eq!(job.list("").await.unwrap(), ["culprits/h1/1-5-crash"]);
    assert_eq!(other.get("round").await.unwrap(), Some(b"2".to_vec()));
}

/// As a SIGKILLed agent: no deletion, no renewal. Another handle's sweep reaps the session after its TTL
/// (3 s), and its keys with it; the beat key that was its session object goes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_handle_is_reaped_after_its_ttl() {
    let kube = granted();
    let observer = kube.store("/t/").await;
    let mut opts = kube.options(User::Agent, "default", "/t/");
    opts.session_key = Some("hb/y".into());
    let member = KubeStore::connect(&opts, Duration::from_secs(20)).await.unwrap();
    member.set_session("alive/y", b"1").await.unwrap();
    member.beat("hb/y", b"beat", Duration::from_secs(2)).await.unwrap();
    assert_eq!(observer.get("hb/y").await.unwrap(), Some(b"beat".to_vec()), "the beat key reads as any key");
    let mut events = observer.watch(&[WatchTarget::Key("alive/y".into()), WatchTarget::Key("hb/y".into())]).await.unwrap();
    member.vanish();
    let mut gone = Vec::new();
    while gone.len() < 2 {
        let e = tokio::time::timeout(Duration::from_secs(30), events.recv()).await.unwrap().unwrap();
        assert_eq!(e.kind, WatchEventKind::Deleted, "{e:?}");
        gone.push(e.key);
    }
    gone.sort();
    assert_eq!(gone, ["alive/y", "hb/y"]);
}

/// In a pod a Job made, every object but the lemon memory is the Job's (the garbage collector deletes them
/// with it) and a session key its session's; a pod that cannot be read owns nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_job_owns_the_objects_but_the_lemon_memory() {
    let kube = granted();
    // Pods trainer-a and trainer-b of the Job `trainer`, as the integration tests use them.
    let pods = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/job-pods.yaml");
    tokio::task::block_in_place(|| kube.create(&pods));
    let owners_of = |s: &KubeStore, key: &'static str| {
        let (leases, name) = (s.server.leases.clone(), names::object_name(&s.job, key));
        async move {
            let lease = leases.get(&name).await.unwrap();
            lease.metadata.owner_references.unwrap_or_default().into_iter().map(|r| format!("{}/{}", r.kind, r.name)).collect::<Vec<_>>()
        }
    };
    let table = [("/t0/", Some("trainer-a"), vec!["Job/trainer".to_string()]), ("/t1/", Some("no-such-pod"), vec![]), ("/t2/", None, vec![])];
    for (job, pod, job_owned) in table {
        let mut opts = kube.options(User::Agent, "default", job);
        opts.pod = pod.map(str::to_string);
        let s = KubeStore::connect(&opts, Duration::from_secs(20)).await.unwrap();
        s.set("round", b"1").await.unwrap();
        // An update replaces the owners too: the second add and the compare-and-set keep them.
        assert_eq!(s.compare_set("round", b"1", b"2").await.unwrap(), b"2");
        s.add("r/0/slot", 1).await.unwrap();
        s.add("r/0/slot", 1).await.unwrap();
        s.set("culprits/h1/1-5-crash", b"1").await.unwrap();
        s.set_session("alive/x", b"1").await.unwrap();
        assert_eq!(owners_of(&s, "round").await, job_owned, "{pod:?}");
        assert_eq!(owners_of(&s, "r/0/slot").await, job_owned, "{pod:?}");
        assert_eq!(owners_of(&s, "culprits/h1/1-5-crash").await, Vec::<String>::new(), "{pod:?}: the lemon memory stays");
        let session = owners_of(&s, "alive/x").await;
        assert!(session.len() == 1 && session[0].starts_with("Lease/"), "{pod:?}: {session:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_role_is_refused_at_connect_naming_the_verb() {
    let kube = granted();
    for (user, namespace) in [(User::Nobody, "default"), (User::Agent, "elsewhere")] {
        let refused = KubeStore::connect(&kube.options(user, namespace, "/t/"), Duration::from_secs(20)).await.err();
        match refused {
            Some(e @ StoreError::KubeForbidden { .. }) => {
                let line = e.to_string();
                assert!(line.contains("leases.coordination.k8s.io") && line.contains(&format!("namespace {namespace}")), "{line}");
            }
            other => panic!("{user:?} in {namespace}: {:?}", other.map(|e| e.to_string())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_survive_an_api_server_restart() {
    let kube = granted();
    let observer = kube.store("/t/").await;
    let mut events = observer.watch(&[WatchTarget::Key("k".into())]).await.unwrap();
    tokio::task::block_in_place(|| kube.restart());
    let writer = kube.store("/t/").await;
    writer.set("k", b"1").await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), events.recv()).await.unwrap().unwrap();
    assert_eq!((e.kind, e.key.as_str()), (WatchEventKind::Written, "k"));
}
