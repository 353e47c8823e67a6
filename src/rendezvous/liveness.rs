//! Liveness: the session key and heartbeats of this agent, the watch on what can end a round, the events
//! it yields, and leaving.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::fence::{cut_off, Link, SharedLink, Timing};
use super::wire::{Fingerprint, Heartbeat, RoundInfo, Seal};
use super::retry::{is_connection_error, OnRefusal};
use super::pace::PaceNote;
use super::{BeatNote, Published, RdzvError, RdzvEvent, Rendezvous};
use crate::store::{Store, StoreError, WatchEventKind, WatchTarget};

impl<S: Store> Rendezvous<S> {
    /// Leaves at once (a drained node): the liveness key goes, so the members watching it re-form now
    /// instead of after a heartbeat timeout; a round already opened expecting this node expects one node
    /// fewer (`shrink_open_round`), so its joiners wait for no last call.
    pub async fn leave(&mut self) -> Result<(), RdzvError> {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        // Read while this node is still alive: a round opened before its key goes counted it.
        let counter = self.read_round().await?;
        self.store.delete(&self.key(&format!("alive/{}", self.me.id))).await?;
        self.shrink_open_round(counter).await
    }

    /// Registers liveness and checks the launch fingerprint, then starts the heartbeat task. Call once
    /// before the first round.
    pub async fn register(&mut self) -> Result<(), RdzvError> {
        self.publish_fingerprint().await?;
        self.store.set_session(&self.key(&format!("alive/{}", self.me.id)), b"1").await?;
        self.alive_fresh = true;
        *self.link.lock() = Link::new(Instant::now(), &self.timing);
        let key = self.key(&format!("hb/{}", self.me.id));
        let beat = Beat { key, interval: self.settings.keep_alive_interval, note: self.note.clone(), pace: self.pace.clone() };
        let task = heartbeats(self.store.clone(), beat, self.link.clone(), self.timing, self.in_round.subscribe());
        self.heartbeat = Some(tokio::spawn(task));
        Ok(())
    }

    /// Publishes this launch's fingerprint, or checks it against the job's (a store restarted under a
    /// running job gets it again from whoever re-forms first).
    pub(super) async fn publish_fingerprint(&self) -> Result<(), RdzvError> {
        let mine = serde_json::to_vec(&self.fingerprint).map_err(|e| RdzvError::State(e.to_string()))?;
        // Read first: every node but the first finds it there, and a read costs etcd no write to its log.
        let current = match self.store.get(&self.key("fingerprint")).await? {
            Some(current) if !current.is_empty() => current,
            _ => self.store.compare_set(&self.key("fingerprint"), b"", &mine).await?,
        };
        if current != mine {
            let job: Fingerprint = serde_json::from_slice(&current)
                .map_err(|e| RdzvError::State(format!("unreadable job fingerprint: {e}")))?;
            let diff = self.fingerprint.differences(&job);
            if !diff.is_empty() {
                return Err(RdzvError::Mismatch(diff.join("; ")));
            }
        }
        Ok(())
    }

    /// Watches what can end this round, at O(1) per node: the round counter, `closed`, the waiting list
    /// (while the group has room for a joiner: a full one lets none in), and the liveness keys and heartbeats
    /// of the next two members in rank order (a ring: each member is watched by two others, and whoever sees
    /// a death opens the next round, which every member sees). Then re-reads them, so a change between the
    /// seal and the watch is not missed. A heartbeat is heard as its watch event: checking the neighbours
    /// costs the store no request.
    pub(super) async fn watch_round(&mut self, info: &RoundInfo) -> Result<(), RdzvError> {
        let neighbours = &info.neighbours;
        let mut targets = vec![WatchTarget::Key(self.key("round")), WatchTarget::Key(self.key("closed"))];
        if self.has_room(info) {
            targets.push(WatchTarget::Prefix(self.key("waiting/")));
        }
        targets.extend(neighbours.iter().map(|m| WatchTarget::Key(self.key(&format!("alive/{}", m.id)))));
        targets.extend(neighbours.iter().map(|m| WatchTarget::Key(self.key(&format!("hb/{}", m.id)))));
        self.events = Some(self.store.watch(&targets).await?);
        // Heard at the start: the count of silent checks starts with the first check.
        self.neighbours = neighbours.iter().map(|m| (m.id.clone(), true, 0)).collect();
        self.pending = None;
        self.batch_until = None;
        self.next_check = None;
        self.joiner_arrived(info).await?;
        let mut names = vec!["round".to_string(), "closed".to_string()];
        names.extend(neighbours.iter().map(|m| format!("alive/{}", m.id)));
        let learn = self.store_host_unknown();
        if learn {
            names.push(super::ending::STORE_HOST.to_string());
        }
        let mut read = self.read_keys(&names).await?.into_iter();
        let (round, closed) = (read.next().flatten(), read.next().flatten());
        // Judged as a deletion heard on the watch: a watch made again after the store came back (a frozen
        // etcd revokes every lease when it resumes) gives the neighbour a window to register again.
        for m in neighbours {
            if read.next().flatten().is_none() {
                if let Some(lost) = self.peer_deleted(&m.id) {
                    self.pending = Some(lost);
                }
            }
        }
        if learn {
            self.learn_store_host(read.next().flatten());
        }
        if super::round_counter(round).1 > info.round {
            self.pending = Some(RdzvEvent::RoundChanged);
        }
        if let Some(closure) = self.closure_in(closed).await {
            self.pending = Some(RdzvEvent::Closed(closure));
        }
        Ok(())
    }

