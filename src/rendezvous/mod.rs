//! Membership: which agents form the job in each round, their group ranks, and the events that end a round.
//!
//! The algorithm talks only to the [`Store`] trait (design invariant 3). Per node and round it costs O(1)
//! store operations and no key is rewritten by every node:
//! - a join takes a slot from an atomic counter (`r/<R>/slot`) and writes its own record (`r/<R>/m/<slot>`);
//! - the round is sealed once, by whoever holds the `r/<R>/sealer` lock, when `max` nodes have joined, when
//!   every node expected by a re-formation has joined, or when the last call after `min` ends; the sealer
//!   writes each member's assignment (`r/<R>/a/<slot>`: its ranks and ring neighbours, O(1) bytes) and then
//!   the seal (`r/<R>/sealed`, the members in group-rank order, read only to re-form);
//! - liveness comes from a session-bound key per agent (`alive/<node>`): it vanishes when the agent's
//!   connection closes (or the server's TCP keepalive gives up on a vanished host); each member watches the
//!   next two members in rank order and opens the next round when one dies, so detection costs O(1) per node;
//! - heartbeats (`hb/<node>`, one write per agent per `keep_alive_interval`) catch an agent that hangs or is
//!   stopped with its connection open: its ring neighbours evict it after `keep_alive_max_attempt` periods;
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

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::store::{Store, StoreError, WatchEvent, WatchEventKind, WatchTarget};

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
    #[error("this node does not match the running job: {0}")]
    Mismatch(String),
    #[error("invalid rendezvous state: {0}")]
    State(String),
    #[error("lost the connection to the rendezvous store; it may have been stopped or its host is gone")]
    StoreLost,
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
    /// A scheduler-given rank: honoured among newcomers; with `strict_rank` it *is* the group rank (static).
    pub node_rank: Option<u32>,
    pub strict_rank: bool,
}

/// What every member publishes; the first member's fingerprint is the job's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub entrypoint: String,
    pub args: Vec<String>,
    /// `--nproc-per-node` as given: `gpu` matches `gpu` even when the counts differ between nodes.
    pub nproc_spec: String,
}

impl Fingerprint {
    fn differences(&self, job: &Fingerprint) -> Vec<String> {
        let mut d = Vec::new();
        if self.entrypoint != job.entrypoint {
            d.push(format!("script '{}' (the job runs '{}')", self.entrypoint, job.entrypoint));
        }
        if self.args != job.args {
            d.push(format!("arguments {:?} (the job uses {:?})", self.args, job.args));
        }
        if self.nproc_spec != job.nproc_spec {
            d.push(format!("--nproc-per-node {} (the job uses {})", self.nproc_spec, job.nproc_spec));
        }
        d
    }
}

/// This agent, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `<addr>_<pid>_<local id>`, unique per agent process.
    pub id: String,
    pub addr: String,
    pub nproc: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    node: NodeInfo,
    slot: i64,
    prev_rank: Option<u32>,
    pref_rank: Option<u32>,
}

/// The sealed membership, in group-rank order. Every member reads it once per round, so it is a compact
/// line per member (`<nproc> <addr> <id>`) rather than JSON: at thousands of nodes, parsing dominates.
#[derive(Debug, Clone)]
struct Seal {
    members: Vec<NodeInfo>,
}

