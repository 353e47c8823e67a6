//! A single-member etcd on loopback for tests: `MUSTER_ETCD` names the binary (scripts/test.sh runs the
//! suite against 3.5 that way), else `MUSTER_ETCD_34`, else `etcd` on PATH. A missing etcd fails the test,
//! never skips it.

use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{EtcdOptions, EtcdStore};

/// Counts itself in a gauge while it lives: how a test sees that a task reached a state (a wait
/// parked, a watch created) that the other side of etcd cannot observe.
pub(crate) struct Gauge(Arc<AtomicUsize>);

impl Gauge {
    pub(crate) fn enter(gauge: &Arc<AtomicUsize>) -> Gauge {
        gauge.fetch_add(1, Ordering::SeqCst);
        Gauge(gauge.clone())
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EtcdStore {
    /// This handle's waits now past their first read (the key was missing), waiting for its event.
    pub(crate) fn parked_waits(&self) -> usize {
        self.parked.load(Ordering::SeqCst)
    }

    /// This handle's watch streams that etcd confirmed created (its `created` response), still open.
    pub(crate) fn open_watches(&self) -> usize {
        self.cluster.watching.load(Ordering::SeqCst)
    }
}

/// Polls `done` until it holds; panics naming `what` after 10 s.
pub(crate) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub struct TestEtcd {
    child: Child,
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl TestEtcd {
    /// Started and listening. A port picked free can be taken (by any outgoing connection) before etcd
    /// binds it: then etcd exits, and it is started again on other ports.
    pub fn start() -> TestEtcd {
        let binary = std::env::var("MUSTER_ETCD").or_else(|_| std::env::var("MUSTER_ETCD_34")).unwrap_or_else(|_| "etcd".into());
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let (client, peer) = (free_port(), free_port());
            let mut child = super::local::one_member(binary.as_ref(), "t", &dir.path().join("data"), client, peer)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {binary} ({e}): run `source scripts/lib.sh; ensure_etcd` or set MUSTER_ETCD"));
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", client)).is_ok() {
                    return TestEtcd { child, endpoint: format!("127.0.0.1:{client}"), _dir: dir };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{binary} did not start on loopback in 5 tries");
    }

    pub fn options(&self, namespace: &str) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.endpoint.clone()],
            tls: None,
            credentials: None,
            namespace: namespace.to_string(),
            lease_ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
        }
    }

    /// A handle, once etcd answers.
    pub async fn store(&self, namespace: &str) -> EtcdStore {
        EtcdStore::connect(&self.options(namespace), Duration::from_secs(20)).await.expect("etcd answers")
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
