//! Joining a round and sealing it: slots, records, the sealer lock, rank assignment, spares, and opening
//! the next round.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::wire::{Closure, Record, RoundInfo, Seal};
use super::{NodeInfo, RdzvError, Rendezvous, Settings};
use crate::store::{Store, WatchEvent, WatchEventKind, WatchTarget};

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

/// Orders the live joiners of a round into group ranks (pure; see the module docs).
pub(super) fn assign_ranks(mut records: Vec<Record>, settings: &Settings) -> Result<Vec<Record>, RdzvError> {
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
        let latest = records.iter().filter(|r| r.prev_rank.is_some()).map(|r| r.prev_round).max().flatten();
        records.sort_by_key(|r| {
            let stayed = r.prev_rank.is_some() && r.prev_round == latest;
            (!stayed, stayed.then_some(r.prev_rank), r.pref_rank.unwrap_or(u32::MAX), r.slot)
        });
    }
    records.truncate(settings.max_nodes as usize);
    Ok(records)
}


/// How often a joiner whose round is not sealed looks again, for what no watch tells it: below MIN, how many
/// others joined; once the round is due, whether the sealer died; and whether the round counter moved on.
/// All three are backups for a node that died at the wrong moment: the node that completes the round, or
/// sees its last call end, seals it without anyone looking. The seal itself comes by a watch kept open
/// across the looks ([`SealWatch`]).
const JOIN_CHECK: Duration = Duration::from_secs(1);

/// How often each joiner of a round of up to `max_nodes` looks again: [`JOIN_CHECK`], and 4 ms more a node
/// past the 250th, so that a whole job's looks cost the store about 250 a second (a look is one read of three
/// keys) however many nodes join. Looks that grew with the round's length instead (a look a second each)
/// fed themselves at thousands of nodes: the looks slowed the store, the round took longer, and every
/// joiner looked more often. At most [`JOIN_CHECK_MAX`]: how late a backup may come at any size. Scaled by
/// 0.5 + `jitter` (in [0, 1)): joiners that joined together do not look together.
fn join_check(max_nodes: u32, jitter: f64) -> Duration {
    let base = JOIN_CHECK.max(Duration::from_millis(4 * u64::from(max_nodes))).min(JOIN_CHECK_MAX);
    base.mul_f64(0.5 + jitter.clamp(0.0, 1.0))
}

const JOIN_CHECK_MAX: Duration = Duration::from_secs(60);

/// The slot this node holds in a round, and when it sent the record there (the round was not sealed yet:
/// the sealer reads every member's record).
#[derive(Debug, Clone, Copy)]
struct Taken {
    round: u64,
    slot: i64,
    recorded_at: Instant,
}

/// A joiner's watch of its round's seal, open across its looks: a wait of its own at each look would cost
/// the API server a list and a watch (a connection: kube-rs speaks HTTP/1.1), and etcd a watch, each time.
struct SealWatch {
    key: String,
    /// None: not open yet, or ended (the store went away): opened again at the next look.
    events: Option<UnboundedReceiver<WatchEvent>>,
}

impl SealWatch {
    /// Whether the seal is written by `until` (or was already when the watch opened).
    async fn written_by<S: Store>(&mut self, store: &S, until: Instant) -> Result<bool, RdzvError> {
        let events = match &mut self.events {
            Some(events) => events,
            None => {
                let events = self.events.insert(store.watch(&[WatchTarget::Key(self.key.clone())]).await?);
                // Written before the watch began: no event will say so.
                if store.get(&self.key).await?.is_some() {
                    return Ok(true);
                }
                events
            }
        };
        loop {
            match tokio::time::timeout_at(until, events.recv()).await {
                Err(_) => return Ok(false),
                Ok(Some(e)) if e.kind == WatchEventKind::Written && e.key == self.key => return Ok(true),
                Ok(Some(_)) => {}
                Ok(None) => {
                    // As a wait that timed out: the look after it finds whether the store is back.
                    self.events = None;
                    tokio::time::sleep_until(until).await;
                    return Ok(false);
                }
            }
        }
    }
}

