//! The bench's store server: `muster store` as a child process, so the simulated agents' connections and
//! the server's ends of them count against two processes' open-file limits, not one (a node holds one
//! connection: 16384 nodes need over 16384 descriptors on each side).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::BenchError;

/// How long the child may take to say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) struct StoreProcess {
    child: Child,
}

impl StoreProcess {
    /// Starts `muster store` on a free loopback port serving `max_connections`; returns it and its address.
    pub(super) async fn start(max_connections: usize) -> Result<(StoreProcess, SocketAddr), BenchError> {
        let exe = std::env::current_exe().map_err(|e| BenchError::StoreProcess(format!("cannot find muster: {e}")))?;
        let mut child = Command::new(exe)
            .args(["store", "--host", "127.0.0.1", "--port", "0"])
            .arg(format!("--max-connections={max_connections}"))
            // The bench's own filter (RUST_LOG=muster::store=debug shows what the store closed and why).
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BenchError::StoreProcess(format!("cannot start `muster store`: {e}")))?;
        let stdout = child.stdout.take().ok_or_else(|| BenchError::StoreProcess("no stdout".into()))?;
        let mut line = String::new();
        let read = tokio::time::timeout(START_TIMEOUT, BufReader::new(stdout).read_line(&mut line)).await;
        let addr = match read {
            Ok(Ok(_)) => line.trim().strip_prefix("muster store listening on ").and_then(|a| a.parse().ok()),
            _ => None,
        };
        match addr {
            Some(addr) => Ok((StoreProcess { child }, addr)),
            None => Err(BenchError::StoreProcess(format!("`muster store` did not report its address: {line:?}"))),
        }
    }

    /// Stops the server (SIGKILL: nothing of it needs to outlive the run) and reaps it.
    pub(super) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
