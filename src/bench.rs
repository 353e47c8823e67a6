//! `muster bench`: measurements of muster's own machinery, run in-process.
//!
//! `muster bench rendezvous --nodes N` simulates N agents forming one round: it starts a real store server on
//! loopback and runs N copies of the agents' rendezvous logic ([`Rendezvous::register`] then
//! [`Rendezvous::next_round`]) as tokio tasks, each with its own [`RemoteStore`] connections, so what is
//! measured is the algorithm plus the real wire protocol and server, without N processes' start-up noise.
//! Every node connects and registers first, then all of them call `next_round` at once (a barrier): the join
//! phase is the worst case, N nodes contending at the same instant.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use tokio::sync::{mpsc, Barrier};
use tokio::task::JoinSet;

use crate::rendezvous::{Fingerprint, NodeInfo, RdzvError, Rendezvous, RoundInfo, Settings};
use crate::store::remote::RemoteStore;
use crate::store::tcp::{Server, ServerConfig};
use crate::store::{Store, StoreError, WatchEvent, WatchTarget};

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
    Server(StoreError),
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

/// Store operations, by kind, as counted by [`CountingStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Set,
    Get,
    Add,
    CompareSet,
    Wait,
    MultiGet,
    MultiSet,
    List,
    Delete,
    SetSession,
    Watch,
}

impl Op {
    const ALL: [Op; 11] = [
        Op::Set,
        Op::Get,
        Op::Add,
        Op::CompareSet,
        Op::Wait,
        Op::MultiGet,
        Op::MultiSet,
        Op::List,
        Op::Delete,
        Op::SetSession,
        Op::Watch,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::Set => "set",
            Op::Get => "get",
            Op::Add => "add",
            Op::CompareSet => "compare_set",
            Op::Wait => "wait",
            Op::MultiGet => "multi_get",
            Op::MultiSet => "multi_set",
            Op::List => "list",
            Op::Delete => "delete",
            Op::SetSession => "set_session",
            Op::Watch => "watch",
        }
    }
}

/// One node's operation counters, shared between its store adapter and the benchmark.
#[derive(Debug, Default)]
struct OpCounts {
    ops: [AtomicU64; Op::ALL.len()],
    /// Value bytes sent and received (keys and framing left out): operations are O(1) per node, but what
    /// they carry need not be.
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
}

impl OpCounts {
    fn bump(&self, op: Op) {
        self.ops[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn wrote(&self, n: usize) {
        self.bytes_written.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn read(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn get(&self, op: Op) -> u64 {
        self.ops[op as usize].load(Ordering::Relaxed)
    }

    fn total(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.get(op)).sum()
    }
}

/// A [`Store`] that delegates to `inner` and counts each call, so the report can show what one node costs
/// the store (the scaling claim is O(1) operations per node and round).
struct CountingStore<S> {
    inner: S,
    counts: Arc<OpCounts>,
}

impl<S: Store> Store for CountingStore<S> {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.counts.bump(Op::Set);
        self.counts.wrote(value.len());
        self.inner.set(key, value).await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.counts.bump(Op::Get);
        let value = self.inner.get(key).await?;
        self.counts.read(value.as_ref().map_or(0, Vec::len));
        Ok(value)
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.counts.bump(Op::Add);
        self.inner.add(key, delta).await
    }

    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.counts.bump(Op::CompareSet);
        self.counts.wrote(expected.len() + desired.len());
        let current = self.inner.compare_set(key, expected, desired).await?;
        self.counts.read(current.len());
        Ok(current)
    }

    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        self.counts.bump(Op::Wait);
        self.inner.wait(key, timeout).await
    }

    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        self.counts.bump(Op::MultiSet);
        self.inner.multi_set(pairs).await
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.counts.bump(Op::MultiGet);
        let values = self.inner.multi_get(keys).await?;
        self.counts.read(values.iter().map(Vec::len).sum());
        Ok(values)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.counts.bump(Op::List);
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.counts.bump(Op::Delete);
        self.inner.delete(key).await
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.counts.bump(Op::SetSession);
        self.counts.wrote(value.len());
        self.inner.set_session(key, value).await
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.counts.bump(Op::Watch);
        self.inner.watch(targets).await
    }
}

/// What one simulated node brings back. `_rendezvous` is kept so its connections (and session keys) stay up
/// until every node is done: a node leaving early would send every other node's watch an event.
struct NodeOutcome {
    node: u32,
    info: RoundInfo,
    registered: Instant,
    sealed: Instant,
    join_ops: u64,
    _rendezvous: Rendezvous<CountingStore<RemoteStore>>,
}

#[derive(Debug, Serialize)]
struct OpsSummary {
    mean: f64,
    max: u64,
}

