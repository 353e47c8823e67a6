//! The benchmark's report: timings, store operations per node, and the check of the sealed round.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::backend::Connect;
use super::counting::{Op, OpCounts};
use super::metrics::ServerCounts;
use crate::rendezvous::{RoundInfo, Settings};

/// The bench's phases, counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Connect and register, every node at once.
    Register,
    /// `next_round`, from the moment every node is released together until the last has its round.
    Join,
    /// The steady window: every member watching its sealed round, heartbeats running, as while training.
    Steady,
}

impl Phase {
    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Register => "register",
            Phase::Join => "join",
            Phase::Steady => "steady",
        }
    }
}

/// Every node's store operations by kind and (etcd, the API server) the server's own counts, at one moment
/// or between two.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct PhaseCounts {
    ops_by_kind: BTreeMap<&'static str, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<ServerCounts>,
}

impl PhaseCounts {
    pub(super) async fn read(connect: &Connect, counts: &[Arc<OpCounts>]) -> PhaseCounts {
        let ops_by_kind = Op::ALL.iter().map(|&op| (op.name(), counts.iter().map(|c| c.get(op)).sum())).collect();
        PhaseCounts { ops_by_kind, server: connect.server_counts().await }
    }

    /// What happened between `earlier` and this reading (kinds that did not occur left out).
    pub(super) fn since(&self, earlier: &PhaseCounts) -> PhaseCounts {
        let ops_by_kind = self
            .ops_by_kind
            .iter()
            .map(|(&k, &n)| (k, n.saturating_sub(earlier.ops_by_kind.get(k).copied().unwrap_or(0))))
            .filter(|&(_, n)| n > 0)
            .collect();
        let server = match (&self.server, &earlier.server) {
            (Some(now), Some(then)) => Some(now.since(then)),
            _ => None,
        };
        PhaseCounts { ops_by_kind, server }
    }

    fn ops(&self) -> u64 {
        self.ops_by_kind.values().sum()
    }
}

/// The server's counts shared among `nodes` (over `secs` seconds: per second).
#[derive(Debug, Serialize)]
struct ServerShare {
    requests: f64,
    writes: f64,
    watch_events: f64,
}

impl ServerShare {
    fn of(counts: &ServerCounts, nodes: f64, secs: f64) -> ServerShare {
        let share = |n: u64| n as f64 / nodes / secs;
        ServerShare { requests: share(counts.requests()), writes: share(counts.writes()), watch_events: share(counts.watch_events) }
    }
}

/// What one phase cost: its counts, and per node (per second for the steady window).
#[derive(Debug, Serialize)]
struct PhaseReport {
    #[serde(flatten)]
    counts: PhaseCounts,
    ops_per_node: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_per_node: Option<ServerShare>,
}

/// The steady window: what a training node costs the store each second.
#[derive(Debug, Serialize)]
struct SteadyReport {
    seconds: f64,
    store_ops_per_node_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_per_node_per_s: Option<ServerShare>,
}

#[derive(Debug, Serialize)]
struct OpsSummary {
    mean: f64,
    max: u64,
}

/// The benchmark's result, printed as a summary line or as JSON.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The store the nodes used: `muster store`, `etcd VERSION at ENDPOINTS`, or `Kubernetes API server at
    /// URL (namespace NS)`.
    store: String,
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
    /// Every store operation of a node until it had its round (connect, register and join).
    ops_per_node: OpsSummary,
    /// The operations of `next_round` alone.
    join_ops_per_node: OpsSummary,
    /// Value bytes a node read from the store (mean and max), and wrote.
    read_bytes_per_node: OpsSummary,
    written_bytes_per_node: OpsSummary,
    /// All nodes' operations by kind until they had their round.
    ops_by_kind: BTreeMap<&'static str, u64>,
    /// etcd and the API server: what the server counted itself while the round formed (register and join:
    /// requests, writes and watch events from its metrics), a node's share and the whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_per_node: Option<ServerShare>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<ServerCounts>,
    /// Each phase's store operations by kind and the server's counts.
    phases: BTreeMap<&'static str, PhaseReport>,
    /// With `--steady`: the steady window's load.
    #[serde(skip_serializing_if = "Option::is_none")]
    steady: Option<SteadyReport>,
    /// Empty when the round is right: N distinct group ranks 0..N-1, the same members everywhere,
    /// world_size = N * nproc.
    pub problems: Vec<String>,
}

