//! Progress: when each local rank last showed it was moving, from any of three sources, with no change to
//! the script: a line of its output matching `--progress-pattern` (the pumps call [`Marker::mark`]), the
//! modification time of its `MUSTER_PROGRESS_FILE` (read by [`Progress::poll_files`]), and a request on
//! torch's file timer. One table per start of the group, shared by the pumps' threads (atomics; a lock only
//! to follow a start that keeps workers in place, [`Progress::succeed`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The variable naming each worker's progress file.
pub const FILE_VAR: &str = "MUSTER_PROGRESS_FILE";

/// Milliseconds since the Unix epoch (0 before it: no clock).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One rank's marks. `last_ms` 0: none yet.
#[derive(Debug, Default)]
struct Slot {
    /// The first mark (ms since the epoch); 0 until one.
    first_ms: AtomicU64,
    last_ms: AtomicU64,
    marks: AtomicU64,
    /// The mean gap between marks (exponentially weighted), in microseconds; 0 until two marks.
    gap_us: AtomicU64,
}

impl Slot {
    fn mark(&self, at_ms: u64) {
        let _ = self.first_ms.compare_exchange(0, at_ms, Ordering::Relaxed, Ordering::Relaxed);
        let prev = self.last_ms.fetch_max(at_ms, Ordering::Relaxed);
        if at_ms <= prev {
            return;
        }
        self.marks.fetch_add(1, Ordering::Relaxed);
        if prev > 0 {
            let gap = (at_ms - prev) * 1000;
            let old = self.gap_us.load(Ordering::Relaxed);
            let new = if old == 0 { gap } else { (old * 7 + gap) / 8 };
            self.gap_us.store(new, Ordering::Relaxed);
        }
    }
}

/// What one rank's progress looks like now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankProgress {
    pub local_rank: u32,
    /// The last mark (ms since the epoch); None: no mark yet.
    pub last_ms: Option<u64>,
    pub marks: u64,
    /// The typical gap between its marks, in ms (None until two marks).
    pub gap_ms: Option<f64>,
}

/// The progress of one start of the local group.
#[derive(Debug)]
pub struct Progress {
    slots: Vec<Slot>,
    /// Each rank's progress file, when the job has them, and the modification time last seen.
    files: Vec<(PathBuf, std::sync::Mutex<Option<SystemTime>>)>,
    /// The table of the start that kept this start's workers in place: their marks go on there.
    next: std::sync::Mutex<Option<Arc<Progress>>>,
}

impl Progress {
    /// A table for `nproc` ranks; `files`: each rank's progress file (empty: none).
    pub fn new(nproc: u32, files: Vec<PathBuf>) -> Arc<Progress> {
        Progress::table(nproc, files.into_iter().map(|p| (p, None)).collect())
    }

    fn table(nproc: u32, files: Vec<(PathBuf, Option<SystemTime>)>) -> Arc<Progress> {
        let files = files.into_iter().map(|(p, seen)| (p, std::sync::Mutex::new(seen))).collect();
        Arc::new(Progress { slots: (0..nproc).map(|_| Slot::default()).collect(), files, next: Default::default() })
    }

    /// The table of a start that keeps the workers of local ranks `kept` of this one in place: their
    /// progress files stay theirs (`files` are the new start's), and the marks their output pumps (made for
    /// this start) find are passed on to it. Every rank starts with no mark, as at any start: a kept worker
    /// is judged from its first sign of progress after the re-formation.
    pub fn succeed(self: &Arc<Self>, kept: &[u32], files: Vec<PathBuf>) -> Arc<Progress> {
        let files = files
            .into_iter()
            .enumerate()
            .map(|(rank, new)| match self.files.get(rank).filter(|_| kept.contains(&(rank as u32))) {
                Some((old, seen)) => (old.clone(), seen.lock().ok().and_then(|s| *s)),
                None => (new, None),
            })
            .collect();
        let next = Progress::table(self.slots.len() as u32, files);
        if let Ok(mut n) = self.next.lock() {
            *n = Some(next.clone());
        }
        next
    }

    pub fn marker(self: &Arc<Self>, local_rank: u32) -> Marker {
        Marker { progress: self.clone(), local_rank }
    }

    pub fn mark(&self, local_rank: u32, at: SystemTime) {
        if let Some(slot) = self.slots.get(local_rank as usize) {
            slot.mark(unix_ms(at));
        }
        let next = self.next.lock().ok().and_then(|n| n.clone());
        if let Some(next) = next {
            next.mark(local_rank, at);
        }
    }

    /// Reads the progress files' modification times (blocking: a `stat` each; call off the async threads).
    /// A file touched since the last poll is a mark at its modification time.
    pub fn poll_files(&self) {
        for (rank, (path, seen)) in self.files.iter().enumerate() {
            let Ok(mtime) = std::fs::metadata(path).and_then(|m| m.modified()) else {
                continue;
            };
            let Ok(mut seen) = seen.lock() else { continue };
            if seen.is_some_and(|s| mtime <= s) {
                continue;
            }
            // The first look only learns what muster's own creation of the file wrote.
            if seen.replace(mtime).is_some() {
                self.mark(rank as u32, mtime);
            }
        }
    }

    /// When the first rank showed progress (ms since the epoch); None: none has yet.
    pub fn first_ms(&self) -> Option<u64> {
        self.slots.iter().map(|s| s.first_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0).min()
    }

    pub fn snapshot(&self) -> Vec<RankProgress> {
        (0..self.slots.len())
            .map(|i| {
                let s = &self.slots[i];
                let last = s.last_ms.load(Ordering::Relaxed);
                let gap = s.gap_us.load(Ordering::Relaxed);
                RankProgress {
                    local_rank: i as u32,
                    last_ms: (last > 0).then_some(last),
                    marks: s.marks.load(Ordering::Relaxed),
                    gap_ms: (gap > 0).then(|| gap as f64 / 1000.0),
                }
            })
            .collect()
    }
}

