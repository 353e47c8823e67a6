//! The simulated agents: N rendezvous tasks, each with its own store handle (one TCP connection to a
//! `muster store` child, or an etcd client of its own), against one store, in three phases the bench
//! counts apart: connect and register (every node), join (released together once every node registered),
//! and, when asked, a steady window in which every member watches its round as a training agent does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;

use super::backend::Connect;
use super::counting::{CountingStore, OpCounts};
use super::report::{make_report, NodeOutcome, Phase, PhaseCounts, Report};
use super::BenchError;
use crate::rendezvous::{Fingerprint, NodeInfo, Rendezvous, Settings};
use crate::store::RdzvStore;

/// Simulated nodes between their connect and the store's answer to their HELLO (etcd: its status) at once.
/// A real agent sends its HELLO the instant it is connected; thousands of tasks in one process on a few cores would take
/// seconds to get round to it, and the store closes a connection that sends nothing valid within its
/// handshake deadline (5 s): 16384 unpaced nodes on 2 loaded cores lost 1942 connections that way.
const CONNECTING: usize = 1024;

/// What one simulated node brings back. The rendezvous is kept so its connections (and session keys) stay
/// up until every node is done: a node leaving early would send every other node's watch an event.
type Outcome = NodeOutcome<Rendezvous<CountingStore<RdzvStore>>>;

/// A moment every node waits for, set once by the bench.
#[derive(Clone)]
struct Gate(watch::Receiver<Option<Instant>>);

impl Gate {
    async fn passed(mut self) -> Option<Instant> {
        self.0.wait_for(Option::is_some).await.ok().and_then(|at| *at)
    }
}

/// The run's shape: node count, world, and how long the steady window lasts (zero: none).
pub(super) struct Plan {
    pub(super) nodes: u32,
    pub(super) nproc: u32,
    pub(super) timeout: Duration,
    pub(super) steady: Duration,
}

/// Runs the round on the store `connect` reaches (named `store` in the report).
pub(super) async fn simulate(plan: Plan, settings: Settings, connect: &Arc<Connect>, store: String) -> Result<Report, BenchError> {
    let Plan { nodes, nproc, timeout, steady } = plan;
    let counts: Vec<Arc<OpCounts>> = (0..nodes).map(|_| Arc::default()).collect();
    let connecting = Arc::new(Semaphore::new(CONNECTING));
    let (join_tx, join_gate) = watch::channel(None);
    let (steady_tx, steady_gate) = watch::channel(None);
    let (marks, mut marked) = mpsc::unbounded_channel::<()>();
    let fingerprint = Fingerprint {
        entrypoint: "bench".into(),
        args: Vec::new(),
        nproc_spec: nproc.to_string(),
        nnodes: format!("{nodes}:{nodes}"),
        restart_budget: String::new(),
        exclude_after: String::new(),
    };

    // etcd's counts before any node connects: read once they run, the first nodes' requests went uncounted.
    let mut before = PhaseCounts::read(connect, &counts).await;
    // How many nodes got through register(), for the diagnosis when the run times out.
    let registered_count = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tasks = JoinSet::new();
    for node in 0..nodes {
        let me = NodeInfo { id: format!("127.0.0.1_{}_{node}", std::process::id()), addr: "127.0.0.1".into(), nproc };
        let node_counts = counts[node as usize].clone();
        let (settings, fingerprint, connecting, marks) = (settings.clone(), fingerprint.clone(), connecting.clone(), marks.clone());
        let (registered_count, connect) = (registered_count.clone(), connect.clone());
        let (join_gate, steady_gate) = (Gate(join_gate.clone()), Gate(steady_gate.clone()));
        tasks.spawn(async move {
            // Never closed, so acquiring cannot fail; a permit is held until the HELLO is answered.
            let permit = connecting.acquire().await;
            let store = connect.connect(&me.id, timeout).await.map_err(|source| BenchError::Connect { node, source })?;
            drop(permit);
            let counting = CountingStore { inner: store, counts: node_counts.clone() };
            let mut rendezvous = Rendezvous::new(counting, settings, me, fingerprint);
            rendezvous.register().await.map_err(|source| BenchError::Rendezvous { node, source })?;
            registered_count.fetch_add(1, Ordering::Relaxed);
            let registered = Instant::now();
            let _ = marks.send(());
            let released = join_gate.passed().await.unwrap_or(registered);
            let ops_before = node_counts.total();
            let info = rendezvous.next_round().await.map_err(|source| BenchError::Rendezvous { node, source })?;
            let sealed = Instant::now();
            let round_ops = node_counts.total();
            let join_ops = round_ops - ops_before;
            let _ = marks.send(());
            let mut steady_events = Vec::new();
            let end = steady_gate.passed().await.unwrap_or(sealed);
            // A steady job has no membership event: any one seen is reported as a problem.
            while let Ok(event) = tokio::time::timeout_at(end.into(), rendezvous.next_event()).await {
                steady_events.push(format!("{event:?}"));
            }
            Ok::<_, BenchError>(Outcome { node, info, registered, released, sealed, join_ops, round_ops, steady_events, _kept: rendezvous })
        });
    }
    drop(marks);
    let timed_out = |sealed: usize| BenchError::TimedOut { timeout, nodes, registered: registered_count.load(Ordering::Relaxed), sealed };

    let mut phases = Vec::new();
    for (phase, gate) in [(Phase::Register, &join_tx), (Phase::Join, &steady_tx)] {
        let mut arrived = 0;
        while arrived < nodes {
            tokio::select! {
                mark = marked.recv() => match mark {
                    Some(()) => arrived += 1,
                    None => break,
                },
                done = tasks.join_next() => return Err(failed(done, &phase)),
                () = tokio::time::sleep_until(deadline) => return Err(timed_out(if phase == Phase::Join { arrived as usize } else { 0 })),
            }
        }
        let now = PhaseCounts::read(connect, &counts).await;
        phases.push((phase, now.since(&before)));
        before = now;
        // The join is released now; the steady window (none when zero) ends `steady` from now.
        let _ = gate.send(Some(Instant::now() + if phase == Phase::Join { steady } else { Duration::ZERO }));
    }

    let mut outcomes = Vec::with_capacity(nodes as usize);
    let deadline = deadline + steady;
    while outcomes.len() < nodes as usize {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(Ok(Ok(outcome))) => outcomes.push(outcome),
                other => return Err(failed(other, &Phase::Steady)),
            },
            () = tokio::time::sleep_until(deadline) => return Err(timed_out(nodes as usize)),
        }
    }
    if !steady.is_zero() {
        phases.push((Phase::Steady, PhaseCounts::read(connect, &counts).await.since(&before)));
    }
    let report = make_report(store, nproc, &settings, start, &outcomes, &counts).with_phases(phases, steady);
    // Close every node's connections before the store goes (the caller stops it).
    drop(outcomes);
    Ok(report)
}

/// A node task that ended before its time: its error, or its panic.
fn failed(done: Option<Result<Result<Outcome, BenchError>, tokio::task::JoinError>>, phase: &Phase) -> BenchError {
    match done {
        Some(Ok(Err(e))) => e,
        Some(Err(e)) => BenchError::Panicked(e.to_string()),
        Some(Ok(Ok(o))) => BenchError::Panicked(format!("node {} ended during the {} phase", o.node, phase.name())),
        None => BenchError::Panicked(format!("every node ended during the {} phase", phase.name())),
    }
}