impl Report {
    pub fn summary(&self) -> String {
        let check = if self.problems.is_empty() {
            format!(
                "check ok (group ranks 0..{}, world_size {})",
                self.nodes.saturating_sub(1),
                self.world_size
            )
        } else {
            format!("CHECK FAILED: {}", self.problems.join("; "))
        };
        let server = self.server_per_node.as_ref().map_or(String::new(), |s| {
            format!("server requests/node {:.1} (writes {:.1}), watch events/node {:.1}; ", s.requests, s.writes, s.watch_events)
        });
        format!(
            "rendezvous {} nodes (min {}, max {}, nproc {}) on {}: all sealed in {:.1} ms (connect+register {:.1} ms, \
             join {:.1} ms, per node p50 {:.1} ms p99 {:.1} ms); store ops/node mean {:.1} max {} (join: mean {:.1} \
             max {}); read/node mean {:.1} KiB; {server}{check}",
            self.nodes,
            self.min,
            self.max,
            self.nproc,
            self.store,
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

    /// Adds each phase's counts; the round's server counts are those of registering and joining.
    pub(super) fn with_phases(mut self, phases: Vec<(Phase, PhaseCounts)>, steady: Duration) -> Report {
        let nodes = f64::from(self.nodes.max(1));
        let mut round: Option<ServerCounts> = None;
        self.ops_by_kind.clear();
        for (phase, counts) in phases {
            if phase != Phase::Steady {
                counts.ops_by_kind.iter().for_each(|(&k, n)| *self.ops_by_kind.entry(k).or_insert(0) += n);
                if let Some(server) = &counts.server {
                    round.get_or_insert_with(ServerCounts::default).add(server);
                }
            } else {
                let secs = steady.as_secs_f64().max(f64::MIN_POSITIVE);
                self.steady = Some(SteadyReport {
                    seconds: steady.as_secs_f64(),
                    store_ops_per_node_per_s: counts.ops() as f64 / nodes / secs,
                    server_per_node_per_s: counts.server.as_ref().map(|s| ServerShare::of(s, nodes, secs)),
                });
            }
            let report = PhaseReport {
                ops_per_node: counts.ops() as f64 / nodes,
                server_per_node: counts.server.as_ref().map(|s| ServerShare::of(s, nodes, 1.0)),
                counts,
            };
            self.phases.insert(phase.name(), report);
        }
        self.server_per_node = round.as_ref().map(|s| ServerShare::of(s, nodes, 1.0));
        self.server = round;
        self
    }
}

/// What one simulated node brings back; `K` is what it keeps alive until every node is done.
pub(super) struct NodeOutcome<K> {
    pub(super) node: u32,
    pub(super) info: RoundInfo,
    pub(super) registered: Instant,
    /// When the join was released (every node registered).
    pub(super) released: Instant,
    pub(super) sealed: Instant,
    pub(super) join_ops: u64,
    /// Every operation of the node until it had its round.
    pub(super) round_ops: u64,
    /// Membership events seen in the steady window (none in a sound run).
    pub(super) steady_events: Vec<String>,
    pub(super) _kept: K,
}

pub(super) fn make_report<K>(
    store: String,
    nproc: u32,
    settings: &Settings,
    start: Instant,
    outcomes: &[NodeOutcome<K>],
    counts: &[Arc<OpCounts>],
) -> Report {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let last_registered = outcomes.iter().map(|o| o.registered).max().unwrap_or(start);
    let released = outcomes.iter().map(|o| o.released).max().unwrap_or(last_registered);
    let last_sealed = outcomes.iter().map(|o| o.sealed).max().unwrap_or(start);
    let mut latencies: Vec<f64> = outcomes.iter().map(|o| ms(o.sealed.saturating_duration_since(released))).collect();
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
    let nodes = counts.len() as u32;
    Report {
        store,
        nodes,
        min: settings.min_nodes,
        max: settings.max_nodes,
        nproc,
        // The pause between the phases (reading the server's counters) is left out.
        total_ms: ms(last_registered - start) + ms(last_sealed.saturating_duration_since(released)),
        register_ms: ms(last_registered - start),
        join_ms: ms(last_sealed.saturating_duration_since(released)),
        join_p50_ms: percentile(0.5),
        join_p99_ms: percentile(0.99),
        round,
        world_size: outcomes.first().map_or(0, |o| o.info.world_size),
        ops_per_node: summarize(&mut outcomes.iter().map(|o| o.round_ops)),
        join_ops_per_node: summarize(&mut outcomes.iter().map(|o| o.join_ops)),
        read_bytes_per_node: summarize(&mut counts.iter().map(|c| c.bytes_read.load(Ordering::Relaxed))),
        written_bytes_per_node: summarize(&mut counts.iter().map(|c| c.bytes_written.load(Ordering::Relaxed))),
        ops_by_kind,
        server_per_node: None,
        server: None,
        phases: BTreeMap::new(),
        steady: None,
        problems: check_round(nodes, nproc, outcomes),
    }
}

/// What is wrong with the sealed round, if anything: every node in it once, ranks 0..N-1, one view of it.
fn check_round<K>(nodes: u32, nproc: u32, outcomes: &[NodeOutcome<K>]) -> Vec<String> {
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
        if let Some(event) = o.steady_events.first() {
            problems.push(format!("node {} saw {event} in the steady window", o.node));
        }
        // One line per kind of problem is enough to debug; N identical lines are not.
        if problems.len() > 5 {
            problems.push("...".into());
            break;
        }
    }
    problems
}