impl Seal {
    fn encode(&self) -> Vec<u8> {
        let mut out = String::with_capacity(self.members.len() * 48);
        for m in &self.members {
            out.push_str(&format!("{} {} {}\n", m.nproc, m.addr, m.id));
        }
        out.into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<Seal, RdzvError> {
        let text = std::str::from_utf8(bytes).map_err(|e| RdzvError::State(format!("bad seal: {e}")))?;
        let members = text
            .lines()
            .map(|l| {
                let mut f = l.splitn(3, ' ');
                match (f.next().and_then(|n| n.parse().ok()), f.next(), f.next()) {
                    (Some(nproc), Some(addr), Some(id)) => Ok(NodeInfo { id: id.into(), addr: addr.into(), nproc }),
                    _ => Err(RdzvError::State(format!("bad seal line '{l}'"))),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Seal { members })
    }
}

/// What one attempt to seal a round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SealAttempt {
    Sealed,
    /// Another live node holds the sealer lock.
    NotMine,
    /// Slots were taken whose records are not written yet.
    RecordsInFlight,
    /// Fewer than MIN live joiners.
    TooFew,
}

/// One sealed round, from this node's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundInfo {
    pub round: u64,
    pub group_rank: u32,
    pub group_world_size: u32,
    pub base_global_rank: u32,
    pub world_size: u32,
    /// The next two members in rank order (those whose liveness this node watches).
    pub neighbours: Vec<NodeInfo>,
}

impl RoundInfo {
    /// One member's view of the round, as the sealer writes it to `r/<R>/a/<slot>`: O(1) bytes per node,
    /// so nobody reads the whole membership to learn its rank.
    fn encode(&self) -> Vec<u8> {
        let mut out = format!("{} {} {} {}\n", self.group_rank, self.group_world_size, self.base_global_rank, self.world_size);
        out.push_str(&String::from_utf8_lossy(&Seal { members: self.neighbours.clone() }.encode()));
        out.into_bytes()
    }

    fn decode(round: u64, bytes: &[u8]) -> Result<RoundInfo, RdzvError> {
        let bad = || RdzvError::State("bad rank assignment".into());
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let (head, rest) = text.split_once('\n').unwrap_or((text, ""));
        let n: Vec<u32> = head.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| bad())?;
        let [group_rank, group_world_size, base_global_rank, world_size] = n[..] else { return Err(bad()) };
        let neighbours = Seal::decode(rest.as_bytes())?.members;
        Ok(RoundInfo { round, group_rank, group_world_size, base_global_rank, world_size, neighbours })
    }
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
    /// The job was closed by another member (finished or failed for good).
    Closed,
}

/// The round counter's value: `R` or `R/expected`.
fn parse_round(v: &[u8]) -> (u64, Option<u32>) {
    let s = String::from_utf8_lossy(v);
    let mut it = s.trim().splitn(2, '/');
    let round = it.next().and_then(|r| r.parse().ok()).unwrap_or(0);
    let expected = it.next().and_then(|e| e.parse().ok());
    (round, expected)
}

/// Orders the live joiners of a round into group ranks (pure; see the module docs).
fn assign_ranks(mut records: Vec<Record>, settings: &Settings) -> Result<Vec<Record>, RdzvError> {
    if settings.strict_rank {
        records.sort_by_key(|r| (r.pref_rank.unwrap_or(u32::MAX), r.slot));
        records.dedup_by(|a, b| a.node.id == b.node.id);
        for (i, r) in records.iter().enumerate() {
            if r.pref_rank != Some(i as u32) {
                return Err(RdzvError::State(format!(
                    "static rendezvous needs --node-rank 0..{} exactly once each; node {} has {:?}",
                    settings.max_nodes - 1,
                    r.node.addr,
                    r.pref_rank
                )));
            }
        }
    } else {
        records.sort_by_key(|r| (r.prev_rank.is_none(), r.prev_rank, r.pref_rank.unwrap_or(u32::MAX), r.slot));
    }
    records.truncate(settings.max_nodes as usize);
    Ok(records)
}

/// What a node waiting for group rank 0's publication learns first.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    Value(Vec<u8>),
    /// The membership changed first; the round will not start.
    Changed(RdzvEvent),
}