/// A spare's wait for the next round or the job's end, re-armed: it has no deadline while the job runs at its
/// maximum size, but every store wait needs one.
const SPARE_WAIT: Duration = Duration::from_secs(3600);

/// How a join of one round ended.
enum Joined {
    /// In the sealed round. `unsealed_at`: a moment this node knows the round was not yet sealed (no other
    /// member watches it from before then); `asked_at`: when the request that read its assignment, answered,
    /// was sent.
    Member { info: RoundInfo, unsealed_at: Instant, asked_at: Instant },
    /// Sealed without this node: wait as a spare for the next round.
    Spare,
    /// The round counter moved on before the seal: join the new round.
    Moved,
}

impl<S: Store> Rendezvous<S> {
    /// Joins the next round and returns once it is sealed with this node in it. A store that restarted or
    /// was unreachable meanwhile makes it join again (in the new store, or with the slot it had taken in
    /// the same one), within `join_timeout` of the first error.
    pub async fn next_round(&mut self) -> Result<RoundInfo, RdzvError> {
        let give_up = self.give_up_at();
        let info = super::within(give_up, self.join_rounds()).await?;
        self.fenced_at = None;
        Ok(info)
    }

    async fn join_rounds(&mut self) -> Result<RoundInfo, RdzvError> {
        let start = Instant::now();
        let deadline = start + self.settings.join_timeout;
        self.current = None;
        // Nobody watches a joiner's beats: none are written until the round is sealed.
        self.in_round.send_replace(false);
        let mut retry = self.retry("joining");
        let mut taken = None;
        let mut reconnected = false;
        loop {
            match self.join_once(deadline, &mut taken, reconnected).await {
                Ok(Some(info)) => {
                    tracing::debug!(round = info.round, ms = start.elapsed().as_millis() as u64, "rendezvous sealed");
                    return Ok(info);
                }
                Ok(None) => {
                    retry.reset();
                    reconnected = false;
                }
                Err(e) => {
                    // The link the fence judges is the join's while no beat runs (`Link::joined`).
                    if super::retry::is_connection_error(&e) {
                        self.link.lock().fail();
                    }
                    retry.after(e).await?;
                    reconnected = true;
                }
            }
        }
    }

    /// One try at joining: Some(round) once sealed with this node in it; None when the round moved on or a
    /// spare's wait ended (join the next one). `taken`: the slot this node holds, kept across tries.
    /// `reconnected`: the last try failed on the connection, so the store may be a restarted one that lost
    /// the launch fingerprint.
    async fn join_once(&mut self, deadline: Instant, taken: &mut Option<Taken>, reconnected: bool) -> Result<Option<RoundInfo>, RdzvError> {
        if reconnected {
            self.alive_fresh = false;
            self.publish_fingerprint().await?;
        }
        let mut read = self.read_keys(&["closed".into(), "round".into()]).await?.into_iter();
        if let Some(closure) = self.closure_in(read.next().flatten()).await {
            return Err(closure.error(&self.settings.run_id));
        }
        self.refuse_a_lemon().await?;
        let (raw, round, expected) = super::round_counter(read.next().flatten());
        let held = match *taken {
            Some(held) if held.round == round && self.holds_slot(round, held.slot).await? => held,
            _ => {
                let recorded_at = Instant::now();
                Taken { round, slot: self.take_slot(round).await?, recorded_at }
            }
        };
        *taken = Some(held);
        match self.await_seal(held, expected, deadline).await? {
            Joined::Member { info, unsealed_at, asked_at } => {
                self.link.lock().joined(unsealed_at, asked_at);
                self.in_round.send_replace(true);
                // A write to the store's log: only when there is something to delete.
                if std::mem::take(&mut self.listed_waiting) {
                    let _ = self.store.delete(&self.key(&format!("waiting/{}", self.me.id))).await;
                }
                self.watch_round(&info).await?;
                self.prev = Some((info.round, info.group_rank));
                self.round_raw = raw;
                self.current = Some(info.clone());
                Ok(Some(info))
            }
            Joined::Spare => {
                *taken = None;
                self.wait_as_spare(round).await?;
                Ok(None)
            }
            Joined::Moved => {
                *taken = None;
                Ok(None)
            }
        }
    }

