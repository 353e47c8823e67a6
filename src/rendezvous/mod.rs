//! Membership: which agents form the job in each round, their group ranks, and the events that end a round.
//!
//! The algorithm talks only to the [`Store`] trait (invariant 8). Per node and round it costs O(1)
//! store operations and no key is rewritten by every node:
//! - a join takes a slot from an atomic counter (`r/<R>/slot`) and writes its own record (`r/<R>/m/<slot>`);
//! - the round is sealed once, by whoever holds the `r/<R>/sealer` lock, when `max` nodes have joined, when
//!   every node expected by a re-formation has joined, or when the last call after `min` ends; the sealer
//!   writes each member's assignment (`r/<R>/a/<slot>`: its ranks and ring neighbours, O(1) bytes), the
//!   members in group-rank order (`r/<R>/members`, read only to re-form) and then the seal (`r/<R>/sealed`,
//!   their count: what every joiner waits for, so O(1) bytes too);
//! - liveness comes from a session-bound key per agent (`alive/<node>`): it vanishes when the agent's
//!   connection closes (or the server's TCP keepalive gives up on a vanished host); each member watches the
//!   next two members in rank order and opens the next round when one dies, so detection costs O(1) per node;
//! - heartbeats (`hb/<node>`, one write per agent per `keep_alive_interval` while it is in a sealed round,
//!   none while it joins) catch an agent that hangs or is stopped with its connection open: its ring
//!   neighbours evict it after `keep_alive_max_attempt` periods;
//! - a node that arrives after the seal registers `waiting/<node>` (session-bound) and waits; members batch
//!   the joiners for one last-call window and open the next round once (a scale-up costs one restart);
//! - any member opens round R+1 by compare-and-set on `round` (`"R+1/expected"`), after a local failure,
//!   a lost peer or joiners; the others see the change and rejoin.
//!
//! Group ranks are stable: members of the previous round keep their relative order, newcomers follow,
//! ordered by their scheduler-given rank (`--node-rank`, Slurm) and then by arrival. Every member publishes a
//! fingerprint of its launch (script, arguments, nproc spec); a different one is refused with the difference.
//!
//! Keys live under `muster/<run_id>/`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::{Store, StoreError, WatchEvent};

pub mod board;
pub mod pace;
mod budget;
mod ending;
#[cfg(test)]
mod fuzz;
mod fence;
mod join;
mod lemons;
mod liveness;
#[cfg(test)]
mod race_tests;
mod retry;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod tests;
mod view;
mod wire;

pub use budget::RestartBudget;
pub use ending::LINGER_INTERVALS;
pub use lemons::{forget, readmit, Incident, KeptOut, CULPRITS};
pub use fence::Timing;
pub use liveness::unix_ms;
pub use view::{read_view, JobRestarts, JobView, NodeView};
pub use wire::{Closure, Fingerprint, Heartbeat, RoundInfo};
use wire::parse_round;

/// Every rendezvous key lives under `muster/<run id>/`; the store keeps them for the job's agents.
pub const KEY_PREFIX: &str = "muster/";