    /// Ids of the agents whose liveness key exists.
    pub(super) async fn alive_nodes(&self) -> Result<HashSet<String>, RdzvError> {
        let keys = self.store.list(&self.key("alive/")).await?;
        Ok(keys.into_iter().filter_map(|k| k.rsplit('/').next().map(str::to_string)).collect())
    }

    /// Waits for the next event that ends the running round. Joiners are batched for one last-call window,
    /// so a trickle of them costs one re-formation, unless they fill the group to MAX: then there is nothing
    /// to wait for. A store that stops answering (its connection failed, or a request in flight did) is
    /// waited for as [`Self::after_store_lost`] says, while this node's link is watched: cut off from the
    /// store for longer than the fence allows, it is [`RdzvEvent::Fenced`] (see `fence.rs`). Cancel-safe:
    /// events stay queued in the channel, and the batch deadline, heartbeat checks and suspects are kept
    /// across calls.
    pub async fn next_event(&mut self) -> Result<RdzvEvent, RdzvError> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        let Some(current) = self.current.clone() else {
            return Err(RdzvError::State("no round is running".into()));
        };
        let cut = cut_off(self.link.clone(), self.store.clone(), self.timing);
        let watched = async {
            loop {
                let found = match self.poll_event(&current).await {
                    Err(e) if is_connection_error(&e) => {
                        tracing::debug!("the rendezvous store failed a request while watching the round: {e}");
                        self.after_store_lost(&current).await
                    }
                    found => found,
                };
                if let Some(event) = found? {
                    return Ok(event);
                }
            }
        };
        let link = tokio::select! {
            link = cut => link,
            event = watched => return event,
        };
        self.fenced_at.get_or_insert(link.fenced_from(&self.timing));
        let silent = link.beat_acked.elapsed();
        tracing::warn!(
            "this node cannot reach the rendezvous store (no answer for {silent:?}, no network path to its host): \
             fenced; its workers are stopped before the others can evict it ({:?} after its last heartbeat); it \
             rejoins as a newcomer if the store answers within {:?}, else exits",
            self.timing.window,
            self.settings.store_timeout
        );
        Ok(RdzvEvent::Fenced { silent })
    }

    /// One wake-up of `next_event`: the event it found, if any.
    async fn poll_event(&mut self, current: &RoundInfo) -> Result<Option<RdzvEvent>, RdzvError> {
        let Some(events) = self.events.as_mut() else { return Err(RdzvError::StoreLost) };
        let check_at = *self.next_check.get_or_insert_with(Instant::now);
        let batch = async {
            match self.batch_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let judge = async {
            match self.suspects.iter().map(|(_, at)| *at).min() {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let event = tokio::select! {
            e = events.recv() => e,
            () = batch => {
                self.batch_until = None;
                return Ok(Some(RdzvEvent::JoinersWaiting));
            }
            () = tokio::time::sleep_until(check_at) => {
                self.next_check = Some(Instant::now() + self.settings.keep_alive_interval);
                return Ok(self.evict_stale_neighbour().await?.map(RdzvEvent::PeerLost));
            }
            () = judge => return Ok(self.judge_suspects().await?.map(RdzvEvent::PeerLost)),
        };
        let Some(event) = event else { return self.after_store_lost(current).await };
        let Some(rest) = event.key.strip_prefix(self.prefix.as_str()) else { return Ok(None) };
        let member = |node: &str| current.neighbours.iter().any(|m| m.id == node);
        match (event.kind, rest.split_once('/')) {
            (WatchEventKind::Deleted, Some(("alive", node))) if member(node) && node != self.me.id => {
                Ok(self.peer_deleted(node))
            }
            (WatchEventKind::Written, Some(("hb", node))) => {
                self.neighbours.iter_mut().filter(|(id, ..)| id == node).for_each(|(_, heard, _)| *heard = true);
                Ok(None)
            }
            (WatchEventKind::Written, Some(("waiting", _))) => {
                self.joiner_arrived(current).await?;
                Ok(self.pending.take())
            }
            (WatchEventKind::Written, None) if rest == "round" => {
                let (_, round, _) = self.read_round().await?;
                Ok((round > current.round).then_some(RdzvEvent::RoundChanged))
            }
            (WatchEventKind::Written, None) if rest == "closed" => Ok(self.closure().await?.map(RdzvEvent::Closed)),
            _ => Ok(None),
        }
    }

    /// Whether a worker failure seen now belongs to a membership change rather than to the worker: this
    /// node's link to the store is broken, the round moved on, or a ring neighbour is gone (its workers'
    /// sockets closing can reach this node's workers before its liveness key's deletion reaches the agent).
    /// Bounded by one round trip's bound; a store that does not answer in it counts as an outage.
    pub async fn change_behind_failure(&mut self) -> Option<RdzvEvent> {
        if let Some(event) = self.pending.take() {
            return Some(event);
        }
        let current = self.current.clone()?;
        let link = self.link.get();
        if link.broken || link.acked.elapsed() > self.timing.quiet_max() {
            return Some(RdzvEvent::StoreOutage);
        }
        let look = async {
            if self.read_round().await?.1 > current.round {
                return Ok(Some(RdzvEvent::RoundChanged));
            }
            for m in &current.neighbours {
                if self.store.get(&self.key(&format!("alive/{}", m.id))).await?.is_none() {
                    return Ok(Some(RdzvEvent::PeerLost(m.id.clone())));
                }
            }
            Ok::<_, RdzvError>(None)
        };
        match tokio::time::timeout(self.timing.request_bound, look).await {
            Ok(Ok(found)) => found,
            Ok(Err(_)) | Err(_) => Some(RdzvEvent::StoreOutage),
        }
    }

    /// A neighbour's liveness key is gone. Believed at once when this node's own link was sound for the
    /// whole window; otherwise the store itself was in trouble (an etcd that froze revokes every lease when
    /// it resumes), so the neighbour gets a window to register again before it is judged.
    fn peer_deleted(&mut self, node: &str) -> Option<RdzvEvent> {
        let link = self.link.get();
        if link.may_evict(Instant::now(), &self.timing) {
            return Some(RdzvEvent::PeerLost(node.to_string()));
        }
        tracing::info!(node, "a neighbour's liveness key went while this node's link to the store was broken; judging it in one window");
        self.suspects.retain(|(id, _)| id != node);
        self.suspects.push((node.to_string(), link.judge_at(&self.timing)));
        None
    }

    /// The suspects whose time has come: lost if their liveness key is still gone and this node has
    /// evidence; back in the group if it came back; judged later if this node's link broke again.
    async fn judge_suspects(&mut self) -> Result<Option<String>, RdzvError> {
        let now = Instant::now();
        let link = self.link.get();
        let due: Vec<String> = self.suspects.iter().filter(|(_, at)| *at <= now).map(|(id, _)| id.clone()).collect();
        for id in due {
            if !link.may_evict(now, &self.timing) {
                let later = link.judge_at(&self.timing).max(now + self.timing.probe_every);
                self.suspects.iter_mut().filter(|(s, _)| *s == id).for_each(|(_, at)| *at = later);
                continue;
            }
            self.suspects.retain(|(s, _)| *s != id);
            if self.store.get(&self.key(&format!("alive/{id}"))).await?.is_none() {
                tracing::warn!(node = %id, "a neighbour did not register again within a window after the store came back; it is lost");
                return Ok(Some(id));
            }
            tracing::info!(node = %id, "a neighbour registered again after the store came back");
        }
        Ok(None)
    }

    /// The watch ended with its connection, or a request failed on it: the store went away. Asks again
    /// (with back-off, within `join_timeout`) until it answers. A store keeps its keys in memory only, so one
    /// that was restarted has lost this round: the group re-forms in it (`RoundChanged`, no restart spent)
    /// instead of failing a running job. One that kept them (a dropped connection) is watched again; what
    /// changed meanwhile comes as the pending event.
    ///
    /// An external store that refuses connections has ended (or is restarting): the training nodes are
    /// healthy, so their workers keep training; it is said once, and the next re-formation gives it one
    /// liveness window. A store hosted by an agent that is gone ends this node at once (`Retry`).
    async fn after_store_lost(&mut self, current: &RoundInfo) -> Result<Option<RdzvEvent>, RdzvError> {
        let mut retry = self.retry("watching the round");
        let mut said = false;
        loop {
            match self.watch_again(current).await {
                Err(RdzvError::Store(StoreError::Refused { addr })) if matches!(self.on_refusal(), OnRefusal::Wait(_)) => {
                    if !said {
                        tracing::warn!(
                            "the rendezvous store at {addr} refuses connections: its process ended; the workers keep \
                             training, and the next re-formation ends this node (exit 3) unless the store runs again"
                        );
                        said = true;
                    }
                    retry = self.retry("watching the round");
                    tokio::time::sleep(self.timing.probe_every).await;
                }
                Err(e) => retry.after(e).await?,
                found => return found,
            }
        }
    }

    async fn watch_again(&mut self, current: &RoundInfo) -> Result<Option<RdzvEvent>, RdzvError> {
        let seal = self.store.get(&self.key(&format!("r/{}/members", current.round))).await?;
        // Another member may already be re-forming in a restarted store, in a round of the same number: the
        // seal is this round's only if it lists this node.
        let mine = match seal {
            Some(seal) => Seal::decode(&seal)?.members.iter().any(|m| m.id == self.me.id),
            None => false,
        };
        if !mine {
            tracing::warn!("the rendezvous store came back without this round (restarted?); re-forming in it");
            self.publish_fingerprint().await?;
            return Ok(Some(RdzvEvent::RoundChanged));
        }
        self.watch_round(current).await?;
        Ok(self.pending.take())
    }

    /// Whether the group of `info` has room for a joiner (below MAX): a full one lets none in, and its members
    /// do not watch the waiting list.
    fn has_room(&self, info: &RoundInfo) -> bool {
        info.group_world_size < self.settings.max_nodes
    }

    /// Joiners may be waiting: if the group has room, they are let in after one last call, or at once
    /// (a pending `JoinersWaiting`) when they fill it to MAX.
    async fn joiner_arrived(&mut self, current: &RoundInfo) -> Result<(), RdzvError> {
        if !self.has_room(current) {
            return Ok(());
        }
        let max = self.settings.max_nodes as usize;
        let waiting = self.waiting_after(current.round).await?;
        if waiting == 0 {
            return Ok(());
        }
        if current.group_world_size as usize + waiting >= max {
            self.batch_until = None;
            self.pending = Some(RdzvEvent::JoinersWaiting);
        } else if self.batch_until.is_none() {
            self.batch_until = Some(Instant::now() + self.settings.last_call_timeout);
        }
        Ok(())
    }

    /// A neighbour whose heartbeat stopped (a hung or stopped agent, whose connection may stay open) is
    /// evicted: deleting its liveness key tells its other watcher too. Returns its id.
    async fn evict_stale_neighbour(&mut self) -> Result<Option<String>, RdzvError> {
        // Without evidence (this node's own round trips failed within the window), a beat not heard says
        // nothing about the neighbour: its count starts again.
        let evidence = self.link.get().may_evict(Instant::now(), &self.timing);
        for (_, heard, stale) in &mut self.neighbours {
            *stale = if !*heard && evidence { *stale + 1 } else { 0 };
            *heard = false;
        }
        let stale = self.neighbours.iter().find(|(.., stale)| *stale >= self.settings.keep_alive_max_attempt);
        let Some((id, _, checks)) = stale.cloned() else { return Ok(None) };
        tracing::warn!(node = %id, "no heartbeat for {checks} checks; evicting it");
        self.store.delete(&self.key(&format!("alive/{id}"))).await?;
        Ok(Some(id))
    }

    /// Waits up to `timeout` for a value group rank 0 publishes for the current round, or for a membership
    /// event, whichever comes first: group rank 0 may die (or the round change) before it publishes, and
    /// then the others must re-form rather than wait out the timeout. Cancel-safe, as `next_event`.
    pub async fn wait_published(&mut self, name: &str, timeout: Duration) -> Result<Published, RdzvError> {
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        let key = self.key(&format!("r/{round}/{name}"));
        let store = self.store.clone();
        let mut retry = self.retry("waiting for group rank 0");
        // Dropped when the membership changes first.
        // A failed connection is the watch's to handle (`next_event`): this wait only asks again.
        let published = async {
            let deadline = Instant::now() + timeout;
            loop {
                let got = async {
                    if !store.wait(&key, deadline.saturating_duration_since(Instant::now())).await? {
                        return Err(RdzvError::State(format!("group rank 0 did not publish '{name}' within {timeout:?}")));
                    }
                    store.get(&key).await?.ok_or_else(|| RdzvError::State(format!("'{name}' vanished")))
                };
                match got.await {
                    Err(e) => retry.after(e).await?,
                    value => return value,
                }
            }
        };
        tokio::select! {
            value = published => value.map(Published::Value),
            event = self.next_event() => event.map(Published::Changed),
        }
    }
}

/// What a beat writes: this node's `hb/` key, once per `interval`, with the local ranks' progress and pace.
struct Beat {
    key: String,
    interval: Duration,
    note: BeatNote,
    pace: PaceNote,
}

/// The heartbeat task: while this node is in a sealed round (`in_round`), a beat (`hb/<me>`, a new value the
/// others hear) once per interval, bounded by `request_bound` (past it the connection is
/// replaced); while the link is broken, a ping every `probe_every` between beats, so that its return is seen
/// at once. A sound link costs the store one request per interval. While joining, nothing: nobody watches a
/// joiner's beats, and the beats of thousands of nodes in a long round were most of the store's writes,
/// which made the round longer still (the fence's reference over a join is the join's own, see
/// `Link::joined`). Each acknowledgement, and each failure, goes into `link`.
async fn heartbeats<S: Store>(store: Arc<S>, beat: Beat, link: SharedLink, t: Timing, mut in_round: watch::Receiver<bool>) {
    let interval_ms = Some(beat.interval.as_millis() as u64);
    let mut count: u64 = 0;
    let mut last_beat: Option<Instant> = None;
    // Said once per run of failures: an outage of the store is not a line every second.
    let mut failing = false;
    loop {
        if !*in_round.borrow_and_update() {
            if in_round.wait_for(|&joined| joined).await.is_err() {
                return;
            }
            // The round's first beat is due half a period after the join's reference, which stands for a
            // beat (`Link::joined`): at once after a long wait, else spread over half a period rather than
            // thousands of nodes' beats at the moment of the seal, and well before the fence (at least half
            // a period after the reference) or a peer's first eviction check.
            let reference = link.lock().beat_acked;
            last_beat = Some(reference.checked_sub(beat.interval / 2).unwrap_or(reference));
            continue;
        }
        let sent = Instant::now();
        let due = last_beat.is_none_or(|t| sent.saturating_duration_since(t) >= beat.interval);
        if !due && !link.lock().broken {
            pause(sent + t.probe_every, &mut in_round).await;
            continue;
        }
        let result = if due {
            let progress = beat.note.lock().map(|p| p.clone()).unwrap_or_default();
            let pace = beat.pace.lock().map(|p| p.clone()).unwrap_or_default();
            let value = Heartbeat { beat: count + 1, at_ms: unix_ms(), interval_ms, progress, pace }.encode();
            store.beat(&beat.key, &value, t.request_bound).await
        } else {
            store.ping(&beat.key, t.request_bound).await
        };
        match result {
            Ok(()) => {
                link.lock().ack(sent, due);
                if due {
                    count += 1;
                    last_beat = Some(sent);
                }
                if failing {
                    tracing::debug!("heartbeats are acknowledged again");
                }
                failing = false;
            }
            Err(e) => {
                link.lock().fail();
                let e = RdzvError::Store(e);
                // The store's client says when it cannot reach the store; a slow answer is said here.
                if !failing && !is_connection_error(&e) {
                    tracing::warn!("heartbeat failed: {e}");
                } else if !failing {
                    tracing::debug!("heartbeat not acknowledged: {e}");
                }
                failing = true;
            }
        }
        pause(sent + t.probe_every, &mut in_round).await;
    }
}

/// Sleeps until `until`, or less when this node leaves or enters a round (a new round's first beat is due
/// from the join's reference, not from the last round's beats).
async fn pause(until: Instant, in_round: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        Ok(()) = in_round.changed() => {}
    }
}

/// This machine's wall clock in milliseconds since the Unix epoch (None before it): what a heartbeat carries
/// so that a reader can tell its age.
pub fn unix_ms() -> Option<u64> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}
