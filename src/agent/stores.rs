//! Where the stores live: the rendezvous store (hosted by this agent when the endpoint names this machine,
//! reached over TCP in any case) and the workers' store (MASTER_ADDR:MASTER_PORT, served by group rank 0).

use std::net::SocketAddr;

use super::AgentError;
use crate::config::{LaunchConfig, Rendezvous};
use crate::rendezvous::RdzvError;
use crate::store::remote::RemoteStore;
use crate::store::tcp::{Server, ServerConfig};

/// The rendezvous store: hosted by this agent when it is the store's host, reached over TCP in any case.
pub async fn open_rendezvous_store(cfg: &LaunchConfig) -> Result<(Option<Server>, RemoteStore), AgentError> {
    let join_timeout = cfg.rdzv.join_timeout;
    let read_timeout = cfg.rdzv.read_timeout;
    let token = cfg.token.as_ref().map(|t| t.bytes().to_vec());
    let server_config = ServerConfig {
        keepalive: Some(cfg.rdzv.keep_alive_interval),
        token: token.clone(),
        ..ServerConfig::default()
    };
    let any = |port: u16| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let (host, port, hosted) = match &cfg.rendezvous {
        Rendezvous::C10d { host, port, is_host } => {
            let hosting = match is_host {
                Some(h) => *h,
                None => is_this_machine(host, &cfg.local_addr).await,
            };
            let hosted = if hosting {
                match Server::bind(any(*port), server_config.clone()).await {
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
                0 => Some(Server::bind(any(*master_port), server_config).await?),
                _ => None,
            };
            (master_addr.clone(), *master_port, hosted)
        }
    };
    let addr = match &hosted {
        Some(server) => SocketAddr::from(([127, 0, 0, 1], server.port())),
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| AgentError::Resolve(format!("{host}:{port}"), e))?
            .next()
            .ok_or_else(|| AgentError::Resolve(format!("{host}:{port}"), std::io::ErrorKind::NotFound.into()))?,
    };
    let store = RemoteStore::connect(addr, token.as_deref().unwrap_or_default(), join_timeout, read_timeout).await?;
    Ok((hosted, store))
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

/// The store the workers use through MASTER_ADDR:MASTER_PORT, served by the group-rank-0 agent.
pub struct WorkerStore {
    /// c10d: bound on first use; static: the rendezvous store itself.
    pub server: Option<Server>,
    pub shared_with_rendezvous: bool,
    pub addr: String,
}

impl WorkerStore {
    /// The endpoint for this round, emptied of what earlier attempts left (pytorch issue #135712).
    pub async fn prepare(&mut self, hosted: Option<&Server>) -> Result<(String, u16), AgentError> {
        let server = match (self.shared_with_rendezvous, hosted) {
            (true, Some(server)) => server,
            (true, None) => return Err(RdzvError::State("static node rank 0 does not host the store".into()).into()),
            (false, _) => {
                if self.server.is_none() {
                    let any = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
                    self.server = Some(Server::bind(any, ServerConfig::default()).await?);
                }
                self.server.as_ref().ok_or_else(|| RdzvError::State("worker store missing".into()))?
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

#[cfg(test)]
mod tests {
    use super::is_this_machine;

    #[tokio::test]
    async fn endpoint_hosts_of_this_machine() {
        assert!(is_this_machine("127.0.0.1", "node9").await);
        assert!(is_this_machine("localhost", "node9").await);
        assert!(is_this_machine("node9", "node9").await);
        assert!(is_this_machine(&crate::host::hostname(), "node9").await);
        // TEST-NET-1 (RFC 5737): never an address of this machine.
        assert!(!is_this_machine("192.0.2.1", "node9").await);
    }
}
