//! Hangs: a job that stopped making progress without dying. This module is what happens when one is
//! found: the progress sources (`progress.rs`), reading the workers' stacks from outside (`capture.rs`), the
//! job-wide verdict (`verdict.rs`), and the [`Monitor`] that ties them to the rendezvous store's hang board.
//!
//! Each agent judges only its own ranks (no store reads while the job is healthy). The first agent that
//! finds one hung raises the round's incident; every agent then captures its ranks' stacks, writes them to
//! the attempt directory and hands group rank 0 a short summary per rank; group rank 0 prints the verdict and
//! writes `hang_report.json`. What the agent then does (`--on-hang`) is `agent::hang`'s decision.

pub mod capture;
pub mod progress;
pub mod verdict;
pub mod wait;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::HangConfig;
use crate::rendezvous::board::HangBoard;
use crate::rendezvous::BeatNote;
use crate::store::{Store, WatchEvent};
use capture::{Capture, CaptureError, Target};
use progress::{unix_ms, Progress};
use verdict::{RankSummary, SummaryFrame, Verdict};

/// How long one capture of the local ranks may take.
pub const CAPTURE_BOUND: Duration = Duration::from_secs(3);
/// How long `--stacks-on-failure` may delay the stop of the surviving workers.
pub const FAILURE_CAPTURE_BOUND: Duration = Duration::from_secs(2);
/// How long `GET /stacks` may take to read the workers.
pub const ENDPOINT_BOUND: Duration = Duration::from_millis(800);
/// How long group rank 0 waits for the other nodes' summaries (they capture as it does).
const SUMMARY_WAIT: Duration = Duration::from_secs(4);
/// How long a node waits for group rank 0's verdict before judging alone.
const VERDICT_WAIT: Duration = Duration::from_secs(9);
/// How long one incident's handling may take: the capture, the summaries' round trips, the verdict wait.
pub const INCIDENT_BOUND: Duration = Duration::from_secs(15);
/// How often the local ranks are looked at: the progress files' modification times are read this often,
/// so that the gap between two marks is measured to within it (the verdict compares ranks' last marks with
/// half a typical gap).
pub const CHECK_EVERY: Duration = Duration::from_millis(50);
/// How long after a failed attempt to watch the hang board the next one is made.
const WATCH_RETRY: Duration = Duration::from_secs(1);
/// Frames of the main thread a summary carries.
const SUMMARY_FRAMES: usize = 3;

/// The running workers: whose stacks can be read now (`GET /stacks`) and, with hang detection on, their
/// progress (the goodput's warm-up), or, kept in place, when they re-formed (its `reform`). The driver
/// keeps it current.
#[derive(Debug, Default)]
pub struct Registry {
    targets: Mutex<Vec<Target>>,
    progress: Mutex<Option<Arc<Progress>>>,
    /// When the workers kept in place confirmed this start's re-formation (ms since the epoch).
    reformed_ms: Mutex<Option<u64>>,
}

impl Registry {
    pub fn set(&self, targets: Vec<Target>, progress: Option<Arc<Progress>>) {
        if let Ok(mut t) = self.targets.lock() {
            *t = targets;
        }
        if let Ok(mut p) = self.progress.lock() {
            *p = progress;
        }
        if let Ok(mut r) = self.reformed_ms.lock() {
            *r = None;
        }
    }

    /// The workers kept in place by this start have all re-formed (the goodput's `reform` ends now).
    pub fn mark_reformed(&self) {
        if let Ok(mut r) = self.reformed_ms.lock() {
            *r = crate::rendezvous::unix_ms();
        }
    }

    /// When this start's re-formation in place ended; None: not yet (or no workers were kept).
    pub fn reformed_ms(&self) -> Option<u64> {
        self.reformed_ms.lock().ok().and_then(|r| *r)
    }

    /// The running workers' progress; None: not watched (hang detection off) or no workers.
    pub fn progress(&self) -> Option<Arc<Progress>> {
        self.progress.lock().ok().and_then(|p| p.clone())
    }