    /// Whether this node's record is still in `slot` of `round` (the connection failed, the store did not
    /// restart): then the node keeps its slot rather than joining twice.
    async fn holds_slot(&self, round: u64, slot: i64) -> Result<bool, RdzvError> {
        let Some(bytes) = self.store.get(&self.key(&format!("r/{round}/m/{slot}"))).await? else { return Ok(false) };
        Ok(serde_json::from_slice::<Record>(&bytes).is_ok_and(|r| r.node.id == self.me.id))
    }

    /// Takes a slot in `round` and writes this node's record there.
    async fn take_slot(&mut self, round: u64) -> Result<i64, RdzvError> {
        // Again each round: a node evicted for missing heartbeats (stopped, not dead) rejoins as alive.
        if !std::mem::take(&mut self.alive_fresh) {
            self.store.set_session(&self.key(&format!("alive/{}", self.me.id)), b"1").await?;
        }
        let slot = self.store.add(&self.key(&format!("r/{round}/slot")), 1).await?;
        let record = Record {
            node: self.me.clone(),
            slot,
            prev_rank: self.prev.map(|(_, rank)| rank),
            prev_round: self.prev.map(|(round, _)| round),
            pref_rank: self.settings.node_rank,
            restarts: Some(self.restarts),
            in_place: Some(self.in_place),
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| RdzvError::State(e.to_string()))?;
        self.store.set(&self.key(&format!("r/{round}/m/{slot}")), &bytes).await?;
        Ok(slot)
    }

