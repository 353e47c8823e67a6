//! Which store the simulated agents rendezvous through: muster's (a `muster store` child, one TCP
//! connection a node), etcd (one [`EtcdStore`] a node, as each agent has its own: its own HTTP connection
//! pool, lease and watch streams), either an etcd the user names or one the bench starts and stops, or a
//! Kubernetes API server the user names by a kubeconfig (one [`KubeStore`] a node: its own client and
//! session Lease).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::etcd::EtcdProcess;
use super::metrics::ServerCounts;
use super::server::StoreProcess;
use super::BenchError;
use crate::config::etcd::EtcdTarget;
use crate::rendezvous::Settings;
use crate::store::etcd::{Credentials, EtcdOptions, EtcdStore};
use crate::store::k8s::{KubeOptions, KubeStore};
use crate::store::remote::RemoteStore;
use crate::store::{RdzvStore, StoreError};

/// The store, as the command line asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StorePlan {
    /// A `muster store` child serving this many connections.
    Tcp { max_connections: usize },
    /// An etcd already running.
    EtcdAt { target: EtcdTarget, credentials: Option<Credentials> },
    /// A single-member etcd started from this binary.
    EtcdStart { binary: PathBuf },
    /// A Kubernetes API server, as this kubeconfig reaches it, in its context's namespace or this one.
    Kube { kubeconfig: PathBuf, namespace: Option<String> },
}

/// How a simulated node reaches the store.
pub(super) enum Connect {
    Tcp(SocketAddr),
    Etcd(EtcdOptions),
    /// Every node's options but its session (its heartbeat key), and a handle of the bench's own that
    /// reads the API server's metrics.
    Kube { opts: KubeOptions, probe: Box<KubeStore> },
}

impl Connect {
    /// Node `node_id`'s own store handle.
    pub(super) async fn connect(&self, node_id: &str, timeout: Duration) -> Result<RdzvStore, StoreError> {
        match self {
            Connect::Tcp(addr) => Ok(RdzvStore::Tcp(RemoteStore::connect(*addr, b"", timeout, timeout).await?)),
            Connect::Etcd(opts) => Ok(RdzvStore::Etcd(EtcdStore::connect(opts, timeout).await?)),
            Connect::Kube { opts, .. } => {
                // As an agent's: its session is its heartbeat's object.
                let opts = KubeOptions { session_key: Some(format!("{}hb/{node_id}", opts.job)), holder: node_id.into(), ..opts.clone() };
                Ok(RdzvStore::Kube(Box::new(KubeStore::connect(&opts, timeout).await?)))
            }
        }
    }

    /// What the server has counted so far (every client's, not only the bench's); `None` for muster's
    /// store, and when the metrics cannot be read (etcd over https, an API server user without
    /// `get /metrics`).
    pub(super) async fn server_counts(&self) -> Option<ServerCounts> {
        match self {
            Connect::Tcp(_) => None,
            Connect::Etcd(opts) => {
                if opts.tls.is_some() {
                    return None;
                }
                let mut total = ServerCounts::default();
                for endpoint in &opts.endpoints {
                    total.add(&super::etcd::server_counts(endpoint).await?);
                }
                Some(total)
            }
            Connect::Kube { probe, .. } => Some(super::metrics::api_server_leases(&probe.metrics().await.ok()?)),
        }
    }
}

/// What serves the store for the run, stopped when it ends.
pub(super) enum Service {
    Muster(StoreProcess),
    Etcd(EtcdProcess),
    /// The user's etcd: left running.
    External,
}

impl Service {
    pub(super) async fn stop(self) {
        match self {
            Service::Muster(p) => p.stop().await,
            Service::Etcd(p) => p.stop().await,
            Service::External => {}
        }
    }
}

/// The store ready for the nodes: what serves it, how a node connects, and how the report names it
/// (`muster store`, `etcd 3.4.23 at 127.0.0.1:2379`).
pub(super) async fn start(
    plan: &StorePlan,
    settings: &Settings,
    timeout: Duration,
) -> Result<(Service, Connect, String), BenchError> {
    let (service, endpoints, tls, credentials) = match plan {
        StorePlan::Tcp { max_connections } => {
            let (server, addr) = StoreProcess::start(*max_connections).await?;
            return Ok((Service::Muster(server), Connect::Tcp(addr), "muster store".into()));
        }
        StorePlan::EtcdAt { target, credentials } => {
            (Service::External, target.endpoints.clone(), target.tls.clone(), credentials.clone())
        }
        StorePlan::EtcdStart { binary } => {
            let (process, endpoint) = EtcdProcess::start(binary).await?;
            (Service::Etcd(process), vec![endpoint], None, None)
        }
        StorePlan::Kube { kubeconfig, namespace } => return kube(kubeconfig, namespace, settings, timeout).await,
    };
    let namespace = match plan {
        StorePlan::EtcdAt { target, .. } => target.namespace.clone(),
        _ => "/".into(),
    };
    let opts = etcd_options(endpoints, tls, credentials, &namespace, settings);
    // One handle first, for the version (and to fail with one line when etcd is not there).
    let probe = match EtcdStore::connect(&opts, timeout).await {
        Ok(probe) => probe,
        Err(source) => {
            service.stop().await;
            return Err(BenchError::Etcd(source));
        }
    };
    let name = format!("etcd {} at {}", probe.version(), opts.endpoints.join(","));
    Ok((service, Connect::Etcd(opts), name))
}

/// The API server's nodes: an agent's settings, a job of this run's own (runs never see each other's
/// objects), and the bench's probe, which names the server.
async fn kube(
    kubeconfig: &std::path::Path,
    namespace: &Option<String>,
    settings: &Settings,
    timeout: Duration,
) -> Result<(Service, Connect, String), BenchError> {
    let opts = KubeOptions {
        credentials: crate::store::k8s::Credentials::Kubeconfig(kubeconfig.to_path_buf()),
        namespace: namespace.clone(),
        job: format!("{}{}/", crate::rendezvous::KEY_PREFIX, settings.run_id),
        session_key: None,
        holder: "bench".into(),
        lease_ttl: crate::config::session_ttl(settings.keep_alive_interval, settings.keep_alive_max_attempt),
        request_timeout: settings.store_timeout,
        peers: settings.max_nodes,
        pod: None,
        unowned: String::new(),
    };
    let probe = KubeStore::connect(&opts, timeout).await.map_err(BenchError::Kube)?;
    let name = format!("Kubernetes API server at {}", probe.describe());
    Ok((Service::External, Connect::Kube { opts, probe: Box::new(probe) }, name))
}

/// An agent's etcd settings (as `agent::stores` derives them from the rendezvous keys), under a namespace of
/// its own for this run so runs never see each other's keys.
fn etcd_options(
    endpoints: Vec<String>,
    tls: Option<crate::store::etcd::TlsFiles>,
    credentials: Option<Credentials>,
    namespace: &str,
    settings: &Settings,
) -> EtcdOptions {
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    EtcdOptions {
        endpoints,
        tls,
        credentials,
        namespace: format!("{namespace}muster-bench/{}-{stamp}/", std::process::id()),
        lease_ttl: crate::config::session_ttl(settings.keep_alive_interval, settings.keep_alive_max_attempt),
        request_timeout: settings.store_timeout,
    }
}