    /// Every local worker's stacks now, as text or JSON.
    pub async fn render(&self, json: bool) -> String {
        let targets = self.targets.lock().map(|t| t.clone()).unwrap_or_default();
        let captures = capture::capture_all(&targets, ENDPOINT_BOUND).await;
        if json {
            return serde_json::to_string_pretty(&captures).unwrap_or_default();
        }
        if captures.is_empty() {
            return "no workers running\n".into();
        }
        captures.iter().map(Capture::text).collect::<Vec<_>>().join("\n")
    }
}

/// One start of the group, as the monitor watches it.
pub struct Armed {
    pub progress: Arc<Progress>,
    pub targets: Vec<Target>,
    /// The attempt directory (None: log files are off).
    pub attempt_dir: Option<PathBuf>,
    /// Where `hang_report.json` goes (the run directory).
    pub run_dir: Option<PathBuf>,
    pub hostname: String,
}

/// A hang, captured and judged.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub incident: u64,
    pub verdict: Verdict,
    /// A suspect is one of this node's ranks.
    pub here: bool,
    /// This node printed the verdict (group rank 0, or alone when group rank 0 gave none).
    pub judged: bool,
    pub stacks: Option<PathBuf>,
}

/// Watches the local ranks' progress and the round's hang board.
pub struct Monitor {
    cfg: HangConfig,
    armed: Option<Armed>,
    /// The round whose board is watched, its latest incident known here, and the watch.
    round: Option<u64>,
    known: u64,
    events: Option<mpsc::UnboundedReceiver<WatchEvent>>,
    /// When to try watching the board again after a failed attempt (the store may be out of reach).
    retry_watch: Option<Instant>,
    /// When this attempt was armed, and whether its lack of any progress was said.
    armed_at: Option<Instant>,
    silence_said: bool,
    /// Per local rank, the last mark an incident already covered (a hang is reported once).
    covered: Vec<Option<u64>>,
    /// Captures made in this attempt (the second goes to `stacks.1`, ...).
    captures: u32,
    denied_said: bool,
    reports: Vec<Value>,
    /// Set while an incident is being captured and judged (read by the watch that polls [`Monitor::next`]).
    underway: Underway,
}

/// Whether the monitor is handling an incident, readable while its future is borrowed.
#[derive(Debug, Clone, Default)]
pub struct Underway(Arc<AtomicBool>);

impl Underway {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, on: bool) {
        self.0.store(on, Ordering::Release);
    }
}

impl Monitor {
    pub fn new(cfg: HangConfig) -> Monitor {
        Monitor {
            cfg,
            armed: None,
            round: None,
            known: 0,
            events: None,
            retry_watch: None,
            armed_at: None,
            silence_said: false,
            covered: Vec::new(),
            captures: 0,
            denied_said: false,
            reports: Vec::new(),
            underway: Underway::default(),
        }
    }

    pub fn underway(&self) -> Underway {
        self.underway.clone()
    }

    /// Watches a new start of the group.
    pub fn arm(&mut self, armed: Armed) {
        self.covered = vec![None; armed.targets.len()];
        self.captures = 0;
        self.armed = Some(armed);
        self.armed_at = Some(Instant::now());
        self.silence_said = false;
        self.underway.set(false);
    }

    pub fn disarm(&mut self) {
        self.armed = None;
        self.underway.set(false);
    }

    /// This node's ranks' last progress, for its heartbeat.
    fn beat_note(&self) -> Vec<(u32, u64)> {
        let Some(armed) = &self.armed else {
            return Vec::new();
        };
        let snap = armed.progress.snapshot();
        snap.iter().zip(&armed.targets).filter_map(|(p, t)| p.last_ms.map(|ms| (t.rank, ms))).collect()
    }

