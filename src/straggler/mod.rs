//! Stragglers: the rank that sets a synchronous job's pace, named without a change to the script. Two
//! sources, both read from outside the workers by the sampler (`sample.rs`): where each rank's main thread
//! spends its time (a non-blocking stack sample every 250 ms: waiting in a collective or a CUDA sync, or
//! working, and where), and each GPU's SM clock and clock-event reasons. Each agent sums its ranks per
//! window (windows cut by wall-clock time, the same for every agent) and its heartbeat carries the last
//! one; group rank 0 judges every window (`judge.rs`) from every heartbeat and names a rank that lags in two
//! windows in a row, once per stretch. Under `--on-straggler drain` its node is then drained: group rank 0 names the node on the pace board (`rendezvous::pace`), the node leaves (exit 75,
//! the hook with `straggler`), and the job goes on without it (elastic MIN, or a spare).

pub mod judge;
mod sample;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{OnStraggler, StragglerConfig};
use crate::observe::events::EventLog;
use crate::observe::metrics::Metrics;
use crate::rendezvous::pace::{PaceBoard, PaceNote};
use crate::store::{Store, WatchEvent};
use judge::{judge, NodeWindow};
pub use sample::Armed;
use sample::Sampler;

/// Consecutive windows a rank must lag in before it is named (and, under `drain`, its node drained).
const NAMED_AFTER: u32 = 2;

/// How long after a failed attempt to watch the pace board the next one is made.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Straggler detection of one agent, armed while its workers run.
pub struct Monitor {
    cfg: StragglerConfig,
    /// How long after a window's end group rank 0 reads it: every heartbeat has carried it by then.
    settle: Duration,
    /// This node's last complete window, as the sampler wrote it for the heartbeat.
    note: PaceNote,
    sampler: Option<Sampler>,
    /// Each straggler's consecutive windows, by rank.
    streaks: BTreeMap<u32, u32>,
    /// The last window judged, and the first in which the running group was seen training (its ranks
    /// waiting in collectives, each sampled enough to be judged): where "within two windows" counts from.
    judged: u64,
    training_since: Option<u64>,
    /// The drain verdict's watch, for the round it is on.
    verdicts: Option<(u64, mpsc::UnboundedReceiver<WatchEvent>)>,
    events: EventLog,
    metrics: Option<Arc<Metrics>>,
}

impl Monitor {
    /// `heartbeat`: the agents' heartbeat interval (a window is read once every heartbeat carries it).
    pub fn new(cfg: StragglerConfig, heartbeat: Duration, note: PaceNote, events: EventLog, metrics: Option<Arc<Metrics>>) -> Monitor {
        Monitor {
            cfg,
            settle: heartbeat + Duration::from_secs(1),
            note,
            sampler: None,
            streaks: BTreeMap::new(),
            judged: 0,
            training_since: None,
            verdicts: None,
            events,
            metrics,
        }
    }

    pub fn window(&self) -> Duration {
        self.cfg.window
    }

    /// Starts sampling a new group of workers.
    pub fn arm(&mut self, armed: Armed) {
        self.training_since = None;
        self.sampler = Sampler::start(armed, self.note.clone());
    }

