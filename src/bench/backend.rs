//! Which store the simulated agents rendezvous through: muster's (a `muster store` child, one TCP
//! connection a node) or etcd (one [`EtcdStore`] a node, as each agent has its own: its own HTTP connection
//! pool, lease and watch streams), either an etcd the user names or one the bench starts and stops.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::etcd::{requests_handled, EtcdProcess};
use super::server::StoreProcess;
use super::BenchError;
use crate::config::etcd::EtcdTarget;
use crate::rendezvous::Settings;
use crate::store::etcd::{Credentials, EtcdOptions, EtcdStore};
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
}

/// How a simulated node reaches the store.
pub(super) enum Connect {
    Tcp(SocketAddr),
    Etcd(EtcdOptions),
}

impl Connect {
    /// One node's own store handle.
    pub(super) async fn connect(&self, timeout: Duration) -> Result<RdzvStore, StoreError> {
        match self {
            Connect::Tcp(addr) => Ok(RdzvStore::Tcp(RemoteStore::connect(*addr, b"", timeout, timeout).await?)),
            Connect::Etcd(opts) => Ok(RdzvStore::Etcd(EtcdStore::connect(opts, timeout).await?)),
        }
    }

    /// The requests etcd's members have answered so far, by method (every client's, not only the bench's);
    /// `None` for muster's store, and when a member's metrics cannot be read.
    pub(super) async fn etcd_requests(&self) -> Option<BTreeMap<String, u64>> {
        let Connect::Etcd(opts) = self else { return None };
        if opts.tls.is_some() {
            return None;
        }
        let mut total = BTreeMap::new();
        for endpoint in &opts.endpoints {
            for (method, n) in requests_handled(endpoint).await? {
                *total.entry(method).or_insert(0) += n;
            }
        }
        Some(total)
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
        lease_ttl: (settings.keep_alive_interval * settings.keep_alive_max_attempt).max(Duration::from_secs(2)),
        request_timeout: settings.store_timeout,
    }
}