/// One rank's handle on the table (for its output pumps and the file timer).
#[derive(Debug, Clone)]
pub struct Marker {
    progress: Arc<Progress>,
    local_rank: u32,
}

impl Marker {
    pub fn mark(&self) {
        self.progress.mark(self.local_rank, SystemTime::now());
    }
}

/// `--progress-pattern` on one rank's output: a matching line is a mark.
#[derive(Debug, Clone)]
pub struct LineWatch {
    pub pattern: regex::bytes::Regex,
    pub marker: Marker,
}

impl LineWatch {
    pub fn see(&self, line: &[u8]) {
        if self.pattern.is_match(line) {
            self.marker.mark();
        }
    }
}

/// What a start of the group hands the supervisor for progress: the table, the pattern (None: output is
/// not read for it) and each rank's progress file (empty: none).
#[derive(Debug, Clone)]
pub struct Hooks {
    pub progress: Arc<Progress>,
    pub pattern: Option<regex::bytes::Regex>,
    pub files: Vec<PathBuf>,
}

impl Hooks {
    pub fn line_watch(&self, local_rank: u32) -> Option<LineWatch> {
        self.pattern.clone().map(|pattern| LineWatch { pattern, marker: self.progress.marker(local_rank) })
    }
}

/// Creates (or truncates) each rank's progress file under `dir` (blocking). Its creation is not a mark.
pub fn create_files(dir: &Path, nproc: u32) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    (0..nproc)
        .map(|r| {
            let path = dir.join(format!("rank_{r}"));
            std::fs::File::create(&path)?;
            Ok(path)
        })
        .collect()
}

/// The ranks hung at `now_ms`: a mark at least `timeout_ms` ago, and not the same last mark an earlier
/// incident already covered (`covered[rank]`). A rank with no mark yet is not judged: start-up (imports,
/// loading a checkpoint) can take any time, and the clock starts at the first sign of progress.
pub fn hung(now_ms: u64, ranks: &[RankProgress], timeout_ms: u64, covered: &[Option<u64>]) -> Vec<u32> {
    ranks
        .iter()
        .filter(|r| match r.last_ms {
            Some(last) => {
                now_ms.saturating_sub(last) >= timeout_ms
                    && covered.get(r.local_rank as usize).copied().flatten() != Some(last)
            }
            None => false,
        })
        .map(|r| r.local_rank)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(local_rank: u32, last_ms: Option<u64>) -> RankProgress {
        RankProgress { local_rank, last_ms, marks: 1, gap_ms: None }
    }

    #[test]
    fn a_rank_is_hung_after_the_timeout_once_per_last_mark() {
        let ranks = [rank(0, Some(1_000)), rank(1, Some(9_500)), rank(2, None)];
        // (now, covered, hung)
        type Case<'a> = (u64, &'a [Option<u64>], &'a [u32]);
        let cases: &[Case] = &[
            (5_000, &[], &[]),
            (11_000, &[], &[0]),
            (11_000, &[Some(1_000)], &[]),
            (11_000, &[Some(500)], &[0]),
            (20_000, &[Some(1_000), None], &[1]),
            (20_000, &[], &[0, 1]),
        ];
        for (now, covered, want) in cases {
            assert_eq!(hung(*now, &ranks, 10_000, covered), *want, "now {now} covered {covered:?}");
        }
    }

    #[test]
    fn marks_keep_the_latest_time_and_the_typical_gap() {
        let p = Progress::new(2, Vec::new());
        let t = |ms: u64| UNIX_EPOCH + std::time::Duration::from_millis(ms);
        for ms in [1_000, 1_100, 1_200, 1_150] {
            p.mark(1, t(ms));
        }
        p.mark(7, t(5)); // not a rank of this group: ignored
        let snap = p.snapshot();
        assert_eq!(snap[0], RankProgress { local_rank: 0, last_ms: None, marks: 0, gap_ms: None });
        assert_eq!(snap[1].last_ms, Some(1_200));
        assert_eq!(snap[1].marks, 3);
        assert_eq!(snap[1].gap_ms, Some(100.0));
    }

    #[test]
    fn a_touched_progress_file_is_a_mark_and_its_creation_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = create_files(dir.path(), 2).expect("files");
        let p = Progress::new(2, files.clone());
        p.poll_files();
        assert_eq!(p.snapshot()[0].last_ms, None);
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&files[0]).and_then(|f| f.set_modified(later)).expect("touch");
        p.poll_files();
        let snap = p.snapshot();
        assert_eq!(snap[0].last_ms, Some(unix_ms(later)));
        assert_eq!(snap[1].last_ms, None);
    }

    /// A start that keeps local rank 0 in place: its file stays its own (no mark for what was seen), the
    /// marks its old pump finds reach the new table, and rank 1 (started again) has the new file.
    #[test]
    fn a_kept_rank_s_marks_and_file_follow_it_to_the_next_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old_files = create_files(&dir.path().join("0"), 2).expect("files");
        let old = Progress::new(2, old_files.clone());
        old.poll_files();
        let new_files = create_files(&dir.path().join("1"), 2).expect("files");
        let new = old.succeed(&[0], new_files.clone());
        assert_eq!(new.files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(), vec![old_files[0].clone(), new_files[1].clone()]);
        new.poll_files();
        assert!(new.snapshot().iter().all(|r| r.last_ms.is_none()), "no mark from a file seen before");
        old.marker(0).mark();
        let snap = new.snapshot();
        assert!(snap[0].last_ms.is_some() && snap[1].last_ms.is_none(), "{snap:?}");
    }
}