/// Waits until `key` exists (true) or `timeout` passes (false), in slices of at most a second: the
/// connection is shared with the heartbeat task, which must not be starved by a long wait (a finished node in
/// the exit barrier keeps beating).
async fn wait_key_in<S: Store>(store: &S, key: &str, timeout: Duration) -> Result<bool, RdzvError> {
    let deadline = Instant::now() + timeout;
    loop {
        let slice = deadline.saturating_duration_since(Instant::now()).min(Duration::from_secs(1));
        if store.wait(key, slice).await? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// One agent's side of the rendezvous.
pub struct Rendezvous<S: Store> {
    store: Arc<S>,
    settings: Settings,
    me: NodeInfo,
    fingerprint: Fingerprint,
    prefix: String,
    prev_rank: Option<u32>,
    current: Option<RoundInfo>,
    /// Writes `hb/<me>` every `keep_alive_interval` for the agent's lifetime (aborted on drop).
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// The members whose liveness this node checks, with their last heartbeat and how many checks it has
    /// not changed.
    neighbours: Vec<(String, Option<Vec<u8>>, u32)>,
    /// An event found while setting up the watch, delivered first.
    pending: Option<RdzvEvent>,
    /// The round counter's value when the current round started.
    round_raw: Vec<u8>,
    events: Option<mpsc::UnboundedReceiver<WatchEvent>>,
}

impl<S: Store> Rendezvous<S> {
    pub fn new(store: S, settings: Settings, me: NodeInfo, fingerprint: Fingerprint) -> Self {
        let prefix = format!("muster/{}/", settings.run_id);
        Rendezvous {
            store: Arc::new(store),
            heartbeat: None,
            neighbours: Vec::new(),
            settings,
            me,
            fingerprint,
            prefix,
            prev_rank: None,
            current: None,
            pending: None,
            round_raw: Vec::new(),
            events: None,
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub fn store(&self) -> &S {
        &self.store
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

    /// Leaves at once (a drained node): the liveness key goes, so the members watching it re-form now
    /// instead of after a heartbeat timeout.
    pub async fn leave(&mut self) -> Result<(), RdzvError> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        self.store.delete(&self.key(&format!("alive/{}", self.me.id))).await?;
        Ok(())
    }

    /// Registers liveness and checks the launch fingerprint. Call once before the first round.
    pub async fn register(&mut self) -> Result<(), RdzvError> {
        let mine = serde_json::to_vec(&self.fingerprint).map_err(|e| RdzvError::State(e.to_string()))?;
        let current = self.store.compare_set(&self.key("fingerprint"), b"", &mine).await?;
        if current != mine {
            let job: Fingerprint = serde_json::from_slice(&current)
                .map_err(|e| RdzvError::State(format!("unreadable job fingerprint: {e}")))?;
            let diff = self.fingerprint.differences(&job);
            if !diff.is_empty() {
                return Err(RdzvError::Mismatch(diff.join("; ")));
            }
        }
        self.store.set_session(&self.key(&format!("alive/{}", self.me.id)), b"1").await?;
        let (store, key, every) = (self.store.clone(), self.key(&format!("hb/{}", self.me.id)), self.settings.keep_alive_interval);
        let write_timeout = self.settings.heartbeat_timeout;
        self.heartbeat = Some(tokio::spawn(async move {
            let mut beat: u64 = 0;
            loop {
                beat += 1;
                match tokio::time::timeout(write_timeout, store.set(&key, beat.to_string().as_bytes())).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!("heartbeat write failed: {e}"),
                    Err(_) => tracing::warn!("heartbeat write took longer than heartbeat_timeout ({write_timeout:?})"),
                }
                tokio::time::sleep(every).await;
            }
        }));
        Ok(())
    }

    async fn closed(&self) -> Result<bool, RdzvError> {
        Ok(self.store.get(&self.key("closed")).await?.is_some())
    }

    /// The round counter: its raw value (for compare-and-set), the round, and how many nodes it expects.
    async fn read_round(&self) -> Result<(Vec<u8>, u64, Option<u32>), RdzvError> {
        let raw = self.store.get(&self.key("round")).await?.unwrap_or_default();
        let (round, expected) = parse_round(&raw);
        Ok((raw, round, expected))
    }

    /// Joins the next round and returns once it is sealed with this node in it.
    pub async fn next_round(&mut self) -> Result<RoundInfo, RdzvError> {
        let start = Instant::now();
        let deadline = start + self.settings.join_timeout;
        self.current = None;
        'rounds: loop {
            if self.closed().await? {
                return Err(RdzvError::Closed(self.settings.run_id.clone()));
            }
            let (raw, round, expected) = self.read_round().await?;
            // Again each round: a node evicted for missing heartbeats (stopped, not dead) rejoins as alive.
            self.store.set_session(&self.key(&format!("alive/{}", self.me.id)), b"1").await?;
            let slot = self.store.add(&self.key(&format!("r/{round}/slot")), 1).await?;
            let record = Record {
                node: self.me.clone(),
                slot,
                prev_rank: self.prev_rank,
                pref_rank: self.settings.node_rank,
            };
            let bytes = serde_json::to_vec(&record).map_err(|e| RdzvError::State(e.to_string()))?;
            self.store.set(&self.key(&format!("r/{round}/m/{slot}")), &bytes).await?;
            let sealed_key = self.key(&format!("r/{round}/sealed"));
            let min = i64::from(self.settings.min_nodes);
            let full = |joined: i64| {
                joined >= i64::from(self.settings.max_nodes) || expected.is_some_and(|e| joined >= i64::from(e) && joined >= min)
            };
            // The node that completes the round seals it at once; from MIN on, the last call starts. Until
            // the seal appears, a node that knows the round is due tries again every slice (the sealer may
            // have found a record not yet written, or died).
            let mut seal_due = full(slot);
            let mut last_call = (slot >= min).then(|| Instant::now() + self.settings.last_call_timeout);
            let mut polls = 0u32;
            loop {
                // Records still being written: look again in a moment rather than a whole slice.
                let mut soon = false;
                if seal_due {
                    let late = last_call.is_some_and(|t| Instant::now() >= t);
                    soon = self.try_seal(round, late).await? == SealAttempt::RecordsInFlight;
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(RdzvError::Timeout {
                        run_id: self.settings.run_id.clone(),
                        timeout: self.settings.join_timeout,
                        joined: self.store.add(&self.key(&format!("r/{round}/slot")), 0).await?,
                        min: self.settings.min_nodes,
                    });
                }
                // Sleep on the seal in slices of at most a second (heartbeats share the connection).
                let wake = last_call.unwrap_or(now + Duration::from_secs(1)).min(deadline);
                let cap = if soon { Duration::from_millis(20) } else { Duration::from_secs(1) };
                let slice = wake.saturating_duration_since(now).min(cap);
                if self.store.wait(&sealed_key, slice).await? {
                    let assignment = self.store.get(&self.key(&format!("r/{round}/a/{slot}"))).await?;
                    let Some(assignment) = assignment else {
                        self.wait_as_spare(round).await?;
                        continue 'rounds;
                    };
                    let info = RoundInfo::decode(round, &assignment)?;
                    let _ = self.store.delete(&self.key(&format!("waiting/{}", self.me.id))).await;
                    self.prev_rank = Some(info.group_rank);
                    self.round_raw = raw;
                    self.current = Some(info.clone());
                    self.watch_round(&info).await?;
                    tracing::debug!(round, ms = start.elapsed().as_millis() as u64, "rendezvous sealed");
                    return Ok(info);
                }
                polls += 1;
                let now = Instant::now();
                // Below MIN when this node joined: count the others (one cheap read per slice) until the last
                // call starts; a backup for the node that reached MIN, should it die before sealing.
                if last_call.is_none() {
                    let joined = self.store.add(&self.key(&format!("r/{round}/slot")), 0).await?;
                    if full(joined) {
                        seal_due = true;
                    } else if joined >= min {
                        last_call = Some(now + self.settings.last_call_timeout);
                    }
                }
                if last_call.is_some_and(|t| now >= t) {
                    seal_due = true;
                }
                if polls % 5 == 0 && self.read_round().await?.1 != round {
                    continue 'rounds;
                }
            }
        }
    }

    /// Watches what can end this round, at O(1) per node: the round counter, `closed`, the waiting list, and
    /// the liveness of the next two members in rank order (a ring: each member is watched by two others, and
    /// whoever sees a death opens the next round, which every member sees). Then re-reads them, so a change
    /// between the seal and the watch is not missed.
    async fn watch_round(&mut self, info: &RoundInfo) -> Result<(), RdzvError> {
        let neighbours = &info.neighbours;
        let mut targets = vec![
            WatchTarget::Key(self.key("round")),
            WatchTarget::Key(self.key("closed")),
            WatchTarget::Prefix(self.key("waiting/")),
        ];
        targets.extend(neighbours.iter().map(|m| WatchTarget::Key(self.key(&format!("alive/{}", m.id)))));
        self.events = Some(self.store.watch(&targets).await?);
        self.neighbours = neighbours.iter().map(|m| (m.id.clone(), None, 0)).collect();
        self.pending = None;
        for m in neighbours {
            if self.store.get(&self.key(&format!("alive/{}", m.id))).await?.is_none() {
                self.pending = Some(RdzvEvent::PeerLost(m.id.clone()));
            }
        }
        if self.read_round().await?.1 > info.round {
            self.pending = Some(RdzvEvent::RoundChanged);
        }
        if self.closed().await? {
            self.pending = Some(RdzvEvent::Closed);
        }
        Ok(())
    }

    /// `wait_key_in` on this node's store.
    async fn wait_key(&self, key: &str, timeout: Duration) -> Result<bool, RdzvError> {
        wait_key_in(&*self.store, key, timeout).await
    }

    /// Ids of the agents whose liveness key exists.
    async fn alive_nodes(&self) -> Result<HashSet<String>, RdzvError> {
        let keys = self.store.list(&self.key("alive/")).await?;
        Ok(keys.into_iter().filter_map(|k| k.rsplit('/').next().map(str::to_string)).collect())
    }

    /// Seals `round` if this node holds the sealer lock (`r/<R>/sealer` = the holder's id, taken by
    /// compare-and-set, taken over from a holder that is no longer alive). Before the last call has passed
    /// (`late`), it seals only once every slot taken has its record: a joiner between its slot and its record
    /// is not left out.
    async fn try_seal(&self, round: u64, late: bool) -> Result<SealAttempt, RdzvError> {
        let lock = self.key(&format!("r/{round}/sealer"));
        let me = self.me.id.as_bytes();
        let holder = self.store.compare_set(&lock, b"", me).await?;
        if holder != me {
            let id = String::from_utf8_lossy(&holder).into_owned();
            let holder_alive = self.store.get(&self.key(&format!("alive/{id}"))).await?.is_some();
            if holder.is_empty() || holder_alive || self.store.compare_set(&lock, &holder, me).await? != me {
                return Ok(SealAttempt::NotMine);
            }
        }
        let member_prefix = self.key(&format!("r/{round}/m/"));
        let keys = self.store.list(&member_prefix).await?;
        let joined = self.store.add(&self.key(&format!("r/{round}/slot")), 0).await?;
        if !late && (keys.len() as i64) < joined {
            self.store.compare_set(&lock, me, b"").await?;
            return Ok(SealAttempt::RecordsInFlight);
        }
        let alive = self.alive_nodes().await?;
        let values = self.store.multi_get(&keys).await?;
        let mut by_node: BTreeMap<String, Record> = BTreeMap::new();
        for v in values {
            let r: Record = serde_json::from_slice(&v).map_err(|e| RdzvError::State(format!("bad record: {e}")))?;
            if alive.contains(&r.node.id) || r.node.id == self.me.id {
                by_node.entry(r.node.id.clone()).or_insert(r);
            }
        }
        let ranked = assign_ranks(by_node.into_values().collect(), &self.settings)?;
        if ranked.len() < self.settings.min_nodes as usize {
            // Joiners died before the seal: release the lock and keep waiting for more.
            self.store.compare_set(&lock, me, b"").await?;
            return Ok(SealAttempt::TooFew);
        }
        let members: Vec<NodeInfo> = ranked.iter().map(|r| r.node.clone()).collect();
        let (n, world_size) = (members.len(), members.iter().map(|m| m.nproc).sum());
        let mut base_global_rank = 0;
        let mut assignments = Vec::with_capacity(n);
        for (rank, record) in ranked.iter().enumerate() {
            let neighbours = (1..n.min(3)).map(|d| members[(rank + d) % n].clone()).collect();
            let info = RoundInfo { round, group_rank: rank as u32, group_world_size: n as u32, base_global_rank, world_size, neighbours };
            assignments.push((self.key(&format!("r/{round}/a/{}", record.slot)), info.encode()));
            base_global_rank += record.node.nproc;
        }
        // Assignments first: a node woken by the seal reads its own at once.
        self.store.multi_set(&assignments).await?;
        self.store.set(&self.key(&format!("r/{round}/sealed")), &Seal { members }.encode()).await?;
        Ok(SealAttempt::Sealed)
    }

    /// Not in the sealed round: a spare until the members open the next one (no timeout while the job is at
    /// its maximum size, as torch's redundancy list).
    async fn wait_as_spare(&mut self, round: u64) -> Result<(), RdzvError> {
        self.store.set_session(&self.key(&format!("waiting/{}", self.me.id)), b"1").await?;
        let open = self.key(&format!("r/{}/open", round + 1));
        tracing::info!(round, "the round is full or already sealed; waiting for the next one");
        loop {
            if self.closed().await? {
                return Err(RdzvError::Closed(self.settings.run_id.clone()));
            }
            if self.store.wait(&open, Duration::from_secs(1)).await? {
                return Ok(());
            }
        }
    }

    /// Opens the round after the current one, expecting the members still alive plus the waiting joiners;
    /// idempotent across members (compare-and-set on the round counter).
    pub async fn open_next_round(&self) -> Result<(), RdzvError> {
        let Some(current) = &self.current else { return Ok(()) };
        let alive = self.alive_nodes().await?;
        let waiting = self.store.list(&self.key("waiting/")).await?.len();
        let seal = self.store.get(&self.key(&format!("r/{}/sealed", current.round))).await?.unwrap_or_default();
        let members = Seal::decode(&seal)?.members.iter().filter(|m| alive.contains(&m.id)).count();
        let expected = (members + waiting).min(self.settings.max_nodes as usize);
        let to = format!("{}/{expected}", current.round + 1);
        let key = self.key("round");
        self.store.compare_set(&key, &self.round_raw, to.as_bytes()).await?;
        if self.read_round().await?.1 > current.round {
            self.store.set(&self.key(&format!("r/{}/open", current.round + 1)), b"1").await?;
        }
        Ok(())
    }

    /// Waits for the next event that ends the running round. Joiners are batched for one last-call window,
    /// so a trickle of them costs one re-formation. Cancel-safe: events stay queued in the channel.
    pub async fn next_event(&mut self) -> Result<RdzvEvent, RdzvError> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        let Rendezvous { store, settings, me, prefix, current, events, neighbours, .. } = self;
        let Some(current) = current.as_ref() else {
            return Err(RdzvError::State("no round is running".into()));
        };
        let Some(events) = events.as_mut() else { return Err(RdzvError::StoreLost) };
        let members: HashSet<&str> = current.neighbours.iter().map(|m| m.id.as_str()).collect();
        let room = current.group_world_size < settings.max_nodes;
        let mut batch_until: Option<Instant> = None;
        let mut check = tokio::time::interval(settings.keep_alive_interval);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let batch = async {
                match batch_until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                e = events.recv() => e,
                () = batch => return Ok(RdzvEvent::JoinersWaiting),
                _ = check.tick() => {
                    // A neighbour whose heartbeat stopped (a hung or stopped agent, whose connection may
                    // stay open) is evicted: deleting its liveness key tells its other watcher too.
                    for (id, last, stale) in neighbours.iter_mut() {
                        let beat = store.get(&format!("{prefix}hb/{id}")).await?;
                        if beat.is_some() && beat == *last {
                            *stale += 1;
                        } else {
                            *stale = 0;
                            *last = beat;
                        }
                        if *stale >= settings.keep_alive_max_attempt {
                            tracing::warn!(node = %id, "no heartbeat for {} checks; evicting it", *stale);
                            store.delete(&format!("{prefix}alive/{id}")).await?;
                            return Ok(RdzvEvent::PeerLost(id.clone()));
                        }
                    }
                    continue;
                }
            };
            let Some(event) = event else { return Err(RdzvError::StoreLost) };
            let Some(rest) = event.key.strip_prefix(prefix.as_str()) else { continue };
            match (event.kind, rest.split_once('/')) {
                (WatchEventKind::Deleted, Some(("alive", node))) if members.contains(node) && node != me.id => {
                    return Ok(RdzvEvent::PeerLost(node.to_string()));
                }
                (WatchEventKind::Written, Some(("waiting", _))) if room && batch_until.is_none() => {
                    batch_until = Some(Instant::now() + settings.last_call_timeout);
                }
                (WatchEventKind::Written, None) if rest == "round" => {
                    let raw = store.get(&format!("{prefix}round")).await?.unwrap_or_default();
                    if parse_round(&raw).0 > current.round {
                        return Ok(RdzvEvent::RoundChanged);
                    }
                }
                (WatchEventKind::Written, None) if rest == "closed" => return Ok(RdzvEvent::Closed),
                _ => {}
            }
        }
    }

    /// Publishes a value for the current round (e.g. the workers' MASTER_ADDR:PORT from group rank 0).
    pub async fn publish(&self, name: &str, value: &[u8]) -> Result<(), RdzvError> {
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        Ok(self.store.set(&self.key(&format!("r/{round}/{name}")), value).await?)
    }

    /// Waits up to `timeout` for a value group rank 0 publishes for the current round, or for a membership
    /// event, whichever comes first: group rank 0 may die (or the round change) before it publishes, and
    /// then the others must re-form rather than wait out the timeout.
    pub async fn wait_published(&mut self, name: &str, timeout: Duration) -> Result<Published, RdzvError> {
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        let key = self.key(&format!("r/{round}/{name}"));
        let store = self.store.clone();
        let published = async {
            if !wait_key_in(&*store, &key, timeout).await? {
                return Err(RdzvError::State(format!("group rank 0 did not publish '{name}' within {timeout:?}")));
            }
            store.get(&key).await?.ok_or_else(|| RdzvError::State(format!("'{name}' vanished")))
        };
        tokio::select! {
            value = published => value.map(Published::Value),
            event = self.next_event() => event.map(Published::Changed),
        }
    }

    /// Waits (bounded) until every member of the round has finished, so the node hosting the store outlives
    /// the others' last use of it. Errors are the caller's to log, not fatal.
    pub async fn exit_barrier(&self) -> Result<(), RdzvError> {
        let Some(current) = &self.current else { return Ok(()) };
        let done = self.store.add(&self.key(&format!("r/{}/done", current.round)), 1).await?;
        let all = self.key(&format!("r/{}/done_all", current.round));
        if done >= i64::from(current.group_world_size) {
            self.store.set(&all, b"1").await?;
        }
        if !self.wait_key(&all, self.settings.exit_barrier_timeout).await? {
            return Err(RdzvError::State(format!(
                "exit barrier: not every node finished within {:?}",
                self.settings.exit_barrier_timeout
            )));
        }
        Ok(())
    }

    /// Marks the job closed: nodes still joining or waiting give up.
    pub async fn close(&self) -> Result<(), RdzvError> {
        Ok(self.store.set(&self.key("closed"), b"1").await?)
    }
}

#[cfg(test)]
mod tests;
