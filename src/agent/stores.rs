//! Where the stores live: the rendezvous store (hosted by this agent when the endpoint names this machine,
//! reached over TCP in any case) and the workers' store (MASTER_ADDR:MASTER_PORT, served by group rank 0),
//! and the addresses each listens on: where the endpoint or MASTER_ADDR says, never every interface unless
//! the name is not this machine's (as torch always does) or `--rdzv-conf bind=` says so.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use super::AgentError;
use crate::config::{LaunchConfig, Rendezvous};
use crate::rendezvous::RdzvError;
use crate::store::etcd::EtcdStore;
use crate::store::k8s::KubeStore;
use crate::store::remote::RemoteStore;
use crate::store::RdzvStore;
use crate::store::tcp::{Server, ServerConfig};

/// The limits of the agent's stores: the default connection limit kept under the open-file limit, half of
/// it each, as the rendezvous and the workers' store share the agent's descriptors.
fn server_config(keepalive: Option<Duration>, token: Option<Vec<u8>>) -> ServerConfig {
    let default = ServerConfig::default();
    let limit = crate::limits::raise_open_files().soft;
    let max_connections = default.max_connections.min(crate::limits::connection_cap(limit) / 2).max(1);
    if max_connections < default.max_connections {
        tracing::debug!("each store serves at most {max_connections} connections under the open-file limit {limit}");
    }
    ServerConfig { keepalive, max_connections, token, ..default }
}

/// The rendezvous store: etcd, the Kubernetes API server (this agent's session the object of its heartbeat,
/// `node_id`'s), or muster's store hosted by this agent when it is the store's host and reached over TCP in
/// any case.
pub async fn open_rendezvous_store(cfg: &LaunchConfig, node_id: &str) -> Result<(Option<Server>, RdzvStore), AgentError> {
    match &cfg.rendezvous {
        Rendezvous::Etcd(options) => {
            let store = EtcdStore::connect(options, cfg.rdzv.join_timeout).await?;
            return Ok((None, RdzvStore::Etcd(store)));
        }
        Rendezvous::Kube(target) => {
            let options = crate::config::k8s::options(target, &cfg.run_id, node_id, cfg.max_nodes, &cfg.rdzv);
            let store = KubeStore::connect(&options, cfg.rdzv.join_timeout).await?;
            return Ok((None, RdzvStore::Kube(Box::new(store))));
        }
        _ => {}
    }
    let (hosted, store) = open_tcp_store(cfg).await?;
    Ok((hosted, RdzvStore::Tcp(store)))
}