    /// Waits for the next hang of the running group (a local rank's, or one another node raised), then
    /// captures and judges it. Cancel-safe between incidents: what was covered stays covered.
    pub async fn next<S: Store>(&mut self, board: Option<&HangBoard<S>>, note: &BeatNote) -> Found {
        if self.armed.is_none() {
            return std::future::pending().await;
        }
        loop {
            if let Some(b) = board {
                let due = self.retry_watch.is_none_or(|t| Instant::now() >= t);
                if self.round != Some(b.round) || (self.events.is_none() && due) {
                    self.follow(b).await;
                }
            }
            let event = async {
                match self.events.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(CHECK_EVERY) => {
                    if let Some(n) = self.check(board, note).await {
                        return self.handle(n, board).await;
                    }
                }
                e = event => match (e, board) {
                    (Some(_), Some(b)) => match b.current().await {
                        Ok(n) if n > self.known => return self.handle(n, board).await,
                        Ok(_) => {}
                        Err(e) => tracing::debug!("hang board: cannot read the incident: {e}"),
                    },
                    _ => self.events = None,
                },
            }
        }
    }

    /// Watches `board` (a new round starts with every incident before it known).
    async fn follow<S: Store>(&mut self, board: &HangBoard<S>) {
        if self.round != Some(board.round) {
            self.round = Some(board.round);
            self.known = board.current().await.unwrap_or(0);
        }
        match board.watch().await {
            Ok(rx) => {
                self.events = Some(rx);
                self.retry_watch = None;
            }
            Err(e) => {
                tracing::debug!("hang board: cannot watch the round's incidents: {e}");
                self.retry_watch = Some(Instant::now() + WATCH_RETRY);
            }
        }
    }

    /// One look at the local ranks: the incident to handle, if one of them is newly hung.
    async fn check<S: Store>(&mut self, board: Option<&HangBoard<S>>, note: &BeatNote) -> Option<u64> {
        let armed = self.armed.as_ref()?;
        let progress = armed.progress.clone();
        // The files' `stat`s, off the async threads.
        let _ = tokio::task::spawn_blocking(move || progress.poll_files()).await;
        if let Ok(mut n) = note.lock() {
            *n = self.beat_note();
        }
        let snap = armed.progress.snapshot();
        let now = unix_ms(SystemTime::now());
        let hung = progress::hung(now, &snap, self.cfg.timeout.as_millis() as u64, &self.covered);
        if hung.is_empty() {
            let silent = snap.iter().all(|r| r.last_ms.is_none());
            if silent && !self.silence_said && self.armed_at.is_some_and(|t| t.elapsed() >= self.cfg.timeout) {
                self.silence_said = true;
                tracing::info!(
                    "no rank has shown progress in the {:?} since the workers started; a rank is judged from its \
                     first sign of progress on (a line matching --progress-pattern, a touch of $MUSTER_PROGRESS_FILE, \
                     a file-timer request)",
                    self.cfg.timeout
                );
            }
            return None;
        }
        let ranks: Vec<u32> = hung.iter().filter_map(|l| armed.targets.get(*l as usize).map(|t| t.rank)).collect();
        tracing::info!(
            "{} made no progress for {:?}; capturing every rank's stack",
            verdict::rank_list(&ranks),
            self.cfg.timeout
        );
        let n = match board {
            Some(b) => b.raise(self.known).await.unwrap_or_else(|e| {
                tracing::debug!("hang board: cannot raise the incident ({e}); judging alone");
                self.known + 1
            }),
            None => self.known + 1,
        };
        Some(n.max(self.known + 1))
    }

    /// Handles incident `n`, flagged [`Underway`] meanwhile.
    async fn handle<S: Store>(&mut self, n: u64, board: Option<&HangBoard<S>>) -> Found {
        self.underway.set(true);
        let found = self.judge_incident(n, board).await;
        self.underway.set(false);
        found
    }

