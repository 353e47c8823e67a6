//! `muster bench`: measurements of muster's own machinery, run in-process.
//!
//! `muster bench rendezvous --nodes N` simulates N agents forming one round: it starts a real store server on
//! loopback and runs N copies of the agents' rendezvous logic ([`Rendezvous::register`] then
//! [`Rendezvous::next_round`]) as tokio tasks, each with its own [`RemoteStore`] (one connection, as an
//! agent's), so what is measured is the algorithm plus the real wire protocol and server, without N
//! processes' start-up noise. N is bounded by the host: one descriptor a node on each side ([`capacity`]).
//! Every node connects and registers first, then all of them call `next_round` at once (a barrier): the join
//! phase is the worst case, N nodes contending at the same instant.
//!
//! [`Rendezvous::register`]: crate::rendezvous::Rendezvous::register
//! [`Rendezvous::next_round`]: crate::rendezvous::Rendezvous::next_round
//! [`RemoteStore`]: crate::store::remote::RemoteStore

mod capacity;
mod counting;
mod report;
mod server;
mod sim;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::rendezvous::{RdzvError, Settings};
use crate::store::StoreError;
use report::Report;
use sim::simulate;

/// Measure muster's machinery in-process.
#[derive(Debug, Parser)]
#[command(name = "muster bench")]
struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Time N simulated agents forming one rendezvous round over a real store server on loopback.
    Rendezvous(RendezvousArgs),
}

#[derive(Debug, Args)]
struct RendezvousArgs {
    /// Number of simulated agents (nodes).
    #[arg(long)]
    nodes: u32,
    /// The round's minimum node count (default: --nodes).
    #[arg(long)]
    min: Option<u32>,
    /// The round's maximum node count (default: --nodes).
    #[arg(long)]
    max: Option<u32>,
    /// Workers per node (only sizes the world: nothing is spawned).
    #[arg(long, default_value_t = 1)]
    nproc: u32,
    /// The last-call window in seconds once --min nodes have joined (torchrun's default); it only matters
    /// when --nodes is below --max.
    #[arg(long, default_value_t = 30.0)]
    last_call_timeout: f64,
    /// Give up after this many seconds (connecting, joining and sealing together).
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Print the result as one JSON object instead of the summary line.
    #[arg(long)]
    json: bool,
}

/// Why a benchmark could not run or did not complete.
#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start the store server: {0}")]
    StoreProcess(String),
    #[error("node {node}: cannot connect to the store: {source}")]
    Connect { node: u32, source: StoreError },
    #[error("node {node}: {source}")]
    Rendezvous { node: u32, source: RdzvError },
    #[error("a simulated node panicked: {0}")]
    Panicked(String),
    #[error(
        "not every node had a sealed round within {timeout:?}: of {nodes} nodes, {registered} registered and \
         {sealed} had their round"
    )]
    TimedOut {
        timeout: Duration,
        nodes: u32,
        registered: usize,
        sealed: usize,
    },
}

/// Entry point of `muster bench ARGS...` (`args` after the subcommand); returns the exit code.
pub fn bench_main(args: &[String]) -> i32 {
    let args: BenchArgs = match crate::cli::parse_subcommand("bench", args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    // Errors only by default: one line per simulated node (a slow heartbeat under load, a spare waiting)
    // would drown the summary; RUST_LOG=warn shows them.
    crate::telemetry::init_with("error");
    match args.command {
        BenchCommand::Rendezvous(args) => match bench_rendezvous(&args) {
            Ok(report) => {
                if args.json {
                    match serde_json::to_string(&report) {
                        Ok(line) => println!("{line}"),
                        Err(e) => eprintln!("muster bench: cannot encode the report: {e}"),
                    }
                } else {
                    println!("{}", report.summary());
                }
                if report.problems.is_empty() {
                    0
                } else {
                    1
                }
            }
            Err(e @ BenchError::Usage(_)) => {
                eprintln!("muster bench: error: {e}");
                2
            }
            Err(e) => {
                eprintln!("muster bench rendezvous: {e}");
                1
            }
        },
    }
}

fn bench_rendezvous(args: &RendezvousArgs) -> Result<Report, BenchError> {
    let nodes = args.nodes;
    let min = args.min.unwrap_or(nodes);
    let max = args.max.unwrap_or(nodes);
    // Nodes beyond max would be spares waiting for a round that never opens; fewer than min never seal.
    if nodes == 0 || min == 0 || min > nodes || nodes > max {
        return Err(BenchError::Usage(format!(
            "need 1 <= --min <= --nodes <= --max (got min {min}, nodes {nodes}, max {max})"
        )));
    }
    if args.nproc == 0 {
        return Err(BenchError::Usage("--nproc must be at least 1".into()));
    }
    let secs = |name: &str, s: f64| {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| BenchError::Usage(format!("--{name} must be a positive number of seconds, got {s}")))
    };
    let timeout = secs("timeout", args.timeout)?;
    let last_call = secs("last-call-timeout", args.last_call_timeout)?;
    let max_connections = capacity::max_connections(nodes, capacity::Host::this()).map_err(BenchError::Usage)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let settings = Settings {
        run_id: "bench".into(),
        min_nodes: min,
        max_nodes: max,
        join_timeout: timeout,
        last_call_timeout: last_call,
        // torchrun's defaults: the heartbeats run during the join, as an agent's do.
        exit_barrier_timeout: Duration::from_secs(300),
        keep_alive_interval: Duration::from_secs(5),
        keep_alive_max_attempt: 3,
        heartbeat_timeout: Duration::from_secs(5),
        store_timeout: Duration::from_secs(60),
        node_rank: None,
        strict_rank: false,
    };
    let outcome = runtime.block_on(simulate(nodes, args.nproc, settings, timeout, max_connections));
    // Simulated nodes may still be connected (a failed run): don't wait for them.
    runtime.shutdown_background();
    outcome
}
