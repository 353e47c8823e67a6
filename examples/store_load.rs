//! Store load generator for `scripts/bench/store.sh`, so muster's store and torch's get the
//! very same client load: CONNECTIONS clients each loop `set`, `get`, `add` (one shared
//! counter) and `wait` for SECONDS. Prints one line: operations per second over all of them,
//! the seconds it took to connect them all (not part of the measured period), and the total
//! number of operations.
//!
//! Usage: store_load ADDR CONNECTIONS SECONDS

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use muster::store::tcp::Client;
use tokio::task::JoinSet;

const CONNECT_WAVE: usize = 32;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, connections, seconds] = args.as_slice() else {
        anyhow::bail!("usage: store_load ADDR CONNECTIONS SECONDS");
    };
    let addr: SocketAddr = addr.parse().context("ADDR")?;
    let connections: usize = connections.parse().context("CONNECTIONS")?;
    let duration = Duration::from_secs(seconds.parse().context("SECONDS")?);

    // Connect in waves: torch's libuv server stalls for seconds on bursts of connects.
    let connecting_since = Instant::now();
    let mut clients = Vec::with_capacity(connections);
    while clients.len() < connections {
        let mut connecting = JoinSet::new();
        for _ in 0..CONNECT_WAVE.min(connections - clients.len()) {
            connecting.spawn(Client::connect(addr, Duration::from_secs(600)));
        }
        while let Some(client) = connecting.join_next().await {
            clients.push(client??);
        }
    }

    let connect_secs = connecting_since.elapsed().as_secs_f64();
    let start = Instant::now();
    let deadline = start + duration;
    let mut running = JoinSet::new();
    for (i, mut client) in clients.into_iter().enumerate() {
        running.spawn(async move {
            let key = format!("load/{i}");
            let mut ops = 0u64;
            while Instant::now() < deadline {
                client.set(&key, b"value").await?;
                client.get(&key).await?;
                client.add("load/counter", 1).await?;
                client.wait(&[&key], Duration::from_secs(60)).await?;
                ops += 4;
            }
            anyhow::Ok(ops)
        });
    }
    let mut total = 0;
    while let Some(ops) = running.join_next().await {
        total += ops??;
    }
    let ops_per_sec = total as f64 / start.elapsed().as_secs_f64();
    println!("{ops_per_sec:.0} {connect_secs:.2} {total}");
    Ok(())
}