    /// Captures, summarises and judges incident `n`.
    async fn judge_incident<S: Store>(&mut self, n: u64, board: Option<&HangBoard<S>>) -> Found {
        self.known = n;
        let Some(armed) = self.armed.as_ref() else {
            return std::future::pending().await;
        };
        let snap = armed.progress.snapshot();
        self.covered = snap.iter().map(|r| r.last_ms).collect();
        let captures = capture::capture_all(&armed.targets, CAPTURE_BOUND).await;
        let dir = armed.attempt_dir.as_ref().map(|d| stacks_dir(d, self.captures));
        self.captures += 1;
        self.say_denied_once(&captures);
        let Some(armed) = self.armed.as_ref() else {
            return std::future::pending().await;
        };
        if let Some(dir) = &dir {
            write_stacks(dir.clone(), captures.clone()).await;
        }
        let group_rank = board.map(|b| b.group_rank).unwrap_or(0);
        let mine: Vec<RankSummary> =
            captures.iter().zip(&snap).map(|(c, p)| summary(c, p, &armed.hostname, group_rank)).collect();
        let (verdict, judged_on) = self.verdict(n, board, &mine).await;
        if let Some(ranks) = &judged_on {
            tracing::warn!("{}", verdict.line);
            self.report(n, &verdict, board, ranks).await;
        }
        let here = mine.iter().any(|r| verdict.suspects.contains(&r.rank));
        Found { incident: n, verdict, here, judged: judged_on.is_some(), stacks: dir }
    }

    /// Hands this node's summaries in and returns the verdict: group rank 0's own on every node's summaries
    /// (which it returns with it), the one it published, or, if none comes in time, this node's own.
    async fn verdict<S: Store>(
        &self,
        n: u64,
        board: Option<&HangBoard<S>>,
        mine: &[RankSummary],
    ) -> (Verdict, Option<Vec<RankSummary>>) {
        let timeout_ms = self.cfg.timeout.as_millis() as u64;
        let judge = |ranks: Vec<RankSummary>| {
            (verdict::judge(&ranks, unix_ms(SystemTime::now()), timeout_ms, &clock), Some(ranks))
        };
        let Some(b) = board else {
            return judge(mine.to_vec());
        };
        if let Err(e) = b.put_summary(n, &serde_json::to_vec(mine).unwrap_or_default()).await {
            tracing::debug!("hang board: cannot hand in this node's summary: {e}");
        }
        if b.group_rank == 0 {
            let all = gather(b, n).await;
            return judge(if all.is_empty() { mine.to_vec() } else { all });
        }
        match b.verdict(n, VERDICT_WAIT).await.ok().flatten().and_then(|v| serde_json::from_slice::<Verdict>(&v).ok()) {
            Some(v) => (v, None),
            None => {
                tracing::warn!(
                    "group rank 0 gave no verdict on hang {n} within {VERDICT_WAIT:?}; judging this node's ranks alone"
                );
                judge(mine.to_vec())
            }
        }
    }

    /// Group rank 0's side after judging: the verdict to the board and `hang_report.json`.
    async fn report<S: Store>(
        &mut self,
        n: u64,
        verdict: &Verdict,
        board: Option<&HangBoard<S>>,
        ranks: &[RankSummary],
    ) {
        if let Some(b) = board.filter(|b| b.group_rank == 0) {
            if let Err(e) = b.put_verdict(n, &serde_json::to_vec(verdict).unwrap_or_default()).await {
                tracing::debug!("hang board: cannot publish the verdict: {e}");
            }
        }
        let Some(run_dir) = self.armed.as_ref().and_then(|a| a.run_dir.clone()) else {
            return;
        };
        self.reports.push(json!({
            "incident": n,
            "at": chrono::Local::now().to_rfc3339(),
            "round": board.map(|b| b.round),
            "hang_timeout_s": self.cfg.timeout.as_secs_f64(),
            "verdict": verdict,
            "ranks": ranks,
        }));
        let body = serde_json::to_vec_pretty(&self.reports).unwrap_or_default();
        let path = run_dir.join("hang_report.json");
        let written = tokio::task::spawn_blocking(move || write_atomic(&path, &body)).await;
        if let Ok(Err(e)) = written {
            tracing::warn!("cannot write hang_report.json in {}: {e}", run_dir.display());
        }
    }

