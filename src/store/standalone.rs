//! `muster store`: the store server as a process of its own, for jobs that want the store off
//! the training nodes (and for tests that drive it from Python).

use std::net::SocketAddr;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

use super::tcp::{Server, ServerConfig};
use super::StoreError;

/// Serve a TCPStore-compatible key-value store until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "muster store")]
struct StoreArgs {
    /// Address to listen on; the default (`::`) is dual-stack, as torch's server.
    #[arg(long, default_value = "::")]
    host: String,
    /// Port to listen on; 0 picks a free one (printed on stdout).
    #[arg(long, default_value_t = 29400)]
    port: u16,
    /// Largest request or reply in bytes.
    #[arg(long, default_value_t = ServerConfig::default().max_frame_bytes)]
    max_frame_bytes: usize,
    /// Connections served at once.
    #[arg(long, default_value_t = ServerConfig::default().max_connections)]
    max_connections: usize,
}

/// Entry point of `muster store ARGS...` (`args` after the subcommand); returns the exit code.
pub fn store_main(args: &[String]) -> i32 {
    let args: StoreArgs = match crate::cli::parse_subcommand("store", args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    crate::telemetry::init_with("info");
    let config = ServerConfig {
        max_frame_bytes: args.max_frame_bytes,
        max_connections: args.max_connections,
        ..ServerConfig::default()
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("muster store: cannot start the async runtime: {err}");
            return 1;
        }
    };
    match runtime.block_on(run_standalone(&args.host, args.port, config)) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("muster store: {err}");
            1
        }
    }
}

/// Binds `host:port`, prints `muster store listening on <addr>` on stdout (the one line a
/// caller that passed port 0 reads to learn the port), and serves until SIGTERM or SIGINT.
pub async fn run_standalone(host: &str, port: u16, config: ServerConfig) -> Result<(), StoreError> {
    let addr = resolve(host, port).await?;
    let mut terminate =
        signal(SignalKind::terminate()).map_err(|source| StoreError::Bind { addr, source })?;
    let server = Server::bind(addr, config).await?;
    println!("muster store listening on {}", server.local_addr());
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