/// The job's key that says its workers re-form in place.
const IN_PLACE_KEY: &str = "in-place";
/// How long the node hosting the store waits at the end for the others to be done with it.
const LEAVE_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RdzvError {
    #[error("rendezvous store error: {0}")]
    Store(#[from] StoreError),
    #[error(
        "rendezvous '{run_id}' timed out after {timeout:?} with {joined} of at least {min} node(s) joined; \
         start the other nodes or raise join_timeout in --rdzv-conf"
    )]
    Timeout { run_id: String, timeout: Duration, joined: i64, min: u32 },
    #[error("rendezvous '{0}' is closed: the job has finished or failed on another node")]
    Closed(String),
    /// A node out of restarts closed the job, with its line.
    #[error("the job failed on another node and is closed for good: {0}")]
    FailedElsewhere(String),
    /// The job-wide restart budget is spent (this line is the same on every agent).
    #[error("{0}")]
    RestartBudget(String),
    /// The store's host was stopped by signal number `signal` (a `scancel`, a preemption): the job ends
    /// with it, every node with that signal's code.
    #[error("the job was stopped: {line}; this node's workers are stopped with it")]
    StoppedElsewhere { signal: i32, line: String },
    /// This host caused `--exclude-after` incidents (the line lists them).
    #[error("{0}")]
    KeptOut(String),
    #[error("this node does not match the running job: {0}")]
    Mismatch(String),
    #[error("invalid rendezvous state: {0}")]
    State(String),
    #[error("lost the connection to the rendezvous store; it may have been stopped or its host is gone")]
    StoreLost,
    /// The agent that hosted the store is gone (its port refuses connections), and its workers with it.
    #[error(
        "the rendezvous store's host ended: node {node}, whose agent hosted the store at {addr}, is gone (the \
         port refuses connections) and its workers with it, so the job cannot go on; this node's workers are \
         stopped: requeue the job"
    )]
    StoreHostEnded { node: String, addr: String },
    /// An external store that refused connections for the whole of a re-formation's patience.
    #[error(
        "the rendezvous store at {addr} has refused connections for {waited:?} (its process ended) and this \
         node needs it to re-form; requeue the job once the store runs again"
    )]
    StoreRefused { addr: String, waited: Duration },
}

/// How long waits last and how many nodes a round needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub run_id: String,
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub join_timeout: Duration,
    pub last_call_timeout: Duration,
    pub exit_barrier_timeout: Duration,
    /// Heartbeat period; a neighbour whose heartbeat did not change for `keep_alive_max_attempt` periods is
    /// evicted (torch: 5 s × 3).
    pub keep_alive_interval: Duration,
    pub keep_alive_max_attempt: u32,
    /// Deadline for one heartbeat write.
    pub heartbeat_timeout: Duration,
    /// How long a store that does not answer is asked again (it may be restarting) before the agent gives
    /// up with the store lost: `--rdzv-conf read_timeout`, the deadline of one store request.
    pub store_timeout: Duration,
    /// A scheduler-given rank: honoured among newcomers; with `strict_rank` it *is* the group rank (static).
    pub node_rank: Option<u32>,
    pub strict_rank: bool,
    /// `--job-max-restarts`: the job's restarts, counted in the store (`budget.rs`).
    pub restart_budget: Option<RestartBudget>,
    /// `--exclude-after K[/WINDOW]`: a host that caused K incidents (within WINDOW) is kept out (`lemons.rs`).
    pub exclude_after: Option<RestartBudget>,
}

/// This agent, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `<addr>_<pid>_<local id>`, unique per agent process.
    pub id: String,
    pub addr: String,
    pub nproc: u32,
}

/// What ends a running round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdzvEvent {
    /// A member's agent is gone (its session ended).
    PeerLost(String),
    /// Nodes are waiting to join and the group has room: open the next round after batching.
    JoinersWaiting,
    /// Another member opened the next round (a failure or a change elsewhere).
    RoundChanged,
    /// The job was closed by another member (finished or failed for good), and why.
    Closed(Closure),
    /// This node is cut off from the store (nothing acknowledged for `silent`, no network path): the
    /// others are about to evict it, so its workers must stop first (`fence.rs`).
    Fenced { silent: Duration },
    /// A worker failed while this node's link to the store was broken: its peers may be re-forming where
    /// this node cannot see, so the failure is not the worker's own.
    StoreOutage,
    /// A hang was found and its suspects are on other nodes, which restart their groups: this node's
    /// workers, blocked in collectives with them, are stopped for the re-formation (`agent::hang`).
    HangElsewhere,
}

/// What a node waiting for group rank 0's publication learns first.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    Value(Vec<u8>),
    /// The membership changed first; the round will not start.
    Changed(RdzvEvent),
}