    /// Waits for `round`'s seal, sealing it when it is due. The node that completes the round (MAX, or the
    /// `expected` of a re-formation) seals it at once; from MIN on, the last call starts, and whoever sees it
    /// end seals.
    async fn await_seal(&self, taken: Taken, expected: Option<u32>, deadline: Instant) -> Result<Joined, RdzvError> {
        let Taken { round, slot, recorded_at } = taken;
        let mut unsealed_at = recorded_at;
        let mut seal = SealWatch { key: self.key(&format!("r/{round}/sealed")), events: None };
        let min = i64::from(self.settings.min_nodes);
        // Lowered by a node that leaves the round it was expected in (`shrink_open_round`).
        let mut expected = expected;
        let mut seal_due = self.full(slot, expected);
        // A leaving node lowers the count, then reads the slots taken; this node read the count, then took
        // its slot. Looking at the count once more after the slot, one of the two sees the other: otherwise
        // a shrink between this node's read and its slot would leave it waiting out the whole last call.
        if expected.is_some() && !seal_due {
            let (_, now_round, now_expected) = super::round_counter(self.store.get(&self.key("round")).await?);
            if now_round != round {
                return Ok(Joined::Moved);
            }
            expected = now_expected;
            seal_due = self.full(slot, expected);
        }
        let mut last_call = (slot >= min).then(|| Instant::now() + self.settings.last_call_timeout);
        // The sealer lock's holder at the last look (empty: none seen).
        let mut holder = Vec::new();
        let look = [String::from("round"), format!("r/{round}/slot"), format!("r/{round}/sealer")];
        // Records still being written: look again in a moment rather than a whole check period, a moment
        // twice as long each time (each look lists every record: at thousands of nodes, not every 20 ms).
        let mut in_flight = 0u32;
        loop {
            let mut soon = None;
            if seal_due {
                let late = last_call.is_some_and(|t| Instant::now() >= t);
                if self.try_seal(round, late, &holder, expected).await? == SealAttempt::RecordsInFlight {
                    soon = Some(Duration::from_millis(20 << in_flight.min(5)));
                    in_flight += 1;
                }
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
            // During the last call nothing needs checking before its end: a joiner that completes the round
            // seals it itself.
            let wake = match (last_call, soon) {
                (Some(t), _) if t > now && !seal_due => t,
                (_, Some(moment)) => now + moment,
                _ => now + join_check(self.settings.max_nodes, super::retry::jitter(now)),
            };
            if seal.written_by(&*self.store, wake.min(deadline)).await? {
                let asked_at = Instant::now();
                return match self.store.get(&self.key(&format!("r/{round}/a/{slot}"))).await? {
                    Some(assignment) => Ok(Joined::Member { info: RoundInfo::decode(round, &assignment)?, unsealed_at, asked_at }),
                    None => Ok(Joined::Spare),
                };
            }
            // The wait read the key absent after it began.
            unsealed_at = now;
            let mut read = self.read_keys(&look).await?.into_iter();
            let (_, now_round, now_expected) = super::round_counter(read.next().flatten());
            if now_round != round {
                return Ok(Joined::Moved);
            }
            expected = now_expected;
            let joined = read.next().flatten().map_or(Ok(0), |v| slots_taken(&v))?;
            holder = read.next().flatten().unwrap_or_default();
            let now = Instant::now();
            // Below MIN when this node joined: count the others until the last call starts; a backup for the
            // node that reached MIN, should it die before sealing.
            if self.full(joined, expected) {
                seal_due = true;
            } else if last_call.is_none() && joined >= min {
                last_call = Some(now + self.settings.last_call_timeout);
            }
            if last_call.is_some_and(|t| now >= t) {
                seal_due = true;
            }
        }
    }

    /// Whether `joined` nodes complete a round: MAX, or the `expected` of a re-formation (and MIN).
    fn full(&self, joined: i64, expected: Option<u32>) -> bool {
        let min = i64::from(self.settings.min_nodes);
        joined >= i64::from(self.settings.max_nodes) || expected.is_some_and(|e| joined >= i64::from(e) && joined >= min)
    }

    /// Seals `round` if this node holds the sealer lock (`r/<R>/sealer` = the holder's id, taken by
    /// compare-and-set, taken over from a holder that is no longer alive). Before the last call has passed
    /// (`late`), it seals only once every slot taken has its record: a joiner between its slot and its record
    /// is not left out. `seen`: the holder a look found (empty: none), asked after before anything is
    /// written: while a live holder seals, a compare-and-set would cost etcd a write to its log for nothing.
    async fn try_seal(&self, round: u64, late: bool, seen: &[u8], expected: Option<u32>) -> Result<SealAttempt, RdzvError> {
        let lock = self.key(&format!("r/{round}/sealer"));
        let me = self.me.id.as_bytes();
        let holder = match seen {
            [] => self.store.compare_set(&lock, b"", me).await?,
            seen => seen.to_vec(),
        };
        if holder != me {
            let id = String::from_utf8_lossy(&holder).into_owned();
            let holder_alive = self.store.get(&self.key(&format!("alive/{id}"))).await?.is_some();
            if holder.is_empty() || holder_alive || self.store.compare_set(&lock, &holder, me).await? != me {
                return Ok(SealAttempt::NotMine);
            }
        }
        // Three reads, sent together: at thousands of nodes each is a round trip to a busy member.
        let (records_key, slot_key) = (self.key(&format!("r/{round}/m/")), self.key(&format!("r/{round}/slot")));
        let (records, joined, alive) = tokio::try_join!(
            async { Ok(self.store.scan(&records_key).await?) },
            async { Ok(self.store.add(&slot_key, 0).await?) },
            self.alive_nodes(),
        )?;
        let written = records.len() as i64;
        let by_node = latest_records(records, |id| alive.contains(id) || id == self.me.id)?;
        // A slot without its record yet is waited for, unless the round is complete without it: a joiner
        // whose slot's reply was lost took another one, and its first would hold the seal to the last call.
        if !late && written < joined && !self.full(by_node.len() as i64, expected) {
            self.store.compare_set(&lock, me, b"").await?;
            return Ok(SealAttempt::RecordsInFlight);
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
        // Assignments and the members first: a node woken by the seal reads its own at once. The seal itself
        // is a few bytes: every joiner waits for it, and etcd sends each waiter the value with the event (the
        // members of 4096 nodes to each of them: half a gigabyte).
        self.store.multi_set(&assignments).await?;
        self.store.set(&self.key(&format!("r/{round}/members")), &Seal { members }.encode()).await?;
        self.store.set(&self.key(&format!("r/{round}/sealed")), n.to_string().as_bytes()).await?;
        Ok(SealAttempt::Sealed)
    }

    /// Not in the sealed round: a spare until the members open the next one (no timeout while the job is at
    /// its maximum size, as torch's redundancy list) or the job closes.
    async fn wait_as_spare(&mut self, round: u64) -> Result<(), RdzvError> {
        // The round it was left out of: once a later round lets it in, a key it has not deleted yet is stale.
        self.listed_waiting = true;
        self.store.set_session(&self.key(&format!("waiting/{}", self.me.id)), round.to_string().as_bytes()).await?;
        let (open, closed) = (self.key(&format!("r/{}/open", round + 1)), self.key("closed"));
        tracing::info!(round, "the round is full or already sealed; waiting for the next one");
        loop {
            // Two waits, each on its own connection; the one that loses is dropped with its connection.
            tokio::select! {
                opened = self.store.wait(&open, SPARE_WAIT) => if opened? {
                    return Ok(());
                },
                ended = self.store.wait(&closed, SPARE_WAIT) => if ended? {
                    let closure = self.closure().await?.unwrap_or(Closure::Finished);
                    return Err(closure.error(&self.settings.run_id));
                },
            }
        }
    }

    /// How many spares wait for a round after `round`: those left out of `round` or a later one. A spare let
    /// into `round` deletes its key only once it has read its assignment; until then its key names an
    /// earlier round, and counting it would make the members re-form at once for a joiner already in.
    pub(super) async fn waiting_after(&self, round: u64) -> Result<usize, RdzvError> {
        let spares = self.store.scan(&self.key("waiting/")).await?;
        // A value that is not a round (an older agent's) counts: a spare too many costs a last call at most.
        let waits = |v: &[u8]| std::str::from_utf8(v).ok().and_then(|t| t.parse::<u64>().ok()).is_none_or(|left_out| left_out >= round);
        Ok(spares.iter().filter(|(_, v)| waits(v)).count())
    }

    /// Opens the round after the current one, expecting the members still alive plus the waiting joiners;
    /// idempotent across members (compare-and-set on the round counter), so it is tried again while the
    /// store does not answer (within `join_timeout`).
    pub async fn open_next_round(&self) -> Result<(), RdzvError> {
        super::within(self.give_up_at(), self.open_with_retries()).await
    }

    async fn open_with_retries(&self) -> Result<(), RdzvError> {
        let mut retry = self.retry("opening the next round");
        loop {
            match self.try_open_next_round().await {
                Err(e) => retry.after(e).await?,
                done => return done,
            }
        }
    }

    async fn try_open_next_round(&self) -> Result<(), RdzvError> {
        let Some(current) = &self.current else { return Ok(()) };
        let Some(seal) = self.store.get(&self.key(&format!("r/{}/members", current.round))).await? else {
            // A restarted store lost the round: there is nothing to open, the join finds what the store has.
            tracing::info!("the rendezvous store no longer has round {} (restarted?); joining afresh", current.round);
            return Ok(());
        };
        let alive = self.alive_nodes().await?;
        let waiting = self.waiting_after(current.round).await?;
        let members = Seal::decode(&seal)?.members.iter().filter(|m| alive.contains(&m.id)).count();
        let expected = (members + waiting).min(self.settings.max_nodes as usize);
        let to = format!("{}/{expected}", current.round + 1);
        let key = self.key("round");
        self.store.compare_set(&key, &self.round_raw, to.as_bytes()).await?;
        if self.read_round().await?.1 > current.round {
            // Every member opens it: written once, the others' compare-and-set finds it (N overwrites of one
            // object at once cost the API server about N² attempts).
            self.store.compare_set(&self.key(&format!("r/{}/open", current.round + 1)), b"", b"1").await?;
        }
        Ok(())
    }

    /// This node leaves (a drain): a round opened after the last one it was in, still unsealed, counted it
    /// in its expected nodes (`counter`, read while this node was alive); it now expects one fewer, and is
    /// sealed here if every other node expected is in. The survivors know who is alive: a shrink waits for
    /// no last call, whatever way the node left. A later joiner makes a re-formation of its own. A counter
    /// moved since it was read (the others opened a round without this node) is left as it is.
    pub(super) async fn shrink_open_round(&self, counter: super::RoundCounter) -> Result<(), RdzvError> {
        let (raw, round, expected) = counter;
        let (Some(expected), Some((was_in, _))) = (expected, self.prev) else { return Ok(()) };
        if round <= was_in || expected <= 1 || self.store.get(&self.key(&format!("r/{round}/sealed"))).await?.is_some() {
            return Ok(());
        }
        let fewer = expected - 1;
        let to = format!("{round}/{fewer}");
        if self.store.compare_set(&self.key("round"), &raw, to.as_bytes()).await? != to.as_bytes() {
            return Ok(());
        }
        let joined = self.store.add(&self.key(&format!("r/{round}/slot")), 0).await?;
        if self.full(joined, Some(fewer)) {
            self.try_seal(round, false, &[], Some(fewer)).await?;
        }
        Ok(())
    }
}

/// The records of the nodes that `counts`, by node id: a node's latest slot, the one it waits with (it
/// takes another only when the reply for its last one was lost).
pub(super) fn latest_records(records: Vec<(String, Vec<u8>)>, counts: impl Fn(&str) -> bool) -> Result<BTreeMap<String, Record>, RdzvError> {
    let mut by_node: BTreeMap<String, Record> = BTreeMap::new();
    for (_, v) in records {
        let r: Record = serde_json::from_slice(&v).map_err(|e| RdzvError::State(format!("bad record: {e}")))?;
        if counts(&r.node.id) && by_node.get(&r.node.id).is_none_or(|kept| kept.slot < r.slot) {
            by_node.insert(r.node.id.clone(), r);
        }
    }
    Ok(by_node)
}

/// The count a slot counter's value says.
fn slots_taken(value: &[u8]) -> Result<i64, RdzvError> {
    let text = std::str::from_utf8(value).ok().map(str::trim);
    text.and_then(|t| t.parse().ok()).ok_or_else(|| RdzvError::State(format!("unreadable slot count {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joiner_looks_again_less_often_the_more_nodes_may_join() {
        for (max, ms) in [(1, 1000), (250, 1000), (256, 1024), (1024, 4096), (4096, 16384), (15_000, 60_000), (u32::MAX, 60_000)] {
            assert_eq!(join_check(max, 0.5), Duration::from_millis(ms), "--nnodes ..{max}");
        }
        assert_eq!(join_check(1024, 0.0), Duration::from_millis(2048), "spread by the jitter");
        assert_eq!(join_check(1024, 7.0), Duration::from_millis(6144), "at most one and a half times");
    }

    #[test]
    fn a_node_with_two_slots_counts_once_with_its_latest() {
        let record = |id: &str, slot: i64| {
            let node = NodeInfo { id: id.into(), addr: "h".into(), nproc: 1 };
            let r = Record { node, slot, prev_rank: None, prev_round: None, pref_rank: None, restarts: None, in_place: None };
            (format!("r/0/m/{slot}"), serde_json::to_vec(&r).expect("json"))
        };
        // Lexical order, as etcd lists them: 10 before 9.
        let records = vec![record("a", 10), record("b", 2), record("a", 9), record("gone", 3)];
        let kept = latest_records(records, |id| id != "gone").expect("records");
        let slots: Vec<(&str, i64)> = kept.values().map(|r| (r.node.id.as_str(), r.slot)).collect();
        assert_eq!(slots, [("a", 10), ("b", 2)]);
        assert!(latest_records(vec![("r/0/m/1".into(), b"{".to_vec())], |_| true).is_err());
    }

    #[test]
    fn a_slot_count_reads_as_its_text() {
        assert_eq!(slots_taken(b"42").ok(), Some(42));
        assert_eq!(slots_taken(b" 7\n").ok(), Some(7));
        assert!(slots_taken(b"x").is_err());
    }
}
