//! The store server as a process of its own, for jobs that want the store off the training nodes (and
//! for tests that drive it from Python); `muster store`'s command line is `tools/store.rs`.

use std::net::SocketAddr;

use tokio::signal::unix::{signal, SignalKind};

use super::tcp::{Server, ServerConfig};
use super::StoreError;

/// Binds `host:port`, prints `muster store listening on <addr>` on stdout (the one line a
/// caller that passed port 0 reads to learn the port), and serves until SIGTERM or SIGINT.
pub async fn run_standalone(host: &str, port: u16, config: ServerConfig) -> Result<(), StoreError> {
    let addr = resolve(host, port).await?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|source| StoreError::Bind { addr, source })?;
    let server = Server::bind(addr, config).await?;
    crate::outln!("muster store listening on {}", server.local_addr());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    server.shutdown().await;
    Ok(())
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, StoreError> {
    let not_found = || std::io::Error::new(std::io::ErrorKind::NotFound, "no address found");
    tokio::net::lookup_host((host, port))
        .await
        .and_then(|mut addrs| addrs.next().ok_or_else(not_found))
        .map_err(|source| StoreError::Resolve {
            host: host.to_owned(),
            source,
        })
}