/// One agent's side of the rendezvous.
pub struct Rendezvous<S: Store> {
    store: Arc<S>,
    settings: Settings,
    me: NodeInfo,
    fingerprint: Fingerprint,
    prefix: String,
    /// The round this node last joined and its group rank there.
    prev: Option<(u64, u32)>,
    /// Restarts this node has spent, written in its record of each round it joins.
    restarts: u32,
    /// Rounds this node joined with its workers kept in place, written there too.
    in_place: u32,
    current: Option<RoundInfo>,
    /// Writes `hb/<me>` every `keep_alive_interval` while this node is in a sealed round (aborted on drop).
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// Whether this node is in a sealed round (its heartbeat task beats) or joining one (it does not).
    in_round: tokio::sync::watch::Sender<bool>,
    /// The members whose liveness this node checks, whether a beat of theirs was heard (their `hb/` key's
    /// watch event) since the last check, and how many checks in a row heard none.
    neighbours: Vec<(String, bool, u32)>,
    /// This node's own link to the store, as its heartbeat task finds it.
    link: fence::SharedLink,
    timing: Timing,
    /// Neighbours whose liveness key went while this node's link was broken, and when to judge them.
    suspects: Vec<(String, Instant)>,
    /// When this node fenced itself (cleared once it is in a round again): it gives up `store_timeout`
    /// later, whatever it is doing then.
    fenced_at: Option<Instant>,
    /// An event found while setting up the watch, delivered first.
    pending: Option<RdzvEvent>,
    /// When the joiners seen waiting are let in (the end of their last call); kept across `next_event`
    /// calls so that a cancelled call does not forget them.
    batch_until: Option<Instant>,
    /// When `next_event` next checks the neighbours' heartbeats (every `keep_alive_interval`, however often
    /// it is called).
    next_check: Option<Instant>,
    /// The round counter's value when the current round started.
    round_raw: Vec<u8>,
    events: Option<mpsc::UnboundedReceiver<WatchEvent>>,
    /// What the heartbeat carries besides its count and time: the local ranks' progress.
    note: BeatNote,
    /// ... and the last straggler window of this node (`pace.rs`).
    pace: pace::PaceNote,
    /// Which agent hosts the store (`ending.rs`).
    store_host: ending::StoreHost,
    /// This agent knows the job is closed, and said so in the store.
    closure_acked: std::sync::atomic::AtomicBool,
    /// This handle's `waiting/` key may exist: it waited as a spare and has not deleted the key since. (A
    /// key an earlier agent of this node left names an older round, which no count takes for a joiner, and
    /// goes with that agent's session.)
    listed_waiting: bool,
    /// `register` has just set the liveness key, so the first slot taken need not set it again (a store
    /// lost meanwhile clears it: the key went with that store).
    alive_fresh: bool,
}

/// The local ranks' last progress as the heartbeat carries it (`(global rank, unix ms)`), kept current by
/// the hang monitor.
pub type BeatNote = Arc<std::sync::Mutex<Vec<(u32, u64)>>>;