async fn open_tcp_store(cfg: &LaunchConfig) -> Result<(Option<Server>, RemoteStore), AgentError> {
    let join_timeout = cfg.rdzv.join_timeout;
    let read_timeout = cfg.rdzv.read_timeout;
    let token = cfg.token.as_ref().map(|t| t.bytes().to_vec());
    let server_config = server_config(Some(cfg.rdzv.keep_alive_interval), token.clone());
    let (host, port, hosted) = match &cfg.rendezvous {
        Rendezvous::C10d { host, port, is_host } => {
            let hosting = match is_host {
                Some(h) => *h,
                None => is_this_machine(host, &cfg.local_addr).await,
            };
            let hosted = if hosting {
                let listen = listen_on(cfg, host, cfg.max_nodes == 1).await;
                match Server::bind_each(&listen, *port, server_config.clone()).await {
                    Ok(server) => Some(server),
                    // torch's heuristic: several agents on one machine, the first one hosts.
                    Err(e) if is_host.is_none() => {
                        tracing::debug!("not hosting the rendezvous store ({e}); connecting as a client");
                        None
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                None
            };
            (host.clone(), *port, hosted)
        }
        Rendezvous::Static { master_addr, master_port } => {
            let hosted = match cfg.node_rank {
                0 => {
                    let listen = listen_on(cfg, master_addr, cfg.max_nodes == 1).await;
                    Some(Server::bind_each(&listen, *master_port, server_config).await?)
                }
                _ => None,
            };
            (master_addr.clone(), *master_port, hosted)
        }
        Rendezvous::Etcd(_) | Rendezvous::Kube(_) => return Err(AgentError::Internal("etcd or the API server opened as a TCP store".into())),
    };
    let addr = match &hosted {
        Some(server) => reachable(server.local_addr()),
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| AgentError::Resolve(format!("{host}:{port}"), e))?
            .next()
            .ok_or_else(|| AgentError::Resolve(format!("{host}:{port}"), std::io::ErrorKind::NotFound.into()))?,
    };
    let store = RemoteStore::connect(addr, token.as_deref().unwrap_or_default(), join_timeout, read_timeout).await?;
    Ok((hosted, store))
}

/// Where this agent's own client reaches a store it listens on.
fn reachable(bound: SocketAddr) -> SocketAddr {
    match bound.ip().is_unspecified() {
        true => SocketAddr::from((Ipv4Addr::LOCALHOST, bound.port())),
        false => bound,
    }
}

/// torch's `_matches_machine_hostname`: the endpoint names this machine — a loopback address, this host's
/// name or `--local-addr`, or a name or address that resolves to an address this machine can bind.
async fn is_this_machine(host: &str, local_addr: &str) -> bool {
    if host == "localhost" || host == crate::host::hostname() || host == local_addr {
        return true;
    }
    let Ok(addrs) = tokio::net::lookup_host((host, 0)).await else { return false };
    addrs.into_iter().any(|a| a.ip().is_loopback() || std::net::TcpListener::bind((a.ip(), 0)).is_ok())
}

/// The addresses a store for `name` listens on (see [`listen_addrs`]), resolving `name` here under the
/// rendezvous read timeout.
async fn listen_on(cfg: &LaunchConfig, name: &str, one_node: bool) -> Vec<IpAddr> {
    let local = match cfg.rdzv.bind {
        Some(_) => Vec::new(),
        None => local_addresses(name, cfg.rdzv.read_timeout).await,
    };
    let loopback_name = name == "localhost" || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    let listen = listen_addrs(cfg.rdzv.bind, &local, one_node, loopback_name);
    if listen.iter().any(IpAddr::is_unspecified) && cfg.rdzv.bind.is_none() {
        tracing::info!(
            "store for {name} listens on every interface: {name} names no address of this machine that other \
             nodes can reach (set --rdzv-conf bind=ADDR to choose one)"
        );
    }
    listen
}

/// The addresses of this machine `name` resolves to (an address literal is itself): those this process can
/// bind, in resolver order, without repeats. Empty when it resolves to none of them (or not in time).
async fn local_addresses(name: &str, deadline: Duration) -> Vec<IpAddr> {
    let resolved = match tokio::time::timeout(deadline, tokio::net::lookup_host((name, 0))).await {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => {
            tracing::debug!("cannot resolve {name}: {e}");
            return Vec::new();
        }
        Err(_) => {
            tracing::debug!("resolving {name} took over {deadline:?}");
            return Vec::new();
        }
    };
    let mut local: Vec<IpAddr> = Vec::new();
    for ip in resolved.map(|a| a.ip()) {
        if !local.contains(&ip) && (ip.is_unspecified() || std::net::TcpListener::bind((ip, 0)).is_ok()) {
            local.push(ip);
        }
    }
    local
}

/// Where a store listens, given `bind=` (wins), the addresses of this machine its name resolves to
/// (`local`), whether only this node's processes use it (`one_node`: then its loopback addresses, when the
/// name has any) and whether the name is a loopback name (`localhost`, `127.0.0.1`, `::1`). A name that
/// resolves here to loopback only but is not a loopback name (a Debian `127.0.1.1` host entry) cannot be
/// where other nodes reach it, so a multi-node store listens everywhere, as torch's always does.
fn listen_addrs(bind: Option<IpAddr>, local: &[IpAddr], one_node: bool, loopback_name: bool) -> Vec<IpAddr> {
    let every = || vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)];
    if let Some(ip) = bind {
        return vec![ip];
    }
    if local.iter().any(IpAddr::is_unspecified) {
        return every();
    }
    let loopback: Vec<IpAddr> = local.iter().copied().filter(IpAddr::is_loopback).collect();
    match (one_node, loopback.len() == local.len()) {
        _ if local.is_empty() => every(),
        (true, _) if !loopback.is_empty() => loopback,
        (false, true) if !loopback_name => every(),
        _ => local.to_vec(),
    }
}

/// The store the workers use through MASTER_ADDR:MASTER_PORT, served by the group-rank-0 agent.
pub struct WorkerStore {
    /// c10d: bound on first use (and again when a round needs other addresses); static: the rendezvous
    /// store itself.
    pub server: Option<(Vec<IpAddr>, Server)>,
    pub shared_with_rendezvous: bool,
    /// MASTER_ADDR as exported to the workers.
    pub addr: String,
}

