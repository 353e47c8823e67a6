//! The simulated agents: N rendezvous tasks, each with its own store handle (one TCP connection to a
//! `muster store` child, or an etcd client of its own), against one store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Barrier, Semaphore};
use tokio::task::JoinSet;

use super::backend::Connect;
use super::counting::{CountingStore, OpCounts};
use super::report::{make_report, NodeOutcome, Report};
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

/// Runs the round on the store `connect` reaches (named `store` in the report).
pub(super) async fn simulate(
    nodes: u32,
    nproc: u32,
    settings: Settings,
    timeout: Duration,
    connect: &Arc<Connect>,
    store: String,
) -> Result<Report, BenchError> {
    let counts: Vec<Arc<OpCounts>> = (0..nodes).map(|_| Arc::default()).collect();
    let barrier = Arc::new(Barrier::new(nodes as usize));
    let connecting = Arc::new(Semaphore::new(CONNECTING));
    let fingerprint = Fingerprint {
        entrypoint: "bench".into(),
        args: Vec::new(),
        nproc_spec: nproc.to_string(),
        nnodes: format!("{nodes}:{nodes}"),
        restart_budget: String::new(),
        exclude_after: String::new(),
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
        let (settings, fingerprint, barrier, connecting) =
            (settings.clone(), fingerprint.clone(), barrier.clone(), connecting.clone());
        let (registered_count, connect) = (registered_count.clone(), connect.clone());
        tasks.spawn(async move {
            // Connect and register; whatever happens, take part in the barrier so the others are not stuck.
            let joined = async {
                // Never closed, so acquiring cannot fail; a permit is held until the HELLO is answered.
                let permit = connecting.acquire().await;
                let store = connect
                    .connect(timeout)
                    .await
                    .map_err(|source| BenchError::Connect { node, source })?;
                drop(permit);
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
            Ok::<_, BenchError>(Outcome {
                node,
                info,
                registered,
                sealed: Instant::now(),
                join_ops: node_counts.total() - ops_before,
                _kept: rendezvous,
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
    let report = make_report(store, nproc, &settings, start, &outcomes, &counts);
    // Close every node's connections before the store goes (the caller stops it).
    drop(outcomes);
    Ok(report)
}