impl<S: Store> Rendezvous<S> {
    pub fn new(store: S, settings: Settings, me: NodeInfo, fingerprint: Fingerprint) -> Self {
        let prefix = format!("{KEY_PREFIX}{}/", settings.run_id);
        let timing = Timing::of(&settings);
        Rendezvous {
            store: Arc::new(store),
            heartbeat: None,
            in_round: tokio::sync::watch::Sender::new(false),
            neighbours: Vec::new(),
            link: fence::SharedLink::new(&timing),
            timing,
            suspects: Vec::new(),
            fenced_at: None,
            settings,
            me,
            fingerprint,
            prefix,
            prev: None,
            restarts: 0,
            in_place: 0,
            current: None,
            pending: None,
            batch_until: None,
            next_check: None,
            round_raw: Vec::new(),
            events: None,
            note: BeatNote::default(),
            pace: pace::PaceNote::default(),
            store_host: ending::StoreHost::Unknown,
            closure_acked: std::sync::atomic::AtomicBool::new(false),
            listed_waiting: false,
            alive_fresh: false,
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// What the heartbeat reports of the local ranks' progress.
    pub fn beat_note(&self) -> BeatNote {
        self.note.clone()
    }

    /// The liveness timing derived from the settings.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// When a node that fenced itself gives up: `store_timeout` after the fence.
    fn give_up_at(&self) -> Option<(Instant, Instant)> {
        self.fenced_at.map(|fenced| (fenced, fenced + self.settings.store_timeout))
    }
}

/// The round counter as read: its raw value (for compare-and-set), the round, and the nodes it expects.
type RoundCounter = (Vec<u8>, u64, Option<u32>);

fn round_counter(value: Option<Vec<u8>>) -> RoundCounter {
    let raw = value.unwrap_or_default();
    let (round, expected) = parse_round(&raw);
    (raw, round, expected)
}

/// Runs `op`, or gives up with [`RdzvError::StoreLost`] at `give_up` (from [`Rendezvous::give_up_at`]): a
/// node cut off ends at a time it can state, not after each operation's own retries.
async fn within<T>(give_up: Option<(Instant, Instant)>, op: impl std::future::Future<Output = Result<T, RdzvError>>) -> Result<T, RdzvError> {
    let Some((fenced, at)) = give_up else { return op.await };
    match tokio::time::timeout_at(at, op).await {
        Ok(done) => done,
        Err(_) => {
            tracing::warn!(
                "the rendezvous store has been out of reach since this node fenced itself {:?} ago; giving up \
                 (read_timeout, join_timeout with etcd)",
                fenced.elapsed()
            );
            Err(RdzvError::StoreLost)
        }
    }
}

#[cfg(test)]
impl<S: Store> Rendezvous<S> {
    /// Simulates a hung agent: heartbeats stop, the connection stays open.
    fn stop_heartbeat(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

impl<S: Store> Drop for Rendezvous<S> {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

impl<S: Store> Rendezvous<S> {
    pub fn me(&self) -> &NodeInfo {
        &self.me
    }

    /// Workers this node brings to the next round (after a GPU was excluded).
    pub fn set_nproc(&mut self, nproc: u32) {
        self.me.nproc = nproc;
    }

    /// Restarts spent so far, published with the next join (what `muster status` shows).
    pub fn set_restarts(&mut self, restarts: u32) {
        self.restarts = restarts;
    }

    /// Counts the join about to be made among those with workers kept in place when `kept`; the count is
    /// published with it (`muster status` too).
    pub fn count_join_in_place(&mut self, kept: bool) {
        self.in_place += u32::from(kept);
    }

    /// Whether the job is closed, and why (once known, acknowledged for the store's host).
    async fn closure(&self) -> Result<Option<Closure>, RdzvError> {
        let closed = self.store.get(&self.key("closed")).await?;
        Ok(self.closure_in(closed).await)
    }

    /// The closure a value of `closed` says, acknowledged once known.
    async fn closure_in(&self, closed: Option<Vec<u8>>) -> Option<Closure> {
        let closure = closed.map(|v| Closure::decode(&v));
        if closure.is_some() {
            self.acknowledge_closure().await;
        }
        closure
    }

    /// The values of `names` under this job's prefix, in order, in one request: what one look at the
    /// store needs costs it one request, however many keys it reads.
    async fn read_keys(&self, names: &[String]) -> Result<Vec<Option<Vec<u8>>>, RdzvError> {
        let keys: Vec<String> = names.iter().map(|n| self.key(n)).collect();
        Ok(self.store.multi_get(&keys).await?)
    }

    /// Ends the job for every agent with `closure`.
    async fn close_with(&self, closure: &Closure) -> Result<(), RdzvError> {
        self.store.set(&self.key("closed"), &closure.encode()).await?;
        self.acknowledge_closure().await;
        Ok(())
    }

    /// The round counter: its raw value (for compare-and-set), the round, and how many nodes it expects.
    async fn read_round(&self) -> Result<RoundCounter, RdzvError> {
        Ok(round_counter(self.store.get(&self.key("round")).await?))
    }

    /// Publishes a value for the current round (e.g. the workers' MASTER_ADDR:PORT from group rank 0).
    /// A store that does not answer is asked again until `store_timeout`: should it have restarted, the
    /// others re-form in it and this node follows when it watches the round.
    pub async fn publish(&self, name: &str, value: &[u8]) -> Result<(), RdzvError> {
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        let key = self.key(&format!("r/{round}/{name}"));
        let mut retry = self.retry("publishing");
        loop {
            match self.store.set(&key, value).await {
                Err(e) => retry.after(e.into()).await?,
                Ok(()) => return Ok(()),
            }
        }
    }

    /// A write marking the job as one whose workers re-form in place (`crate::inplace`), as a future of its
    /// own: an agent makes it once one of its workers says so. A joiner that reads it (`job_in_place`)
    /// starts its workers before it asks to join. One write per agent and job.
    pub fn in_place_mark(&self) -> impl std::future::Future<Output = Result<(), RdzvError>> + Send + 'static {
        let (store, key) = (self.store.clone(), self.key(IN_PLACE_KEY));
        async move { Ok(store.set(&key, b"1").await?) }
    }

    /// Forgets the mark: a node whose workers, started ahead, never reached the API (the script no longer
    /// uses it, a job requeued with the same id) spares the next joiner the same wait.
    pub async fn forget_in_place(&self) -> Result<(), RdzvError> {
        self.store.delete(&self.key(IN_PLACE_KEY)).await?;
        Ok(())
    }

    /// Whether the job's workers re-form in place (see `in_place_mark`).
    pub async fn job_in_place(&self) -> Result<bool, RdzvError> {
        Ok(self.store.get(&self.key(IN_PLACE_KEY)).await?.is_some())
    }

    /// Waits (bounded) until every member of the round has finished. The member that completes the barrier
    /// knows it is complete and does not wait. Errors are the caller's to log, not fatal.
    pub async fn exit_barrier(&self) -> Result<(), RdzvError> {
        let Some(current) = &self.current else { return Ok(()) };
        let done = self.store.add(&self.key(&format!("r/{}/done", current.round)), 1).await?;
        let all = self.key(&format!("r/{}/done_all", current.round));
        if done >= i64::from(current.group_world_size) {
            self.store.set(&all, b"1").await?;
            return Ok(());
        }
        if !self.store.wait(&all, self.settings.exit_barrier_timeout).await? {
            return Err(RdzvError::State(format!(
                "exit barrier: not every node finished within {:?}",
                self.settings.exit_barrier_timeout
            )));
        }
        Ok(())
    }

    /// The end of a finished job's use of the store, after the barrier and `close`: a member that does not
    /// host the store says it is done with it; the host waits (at most `LEAVE_WAIT`) until every other
    /// member has, so that none of their last requests finds the store gone with its host (which would
    /// cost them a reconnect attempt until `close_timeout`).
    pub async fn leave_store(&self, hosting: bool) -> Result<(), RdzvError> {
        let Some(current) = &self.current else { return Ok(()) };
        let others = i64::from(current.group_world_size.saturating_sub(1));
        let left = self.key(&format!("r/{}/left", current.round));
        let all_left = self.key(&format!("r/{}/left_all", current.round));
        if hosting {
            if others > 0 && !self.store.wait(&all_left, LEAVE_WAIT).await? {
                tracing::debug!("not every node said it was done with the store within {LEAVE_WAIT:?}");
            }
            return Ok(());
        }
        let left_now = self.store.add(&left, 1).await?;
        if left_now >= others {
            self.store.set(&all_left, b"1").await?;
        }
        // The last of a round nobody hosts: the job's state goes where the store outlives it.
        if left_now > others {
            self.store.forget_job(&self.key(lemons::CULPRITS)).await?;
        }
        Ok(())
    }

    /// Marks the job closed: nodes still joining or waiting give up. `failed`: this node failed for good,
    /// with the line the others end with.
    pub async fn close(&self, failed: Option<String>) -> Result<(), RdzvError> {
        self.close_with(&failed.map_or(Closure::Finished, Closure::Failed)).await
    }

    /// On the store's host stopped by `sig`: the store goes with this agent, so the job ends here; say so,
    /// so that every member ends with the same signal's code rather than finding the store gone (a member
    /// stopped by the same `scancel` would otherwise race its own signal). Elsewhere nothing: a member
    /// stopped alone leaves, and the others re-form without it.
    pub async fn close_stopped(&self, sig: nix::sys::signal::Signal, line: String) -> Result<(), RdzvError> {
        if !self.hosts_store() {
            return Ok(());
        }
        self.close_with(&Closure::Stopped { signal: sig as i32, line }).await
    }
}