/// The benchmark's result, printed as a summary line or as JSON.
#[derive(Debug, Serialize)]
struct Report {
    nodes: u32,
    min: u32,
    max: u32,
    nproc: u32,
    /// Start (before the first connection) until every node has its sealed round.
    total_ms: f64,
    /// Start until every node has connected and registered.
    register_ms: f64,
    /// From the barrier (every node registered) until every node has its sealed round.
    join_ms: f64,
    /// Per-node `next_round` latency, from the barrier.
    join_p50_ms: f64,
    join_p99_ms: f64,
    round: u64,
    world_size: u32,
    /// Every store operation of a node (connect, register and join).
    ops_per_node: OpsSummary,
    /// The operations of `next_round` alone.
    join_ops_per_node: OpsSummary,
    /// Value bytes a node read from the store (mean and max), and wrote.
    read_bytes_per_node: OpsSummary,
    written_bytes_per_node: OpsSummary,
    /// All nodes' operations by kind.
    ops_by_kind: BTreeMap<&'static str, u64>,
    /// Empty when the round is right: N distinct group ranks 0..N-1, the same members everywhere,
    /// world_size = N * nproc.
    problems: Vec<String>,
}

impl Report {
    fn summary(&self) -> String {
        let check = if self.problems.is_empty() {
            format!(
                "check ok (group ranks 0..{}, world_size {})",
                self.nodes.saturating_sub(1),
                self.world_size
            )
        } else {
            format!("CHECK FAILED: {}", self.problems.join("; "))
        };
        format!(
            "rendezvous {} nodes (min {}, max {}, nproc {}): all sealed in {:.1} ms (connect+register {:.1} ms, \
             join {:.1} ms, per node p50 {:.1} ms p99 {:.1} ms); store ops/node mean {:.1} max {} (join: mean {:.1} \
             max {}); read/node mean {:.1} KiB; {check}",
            self.nodes,
            self.min,
            self.max,
            self.nproc,
            self.total_ms,
            self.register_ms,
            self.join_ms,
            self.join_p50_ms,
            self.join_p99_ms,
            self.ops_per_node.mean,
            self.ops_per_node.max,
            self.join_ops_per_node.mean,
            self.join_ops_per_node.max,
            self.read_bytes_per_node.mean / 1024.0,
        )
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
    raise_fd_limit();

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
        node_rank: None,
        strict_rank: false,
    };
    let outcome = runtime.block_on(simulate(nodes, args.nproc, settings, timeout));
    // Simulated nodes may still be connected (a failed run): don't wait for them.
    runtime.shutdown_background();
    outcome
}

/// Raises the soft open-file limit to the hard one: each simulated node holds three or four connections and
/// the in-process server the other end of each, so 4096 nodes need over 25000 descriptors.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read the open-file limit: {e}"),
    }
}

async fn simulate(nodes: u32, nproc: u32, settings: Settings, timeout: Duration) -> Result<Report, BenchError> {
    let config = ServerConfig {
        // Three or four connections a node (requests, liveness, the round watch; a second request connection
        // while a heartbeat overlaps a wait), with room to spare; the default allows 16384.
        max_connections: ServerConfig::default().max_connections.max(8 * nodes as usize + 64),
        // Loopback connections don't vanish silently.
        keepalive: None,
        ..ServerConfig::default()
    };
    let server = Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .await
        .map_err(BenchError::Server)?;
    let addr = server.local_addr();
    let counts: Vec<Arc<OpCounts>> = (0..nodes).map(|_| Arc::default()).collect();
    let barrier = Arc::new(Barrier::new(nodes as usize));
    let fingerprint = Fingerprint {
        entrypoint: "bench".into(),
        args: Vec::new(),
        nproc_spec: nproc.to_string(),
        nnodes: format!("{nodes}:{nodes}"),
    };

    // How many nodes got through register(), for the diagnosis when the run times out.
    let registered_count = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for node in 0..nodes {
        let me = NodeInfo {
            id: format!("127.0.0.1_{}_{node}", std::process::id()),
            addr: "127.0.0.1".into(),
            nproc,
        };
        let node_counts = counts[node as usize].clone();
        let (settings, fingerprint, barrier) = (settings.clone(), fingerprint.clone(), barrier.clone());
        let registered_count = registered_count.clone();
        tasks.spawn(async move {
            // Connect and register; whatever happens, take part in the barrier so the others are not stuck.
            let joined = async {
                let store = RemoteStore::connect(addr, timeout, timeout)
                    .await
                    .map_err(|source| BenchError::Connect { node, source })?;
                let counting = CountingStore {
                    inner: store,
                    counts: node_counts.clone(),
                };
                let mut rendezvous = Rendezvous::new(counting, settings, me, fingerprint);
                rendezvous
                    .register()
                    .await
                    .map_err(|source| BenchError::Rendezvous { node, source })?;
                registered_count.fetch_add(1, Ordering::Relaxed);
                Ok::<_, BenchError>(rendezvous)
            }
            .await;
            let registered = Instant::now();
            barrier.wait().await;
            let mut rendezvous = joined?;
            let ops_before = node_counts.total();
            let info = rendezvous
                .next_round()
                .await
                .map_err(|source| BenchError::Rendezvous { node, source })?;
            Ok::<_, BenchError>(NodeOutcome {
                node,
                info,
                registered,
                sealed: Instant::now(),
                join_ops: node_counts.total() - ops_before,
                _rendezvous: rendezvous,
            })
        });
    }

    let mut outcomes = Vec::with_capacity(nodes as usize);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    while outcomes.len() < nodes as usize {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(Ok(Ok(outcome))) => outcomes.push(outcome),
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(e)) => return Err(BenchError::Panicked(e.to_string())),
                None => break,
            },
            () = &mut deadline => {
                return Err(BenchError::TimedOut {
                    timeout,
                    nodes,
                    registered: registered_count.load(Ordering::Relaxed),
                    sealed: outcomes.len(),
                })
            }
        }
    }
    let report = make_report(nodes, nproc, &settings, start, &outcomes, &counts);
    // Close every node's connections before the server goes, then stop it.
    drop(outcomes);
    server.shutdown().await;
    Ok(report)
}

