//! Stragglers: the rank that sets a synchronous job's pace, named without a change to the script. Two
//! sources, both read from outside the workers by the sampler (`sample.rs`): where each rank's main thread
//! spends its time (a non-blocking stack sample with its kernel state, every 250 ms or 16 times a window:
//! waiting on the others, in a collective or asleep inside torch as DDP's backward, or working, and where),
//! and each GPU's SM clock and clock-event reasons. Each agent sums its ranks per window (windows cut by
//! wall-clock time, the same for every agent) and its heartbeat carries the last two; group rank 0 judges
//! each window (`judge.rs`) once every node's heartbeat carries it, and names a rank that lags in two
//! windows in a row, once per stretch (`stretch.rs`). Under `--on-straggler drain` its node is then drained:
//! group rank 0 names the node on the pace board (`rendezvous::pace`), the node leaves (exit 75, the hook
//! with `straggler`), and the job goes on without it (elastic MIN, or a spare).

pub mod judge;
mod sample;
mod stretch;

use std::collections::BTreeSet;
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
use stretch::Stretches;

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
    /// Each lagging or named rank's stretch.
    stretches: Stretches,
    /// The last window judged; the first in which the running group was seen training (its ranks waiting
    /// on each other, each sampled enough to be judged, none seen starting), which may still hold the
    /// ranks' arrival from their start (the first to start wait for the last); and the next judged that
    /// way, the first whole window of training: where "within two windows" counts from.
    judged: u64,
    training_seen: Option<u64>,
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
            stretches: Stretches::default(),
            judged: 0,
            training_seen: None,
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
        self.training_seen = None;
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
            let wait = Duration::from_millis(due_ms.saturating_sub(now_ms)).max(sample::sample_every(self.cfg.window));
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

    /// Shows this node's last window in the metrics; on group rank 0, judges each window once every node's
    /// heartbeat carries it.
    async fn judge_last<S: Store>(&mut self, board: &PaceBoard<S>) {
        let note = self.note.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let Some(done) = note.as_deref().and_then(|json| parse_note(json).pop()) else { return };
        self.gauges(&done);
        if board.group_rank != 0 || done.window <= self.judged {
            return;
        }
        let notes: Vec<Vec<NodeWindow>> = match board.windows().await {
            Ok(all) => all.iter().map(|w| parse_note(w)).filter(|n| !n.is_empty()).collect(),
            Err(e) => {
                tracing::debug!("cannot read the nodes' windows: {e}");
                return;
            }
        };
        for (window, windows) in ready(&notes, self.judged, done.window) {
            self.judged = window;
            let every_node = windows.len() >= board.group_world_size as usize;
            self.verdict(board, &windows, window, every_node).await;
        }
    }

    /// Names each new straggler, says when one keeps pace again, and under `drain` names the node of one
    /// that stayed a straggler through a second window.
    async fn verdict<S: Store>(&mut self, board: &PaceBoard<S>, windows: &[NodeWindow], window: u64, every_node: bool) {
        // Training, every node's window in, every rank sampled enough to be judged and none still starting
        // (the first to start wait for the last, which no one's pace is): from here on a straggler can be seen.
        let judged_all = every_node
            && windows.iter().all(|w| w.denied || w.ranks.iter().all(|r| r.wait_share().is_some() && r.starting == 0));
        if judged_all && judge::median_wait(windows).is_some_and(|m| m >= judge::MIN_MEDIAN_WAIT) {
            if self.training_seen.is_some_and(|seen| seen < window) {
                self.training_since.get_or_insert(window);
            }
            self.training_seen.get_or_insert(window);
        }
        let named = judge(windows);
        let judged: Vec<u32> = windows
            .iter()
            .flat_map(|w| w.ranks.iter().filter(|r| (!w.denied && r.wait_share().is_some()) || r.sm_mhz.is_some()).map(|r| r.rank))
            .collect();
        let lagging: Vec<u32> = named.iter().map(|s| s.rank).collect();
        let median = judge::median_wait(windows);
        let waits: Vec<(u32, u32, u32)> = windows.iter().flat_map(|w| w.ranks.iter().map(|r| (r.rank, r.waiting, r.samples))).collect();
        tracing::debug!(window, nodes = windows.len(), ?median, ?judged, ?lagging, ?waits, "straggler window judged");
        let changes = self.stretches.window(&judged, &lagging);
        for s in named.iter().filter(|s| changes.named.contains(&s.rank)) {
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
                    // 0: named in the windows that still held the start, before the first whole one of training.
                    "windows_training": self.training_since.map_or(0, |t| (window + 1).saturating_sub(t)),
                }),
            );
            if let Some(m) = &self.metrics {
                m.straggler();
            }
        }
        if self.cfg.on_straggler == OnStraggler::Drain {
            for s in named.iter().filter(|s| changes.lagging.contains(&s.rank)) {
                let line = format!("{} for two windows of {:?}; its node drains (--on-straggler drain)", s.line(), self.cfg.window);
                if let Err(e) = board.put_verdict(&s.id, &line).await {
                    tracing::warn!("cannot name the straggler's node to drain: {e}");
                }
            }
        }
        for rank in changes.again {
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

/// A heartbeat's pace note: its node's last complete windows, oldest first (one window, not a list, from an
/// agent before the note carried two). Nothing where it does not parse.
fn parse_note(json: &str) -> Vec<NodeWindow> {
    serde_json::from_str::<Vec<NodeWindow>>(json)
        .or_else(|_| serde_json::from_str::<NodeWindow>(json).map(|w| vec![w]))
        .unwrap_or_default()
}

/// The windows after `judged`, up to `newest` (this node's last), that can be judged now, in order, each with
/// every node's summary of it: a window waits while a node's heartbeat does not carry it yet, unless that
/// node's newest window is over two behind (its sampler stopped: it is left out).
fn ready(notes: &[Vec<NodeWindow>], judged: u64, newest: u64) -> Vec<(u64, Vec<NodeWindow>)> {
    let newest_of = |n: &Vec<NodeWindow>| n.iter().map(|w| w.window).max().unwrap_or(0);
    let live: Vec<&Vec<NodeWindow>> = notes.iter().filter(|n| newest_of(n) + 2 >= newest).collect();
    let ids: BTreeSet<u64> = live.iter().flat_map(|n| n.iter().map(|w| w.window)).filter(|w| (judged + 1..=newest).contains(w)).collect();
    let mut out = Vec::new();
    for window in ids {
        if live.iter().any(|n| newest_of(n) < window) {
            break;
        }
        let windows = live.iter().filter_map(|n| n.iter().find(|w| w.window == window)).cloned().collect();
        out.push((window, windows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(node: u32, windows: &[u64]) -> Vec<NodeWindow> {
        let w = |window| NodeWindow { window, node: format!("h{node}"), id: format!("n{node}"), group_rank: node, ranks: Vec::new(), denied: false };
        windows.iter().map(|&x| w(x)).collect()
    }

    #[test]
    fn a_window_is_judged_once_every_live_node_carries_it() {
        // (each node's note, the last window judged, this node's newest; the windows judged, with how many nodes)
        type Row = (Vec<Vec<NodeWindow>>, u64, u64, Vec<(u64, usize)>);
        let rows: Vec<Row> = vec![
            // Every node carries 10 and 11.
            (vec![note(0, &[10, 11]), note(1, &[10, 11])], 9, 11, vec![(10, 2), (11, 2)]),
            // Node 1's beat has not carried 11 yet: 10 now, 11 at the next read (no judgement of 11 alone).
            (vec![note(0, &[10, 11]), note(1, &[9, 10])], 9, 11, vec![(10, 2)]),
            (vec![note(0, &[10, 11]), note(1, &[9, 10])], 10, 11, vec![]),
            // Node 1 is ahead: 10 dropped from its note, judged without it.
            (vec![note(0, &[10, 11]), note(1, &[11, 12])], 9, 11, vec![(10, 1), (11, 2)]),
            // Node 1's sampler stopped long ago: left out.
            (vec![note(0, &[10, 11]), note(1, &[7, 8])], 9, 11, vec![(10, 1), (11, 1)]),
            // Nothing new.
            (vec![note(0, &[10, 11]), note(1, &[10, 11])], 11, 11, vec![]),
        ];
        for (i, (notes, judged, newest, want)) in rows.into_iter().enumerate() {
            let got: Vec<(u64, usize)> = ready(&notes, judged, newest).into_iter().map(|(w, ws)| (w, ws.len())).collect();
            assert_eq!(got, want, "row {i}");
        }
    }

    #[test]
    fn a_note_is_two_windows_or_one_from_an_older_agent() {
        let two = serde_json::to_string(&note(0, &[4, 5])).expect("json");
        assert_eq!(parse_note(&two).iter().map(|w| w.window).collect::<Vec<_>>(), [4, 5]);
        let one = serde_json::to_string(&note(0, &[5])[0]).expect("json");
        assert_eq!(parse_note(&one).iter().map(|w| w.window).collect::<Vec<_>>(), [5]);
        assert!(parse_note("{").is_empty());
    }
}