impl WorkerStore {
    /// The endpoint for this round of `nodes` nodes, emptied of what earlier attempts left (pytorch issue
    /// #135712). The c10d store listens on loopback when the group is this node alone, else where
    /// MASTER_ADDR says.
    pub async fn prepare(
        &mut self,
        cfg: &LaunchConfig,
        hosted: Option<&Server>,
        nodes: u32,
    ) -> Result<(String, u16), AgentError> {
        let server = match (self.shared_with_rendezvous, hosted) {
            (true, Some(server)) => server,
            (true, None) => return Err(RdzvError::State("static node rank 0 does not host the store".into()).into()),
            (false, _) => {
                let listen = listen_on(cfg, &self.addr, nodes == 1).await;
                if self.server.as_ref().is_none_or(|(bound, _)| *bound != listen) {
                    // The old one (if any) closes; its port was only ever published for its own round.
                    self.server = None;
                    let config = server_config(ServerConfig::default().keepalive, None);
                    let server = Server::bind_each(&listen, 0, config).await?;
                    self.server = Some((listen, server));
                }
                let (_, server) = self.server.as_ref().ok_or_else(|| RdzvError::State("worker store missing".into()))?;
                server
            }
        };
        if self.shared_with_rendezvous {
            server.clear_except("muster/").await;
        } else {
            server.clear().await;
        }
        Ok((self.addr.clone(), server.port()))
    }
}

/// A multi-node job whose workers' store address (`--local-addr`, or `MASTER_ADDR` with static) resolves
/// to loopback cannot be reached from the other nodes: said once at start (bounded: a slow resolver must
/// not hold the start).
pub(super) async fn warn_if_loopback(cfg: &LaunchConfig) {
    let (flag, host) = match &cfg.rendezvous {
        Rendezvous::Static { master_addr, .. } => ("MASTER_ADDR", master_addr.as_str()),
        Rendezvous::C10d { .. } | Rendezvous::Etcd(_) | Rendezvous::Kube(_) => ("--local-addr (default: this host's FQDN)", cfg.local_addr.as_str()),
    };
    let lookup = tokio::net::lookup_host((host, 0));
    let Ok(Ok(mut addrs)) = tokio::time::timeout(Duration::from_secs(2), lookup).await else { return };
    if let Some(ip) = addrs.find(|a| a.ip().is_loopback()).map(|a| a.ip()) {
        tracing::warn!(
            "{flag} '{host}' resolves to loopback ({ip}) in a job of up to {} nodes: the other nodes cannot reach \
             this node's workers there; pass --local-addr with an address the others can reach",
            cfg.max_nodes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn endpoint_hosts_of_this_machine() {
        assert!(is_this_machine("127.0.0.1", "node9").await);
        assert!(is_this_machine("localhost", "node9").await);
        assert!(is_this_machine("node9", "node9").await);
        assert!(is_this_machine(&crate::host::hostname(), "node9").await);
        // TEST-NET-1 (RFC 5737): never an address of this machine.
        assert!(!is_this_machine("192.0.2.1", "node9").await);
    }

    #[test]
    fn stores_listen_where_the_name_points() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let ips = |list: &[&str]| list.iter().map(|s| ip(s)).collect::<Vec<_>>();
        /// (bind, local addresses of the name, one node, loopback name) -> listen
        type Case = (Option<&'static str>, &'static [&'static str], bool, bool, &'static [&'static str]);
        let cases: &[Case] = &[
            (Some("10.0.0.5"), &["127.0.0.1"], true, true, &["10.0.0.5"]),
            (Some("::"), &[], false, false, &["::"]),
            (None, &[], true, false, &["::"]),
            (None, &["0.0.0.0"], false, false, &["::"]),
            (None, &["127.0.0.1", "::1"], true, true, &["127.0.0.1", "::1"]),
            (None, &["127.0.0.1", "::1"], false, true, &["127.0.0.1", "::1"]),
            (None, &["10.0.0.5"], false, false, &["10.0.0.5"]),
            (None, &["10.0.0.5", "127.0.1.1"], false, false, &["10.0.0.5", "127.0.1.1"]),
            (None, &["10.0.0.5", "127.0.1.1"], true, false, &["127.0.1.1"]),
            // One node, but MASTER_ADDR names no loopback address: where the workers will connect.
            (None, &["10.0.0.5"], true, false, &["10.0.0.5"]),
            // A host name that resolves to loopback here only: other nodes cannot reach that.
            (None, &["127.0.1.1"], false, false, &["::"]),
            (None, &["127.0.1.1"], true, false, &["127.0.1.1"]),
        ];
        for (bind, local, one_node, loopback_name, want) in cases {
            let got = listen_addrs(bind.map(ip), &ips(local), *one_node, *loopback_name);
            assert_eq!(got, ips(want), "{bind:?} {local:?} {one_node} {loopback_name}");
        }
    }

    #[tokio::test]
    async fn names_resolve_to_the_addresses_of_this_machine() {
        let deadline = Duration::from_secs(5);
        assert_eq!(local_addresses("127.0.0.1", deadline).await, [IpAddr::from(Ipv4Addr::LOCALHOST)]);
        assert!(local_addresses("192.0.2.1", deadline).await.is_empty());
        let localhost = local_addresses("localhost", deadline).await;
        assert!(!localhost.is_empty() && localhost.iter().all(IpAddr::is_loopback), "{localhost:?}");
    }
}