fn make_report(
    nodes: u32,
    nproc: u32,
    settings: &Settings,
    start: Instant,
    outcomes: &[NodeOutcome],
    counts: &[Arc<OpCounts>],
) -> Report {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let last_registered = outcomes.iter().map(|o| o.registered).max().unwrap_or(start);
    let last_sealed = outcomes.iter().map(|o| o.sealed).max().unwrap_or(start);
    let mut latencies: Vec<f64> = outcomes
        .iter()
        .map(|o| ms(o.sealed.saturating_duration_since(last_registered)))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies.get(i).copied().unwrap_or(0.0)
    };
    let summarize = |values: &mut dyn Iterator<Item = u64>| {
        let (mut sum, mut max, mut n) = (0u64, 0u64, 0u64);
        for v in values {
            sum += v;
            max = max.max(v);
            n += 1;
        }
        OpsSummary {
            mean: if n == 0 { 0.0 } else { sum as f64 / n as f64 },
            max,
        }
    };
    let ops_by_kind = Op::ALL
        .iter()
        .map(|&op| (op.name(), counts.iter().map(|c| c.get(op)).sum()))
        .filter(|&(_, n)| n > 0)
        .collect();
    let round = outcomes.first().map_or(0, |o| o.info.round);
    Report {
        nodes,
        min: settings.min_nodes,
        max: settings.max_nodes,
        nproc,
        total_ms: ms(last_sealed - start),
        register_ms: ms(last_registered - start),
        join_ms: ms(last_sealed.saturating_duration_since(last_registered)),
        join_p50_ms: percentile(0.5),
        join_p99_ms: percentile(0.99),
        round,
        world_size: outcomes.first().map_or(0, |o| o.info.world_size),
        ops_per_node: summarize(&mut counts.iter().map(|c| c.total())),
        join_ops_per_node: summarize(&mut outcomes.iter().map(|o| o.join_ops)),
        read_bytes_per_node: summarize(&mut counts.iter().map(|c| c.bytes_read.load(Ordering::Relaxed))),
        written_bytes_per_node: summarize(&mut counts.iter().map(|c| c.bytes_written.load(Ordering::Relaxed))),
        ops_by_kind,
        problems: check_round(nodes, nproc, outcomes),
    }
}

/// What is wrong with the sealed round, if anything: every node in it once, ranks 0..N-1, one view of it.
fn check_round(nodes: u32, nproc: u32, outcomes: &[NodeOutcome]) -> Vec<String> {
    let mut problems = Vec::new();
    if outcomes.len() != nodes as usize {
        problems.push(format!("{} of {nodes} nodes have a round", outcomes.len()));
    }
    let Some(first) = outcomes.first() else { return problems };
    let ranks: HashSet<u32> = outcomes.iter().map(|o| o.info.group_rank).collect();
    if ranks.len() != outcomes.len() || ranks.iter().any(|&r| r >= nodes) {
        problems.push(format!(
            "group ranks are not 0..{} each once ({} distinct)",
            nodes.saturating_sub(1),
            ranks.len()
        ));
    }
    let expected_world = nodes * nproc;
    for o in outcomes {
        let info = &o.info;
        if info.world_size != expected_world || info.group_world_size != nodes {
            problems.push(format!(
                "node {} sees world_size {} and {} nodes (expected {expected_world} and {nodes})",
                o.node, info.world_size, info.group_world_size
            ));
        } else if info.round != first.info.round {
            problems.push(format!("node {} sees another round than node {}", o.node, first.node));
        } else if info.base_global_rank != info.group_rank * nproc {
            problems.push(format!(
                "node {} has base global rank {} for group rank {}",
                o.node, info.base_global_rank, info.group_rank
            ));
        }
        // One line per kind of problem is enough to debug; N identical lines are not.
        if problems.len() > 5 {
            problems.push("...".into());
            break;
        }
    }
    problems
}
