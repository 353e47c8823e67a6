//! The bench's own etcd for `--backend etcd` without `--etcd-endpoint`: a single member on loopback in a
//! temporary data directory, a child killed (and its directory removed) when the run ends.

#[cfg(test)]
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::metrics::{self, ServerCounts};
use super::BenchError;
use crate::store::etcd::local::one_member;

/// How long etcd may take to listen (it starts in about a second here).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A port found free may be taken before etcd binds it (etcd then exits): start again on others.
const START_TRIES: usize = 5;

pub(super) struct EtcdProcess {
    child: Child,
    _data: tempfile::TempDir,
}

fn free_port() -> Result<u16, BenchError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::StoreProcess(format!("cannot find a free loopback port for etcd: {e}")))
}

impl EtcdProcess {
    /// Starts `binary` as a one-member cluster; returns it and its client endpoint (`127.0.0.1:PORT`) once it
    /// accepts connections.
    pub(super) async fn start(binary: &Path) -> Result<(EtcdProcess, String), BenchError> {
        let failed = |why: String| BenchError::StoreProcess(format!("cannot start etcd ({}): {why}", binary.display()));
        let mut last = String::new();
        for _ in 0..START_TRIES {
            let data = tempfile::Builder::new()
                .prefix("muster-bench-etcd.")
                .tempdir()
                .map_err(|e| failed(format!("cannot make its data directory: {e}")))?;
            let (client, peer) = (free_port()?, free_port()?);
            let mut child = Command::from(one_member(binary, "bench", &data.path().join("data"), client, peer))
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| failed(format!("{e}; install etcd, or name it with --etcd-binary")))?;
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("it exited with {status}");
                    break;
                }
                if TcpStream::connect(("127.0.0.1", client)).await.is_ok() {
                    return Ok((EtcdProcess { child, _data: data }, format!("127.0.0.1:{client}")));
                }
                if Instant::now() >= deadline {
                    let _ = child.kill().await;
                    return Err(failed(format!("it did not listen on 127.0.0.1:{client} within {START_TIMEOUT:?}")));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err(failed(format!("{last} in each of {START_TRIES} tries")))
    }

    /// Stops etcd (SIGKILL: its data is thrown away) and reaps it; the data directory goes with `self`.
    pub(super) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// etcd's own count of the requests it has received, by method (`Range`, `Txn`, `Watch`, …), one per unary
/// call and one per message on a stream (a watcher created or cancelled, a progress request, a lease
/// keepalive). `None` when it cannot be read (https, or metrics not served).
#[cfg(test)]
pub(crate) async fn requests_handled(endpoint: &str) -> Option<BTreeMap<String, u64>> {
    Some(server_counts(endpoint).await?.requests_by_method)
}

/// etcd's counts for the bench's report ([`metrics::etcd`]); `None` as for [`requests_handled`]: the report
/// then leaves the figures out.
pub(super) async fn server_counts(endpoint: &str) -> Option<ServerCounts> {
    Some(metrics::etcd(&metrics_text(endpoint).await?))
}

/// etcd's count of the calls it has begun, by method: one per unary call and one per stream opened.
#[cfg(test)]
pub(crate) async fn calls_started(endpoint: &str) -> Option<BTreeMap<String, u64>> {
    Some(metrics::summed(&metrics_text(endpoint).await?, "grpc_server_started_total", "grpc_method", &[]))
}

async fn metrics_text(endpoint: &str) -> Option<String> {
    // reqwest builds a TLS set-up even for http, on the process's crypto provider (installed once: a later
    // call changes nothing).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().ok()?;
    let response = client.get(format!("http://{endpoint}/metrics")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()
}