    fn say_denied_once(&mut self, captures: &[Capture]) {
        if self.denied_said {
            return;
        }
        if let Some(c) = captures.iter().find(|c| c.threads == Err(CaptureError::Denied)) {
            self.denied_said = true;
            tracing::warn!(
                "cannot read the workers' Python stacks (rank {}, pid {}): {}",
                c.target.rank,
                c.target.pid,
                CaptureError::Denied
            );
        }
    }
}

/// Every node's summaries of incident `n` that group rank 0 gets in time.
async fn gather<S: Store>(board: &HangBoard<S>, n: u64) -> Vec<RankSummary> {
    match board.summaries(n, Instant::now() + SUMMARY_WAIT).await {
        Ok(all) => {
            let got = all.len();
            if got < board.group_world_size as usize {
                tracing::warn!(
                    "hang {n}: {got} of {} nodes handed in their ranks' summaries in time",
                    board.group_world_size
                );
            }
            all.iter().filter_map(|b| serde_json::from_slice::<Vec<RankSummary>>(b).ok()).flatten().collect()
        }
        Err(e) => {
            tracing::debug!("hang board: cannot read the summaries: {e}");
            Vec::new()
        }
    }
}

fn summary(c: &Capture, p: &progress::RankProgress, node: &str, group_rank: u32) -> RankSummary {
    let main = c.main_thread();
    RankSummary {
        rank: c.target.rank,
        local_rank: c.target.local_rank,
        node: node.to_string(),
        group_rank,
        last_progress_ms: p.last_ms,
        marks: p.marks,
        gap_ms: p.gap_ms,
        state: c.state.clone(),
        frames: main.map(|t| t.frames.iter().take(SUMMARY_FRAMES).map(SummaryFrame::from).collect()).unwrap_or_default(),
        // Chosen here, where the frames' full paths are.
        own_frame: main.and_then(|t| verdict::own_frame(&t.frames)).map(SummaryFrame::from),
        error: c.threads.as_ref().err().map(|e| e.short().to_string()),
        waits: main.map(|t| wait::waits_on_peers(&t.frames, wait::ThreadState::from_letter(c.state.as_deref()))),
    }
}

/// A time as the verdict shows it (local time, milliseconds).
fn clock(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .map(|t| t.with_timezone(&chrono::Local).format("%H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// `--stacks-on-failure`: the surviving workers' stacks, before they are stopped, into the attempt's
/// `stacks/` (bounded by [`FAILURE_CAPTURE_BOUND`]).
pub async fn capture_survivors(survivors: Option<Vec<Target>>, attempt: Option<&Path>) {
    let (Some(targets), Some(attempt)) = (survivors, attempt) else { return };
    if targets.is_empty() {
        return;
    }
    let captures = capture::capture_all(&targets, FAILURE_CAPTURE_BOUND).await;
    write_stacks(stacks_dir(attempt, 0), captures).await;
}

/// `<attempt>/stacks` for the first capture of an attempt, `stacks.<k>` for later ones.
pub fn stacks_dir(attempt: &Path, k: u32) -> PathBuf {
    if k == 0 {
        attempt.join("stacks")
    } else {
        attempt.join(format!("stacks.{k}"))
    }
}

/// Writes `rank_<R>.txt` and `rank_<R>.json` per capture into `dir` (off the async threads).
pub async fn write_stacks(dir: PathBuf, captures: Vec<Capture>) {
    let shown = dir.display().to_string();
    let written = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        for c in &captures {
            let r = c.target.rank;
            std::fs::write(dir.join(format!("rank_{r}.txt")), c.text())?;
            std::fs::write(dir.join(format!("rank_{r}.json")), serde_json::to_vec_pretty(c).unwrap_or_default())?;
        }
        Ok(())
    })
    .await;
    match written.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
        Ok(()) => tracing::info!("stacks written to {shown}"),
        Err(e) => tracing::warn!("cannot write the stacks to {shown}: {e}"),
    }
}

fn write_atomic(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, path)
}