    /// The workers stopped: the sampler with them, and nothing more to carry.
    pub fn disarm(&mut self) {
        self.sampler = None;
        *self.note.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Runs while the workers run: judges each window on group rank 0, and returns the line this node drains with once the pace board names it. Cancel-safe.
    pub async fn next<S: Store>(&mut self, board: Option<&PaceBoard<S>>) -> String {
        let Some(board) = board else { return std::future::pending().await };
        loop {
            let verdicts = match &mut self.verdicts {
                Some((round, rx)) if *round == board.round => rx,
                _ => match board.watch().await {
                    Ok(rx) => &mut self.verdicts.insert((board.round, rx)).1,
                    Err(e) => {
                        tracing::debug!("cannot watch the pace board: {e}");
                        tokio::time::sleep(WATCH_RETRY).await;
                        continue;
                    }
                },
            };
            let window_ms = self.cfg.window.as_millis().max(1) as u64;
            let now_ms = crate::rendezvous::unix_ms().unwrap_or(0);
            let due_ms = (now_ms / window_ms) * window_ms + self.settle.as_millis() as u64;
            let wait = Duration::from_millis(due_ms.saturating_sub(now_ms)).max(sample::SAMPLE_EVERY);
            tokio::select! {
                event = verdicts.recv() => {
                    if event.is_none() {
                        self.verdicts = None;
                        continue;
                    }
                    match board.verdict_for_me().await {
                        Ok(Some(line)) => return line,
                        Ok(None) => {}
                        Err(e) => tracing::debug!("cannot read the pace board: {e}"),
                    }
                }
                () = tokio::time::sleep_until(Instant::now() + wait) => self.judge_last(board).await,
            }
        }
    }

    /// Shows this node's last window in the metrics; on group rank 0, judges it once, every node's
    /// heartbeat having carried it by now.
    async fn judge_last<S: Store>(&mut self, board: &PaceBoard<S>) {
        let note = self.note.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(done) = note.and_then(|json| serde_json::from_str::<NodeWindow>(&json).ok()) else { return };
        self.gauges(&done);
        if board.group_rank != 0 || done.window <= self.judged {
            return;
        }
        let windows: Vec<NodeWindow> = match board.windows().await {
            Ok(all) => all.iter().filter_map(|w| serde_json::from_str::<NodeWindow>(w).ok()).filter(|w| w.window == done.window).collect(),
            Err(e) => {
                tracing::debug!("cannot read the nodes' windows: {e}");
                return;
            }
        };
        self.judged = done.window;
        let every_node = windows.len() >= board.group_world_size as usize;
        self.verdict(board, &windows, done.window, every_node).await;
    }

    /// Names each new straggler, says when one keeps pace again, and under `drain` names the node of one
    /// that stayed a straggler through a second window.
    async fn verdict<S: Store>(&mut self, board: &PaceBoard<S>, windows: &[NodeWindow], window: u64, every_node: bool) {
        // Training, every node's window in, every rank sampled enough to be judged: from here on a straggler
        // can be seen.
        let judged_all = every_node && windows.iter().all(|w| w.denied || w.ranks.iter().all(|r| r.wait_share().is_some()));
        if judged_all && judge::median_wait(windows).is_some_and(|m| m >= judge::MIN_MEDIAN_WAIT) {
            self.training_since.get_or_insert(window);
        }
        let named = judge(windows);
        let was = std::mem::take(&mut self.streaks);
        for s in &named {
            let streak = was.get(&s.rank).copied().unwrap_or(0) + 1;
            self.streaks.insert(s.rank, streak);
            // One window is not enough: on a busy host a rank may lose the CPU for a while by chance.
            if streak == NAMED_AFTER {
                tracing::warn!("{} (two windows of {:?})", s.line(), self.cfg.window);
                self.events.emit(
                    "muster.agent.straggler",
                    json!({
                        "rank": s.rank,
                        "local_rank": s.local_rank,
                        "group_rank": s.group_rank,
                        "node": s.node,
                        "why": s.why,
                        "window": window,
                        "windows_training": self.training_since.map(|t| window + 1 - t.min(window)),
                    }),
                );
                if let Some(m) = &self.metrics {
                    m.straggler();
                }
            }
            if streak >= NAMED_AFTER && self.cfg.on_straggler == OnStraggler::Drain {
                let line = format!("{} for two windows of {:?}; its node drains (--on-straggler drain)", s.line(), self.cfg.window);
                if let Err(e) = board.put_verdict(&s.id, &line).await {
                    tracing::warn!("cannot name the straggler's node to drain: {e}");
                }
            }
        }
        for (rank, _) in was.iter().filter(|(r, n)| **n >= NAMED_AFTER && !self.streaks.contains_key(r)) {
            tracing::info!("straggler: rank {rank} keeps pace again");
        }
    }

    fn gauges(&self, done: &NodeWindow) {
        let Some(m) = &self.metrics else { return };
        for r in &done.ranks {
            if let Some(share) = r.wait_share() {
                m.wait_share(r.rank, share);
            }
        }
    }
}
