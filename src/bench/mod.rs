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
//! `--backend etcd` runs the same nodes against etcd v3 instead, each with its own [`EtcdStore`] (its own HTTP
//! connections, lease and watches, as an agent's), under a namespace of this run's own: an etcd named with
//! `--etcd-endpoint`, or a single member the bench starts on loopback and stops. `--backend k8s` runs them
//! against the Kubernetes API server a `--kubeconfig` reaches, each node with its own [`KubeStore`] (its
//! own client and session Lease), under a run id of this run's own. Where the server's metrics can be
//! read, the report adds its own counts: requests, writes and watch events per node.
//!
//! [`Rendezvous::register`]: crate::rendezvous::Rendezvous::register
//! [`Rendezvous::next_round`]: crate::rendezvous::Rendezvous::next_round
//! [`RemoteStore`]: crate::store::remote::RemoteStore
//! [`EtcdStore`]: crate::store::etcd::EtcdStore
//! [`KubeStore`]: crate::store::k8s::KubeStore

mod backend;
mod capacity;
mod counting;
pub(crate) mod etcd;
mod metrics;
mod report;
mod server;
mod sim;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::RdzvConf;
use crate::rendezvous::{RdzvError, Settings};
use crate::store::StoreError;
use backend::StorePlan;
pub use report::Report;
use sim::simulate;

/// Measure muster's machinery in-process.
#[derive(Debug, Parser)]
#[command(name = "muster bench")]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Time N simulated agents forming one rendezvous round over a real store server on loopback.
    Rendezvous(RendezvousArgs),
}

#[derive(Debug, Args)]
pub struct RendezvousArgs {
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
    /// After the round is sealed, keep every node watching it (heartbeats running, as a training agent's)
    /// for this many seconds and report the store's load per node per second (0: no steady window).
    #[arg(long, default_value_t = 0.0, value_name = "SECS")]
    steady: f64,
    /// Print the result as one JSON object instead of the summary line.
    #[arg(long)]
    pub json: bool,
    /// The rendezvous store: muster's own (a `muster store` child on loopback), etcd v3, or the Kubernetes
    /// API server (`k8s`).
    #[arg(long, value_enum, default_value_t = Backend::Tcp)]
    backend: Backend,
    /// With --backend etcd: the etcd members to use (host:port[,host:port...]); without it the bench starts a
    /// single-member etcd on loopback in a temporary directory, and stops it.
    #[arg(long, value_name = "HOST:PORT")]
    etcd_endpoint: Option<String>,
    /// With --backend etcd and no --etcd-endpoint: the etcd binary to start (default: `etcd` on PATH).
    #[arg(long, value_name = "PATH")]
    etcd_binary: Option<PathBuf>,
    /// With --backend k8s (needed): the kubeconfig of the API server and user (its current context). With
    /// `get` on the `/metrics` URL the report adds the server's own counts.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// With --backend k8s: the namespace of the run's Leases (default: the kubeconfig context's).
    #[arg(long, value_name = "NAME")]
    namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Tcp,
    Etcd,
    K8s,
}

/// Why a benchmark could not run or did not complete.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start the store server: {0}")]
    StoreProcess(String),
    #[error("etcd: {0}")]
    Etcd(StoreError),
    #[error("the Kubernetes API server: {0}")]
    Kube(StoreError),
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

pub fn bench_rendezvous(args: &RendezvousArgs) -> Result<Report, BenchError> {
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
    let steady = match args.steady {
        0.0 => Duration::ZERO,
        s => secs("steady", s)?,
    };
    let plan = store_plan(args, capacity::Host::this())?;

    let runtime = crate::runtime::build(crate::runtime::Threads::PerCore).map_err(BenchError::Runtime)?;
    let settings = Settings {
        // A run of its own: on a server the runs share (the API server), no run sees another's keys.
        run_id: run_id(),
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
        restart_budget: None,
            exclude_after: None,
    };
    let outcome = runtime.block_on(async {
        let (service, connect, store) = backend::start(&plan, &settings, timeout).await?;
        let connect = std::sync::Arc::new(connect);
        let plan = sim::Plan { nodes, nproc: args.nproc, timeout, steady };
        let outcome = simulate(plan, settings, &connect, store).await;
        service.stop().await;
        outcome
    });
    // Simulated nodes may still be connected (a failed run): don't wait for them.
    runtime.shutdown_background();
    outcome
}

/// `bench-PID-MILLIS`: the run's keys apart from any other run's.
fn run_id() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("bench-{}-{ms}", std::process::id())
}

/// The store the command line asks for, checked before anything starts: the etcd flags go with
/// `--backend etcd` only, the kubeconfig with `--backend k8s`, and the host must hold the nodes' connections.
fn store_plan(args: &RendezvousArgs, host: capacity::Host) -> Result<StorePlan, BenchError> {
    let (nodes, endpoint, binary) = (args.nodes, args.etcd_endpoint.as_deref(), args.etcd_binary.as_ref());
    let kube_flag = if args.kubeconfig.is_some() { Some("--kubeconfig") } else { args.namespace.as_ref().map(|_| "--namespace") };
    if let (Some(flag), false) = (kube_flag, args.backend == Backend::K8s) {
        return Err(BenchError::Usage(format!("{flag} needs --backend k8s")));
    }
    if args.backend == Backend::K8s {
        if endpoint.is_some() || binary.is_some() {
            return Err(BenchError::Usage("--etcd-endpoint and --etcd-binary need --backend etcd".into()));
        }
        let kubeconfig = args.kubeconfig.clone().ok_or_else(|| BenchError::Usage("--backend k8s needs --kubeconfig PATH".into()))?;
        capacity::kube_fits(nodes, host).map_err(BenchError::Usage)?;
        return Ok(StorePlan::Kube { kubeconfig, namespace: args.namespace.clone() });
    }
    if args.backend == Backend::Tcp {
        return match (endpoint, binary) {
            (None, None) => Ok(StorePlan::Tcp {
                max_connections: capacity::max_connections(nodes, host).map_err(BenchError::Usage)?,
            }),
            (Some(_), _) => Err(BenchError::Usage("--etcd-endpoint needs --backend etcd".into())),
            (None, Some(_)) => Err(BenchError::Usage("--etcd-binary needs --backend etcd".into())),
        };
    }
    let members = endpoint.map_or(1, |e| e.split(',').count());
    capacity::etcd_fits(nodes, members, host).map_err(BenchError::Usage)?;
    match (endpoint, binary) {
        (Some(_), Some(_)) => Err(BenchError::Usage(
            "--etcd-binary starts an etcd of the bench's own and --etcd-endpoint names one running: give one of them"
                .into(),
        )),
        (Some(endpoint), None) => {
            // The syntax of --rdzv-endpoint with --rdzv-backend etcd, so its messages name that flag.
            let usage = |e: crate::config::ConfigError| {
                BenchError::Usage(e.to_string().replace("'--rdzv-endpoint'", "'--etcd-endpoint'"))
            };
            let target = crate::config::etcd::target(endpoint, &RdzvConf::default()).map_err(usage)?;
            let credentials = crate::config::etcd::credentials(&|k| std::env::var(k).ok()).map_err(usage)?;
            Ok(StorePlan::EtcdAt { target, credentials })
        }
        (None, binary) => Ok(StorePlan::EtcdStart { binary: binary.cloned().unwrap_or_else(|| "etcd".into()) }),
    }
}

#[cfg(test)]
mod tests;
