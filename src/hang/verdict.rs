//! The job-wide verdict on a hang, from every rank's summary (pure). Which ranks are to blame:
//! - some ranks still progress and others do not: the ones that do not;
//! - none progresses, but some stopped earlier than the rest by more than half a typical step: those
//!   (a rank stuck before its step's collective stops one step before the ranks that wait in it);
//! - otherwise the job is hung as a whole, and the line shows where each group of ranks is.

use serde::{Deserialize, Serialize};

use super::capture::Frame;

/// One rank as its agent summarises it for the verdict (bounded: a few innermost frames of the main thread).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    pub rank: u32,
    pub local_rank: u32,
    pub node: String,
    pub group_rank: u32,
    pub last_progress_ms: Option<u64>,
    pub marks: u64,
    pub gap_ms: Option<f64>,
    /// `/proc` state letter.
    pub state: Option<String>,
    /// The main thread's innermost frames, innermost first.
    pub frames: Vec<SummaryFrame>,
    /// Why there is no stack, if there is none.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryFrame {
    pub function: String,
    pub file: String,
    pub line: i32,
    pub code: Option<String>,
}

impl From<&Frame> for SummaryFrame {
    fn from(f: &Frame) -> SummaryFrame {
        let file = f.file.rsplit('/').next().unwrap_or(&f.file).to_string();
        SummaryFrame { function: f.function.clone(), file, line: f.line, code: f.code.clone() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Some ranks progress, the suspects do not.
    Stalled,
    /// No rank progresses; the suspects stopped first.
    StoppedFirst,
    /// No rank progresses and none stopped first.
    JobWide,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: Kind,
    /// The ranks to blame (every rank when job-wide).
    pub suspects: Vec<u32>,
    pub line: String,
}

/// The verdict at `now_ms` with `timeout_ms` of silence meaning hung; `clock` renders a time.
pub fn judge(ranks: &[RankSummary], now_ms: u64, timeout_ms: u64, clock: &dyn Fn(u64) -> String) -> Verdict {
    // Still progressing: a mark within a few typical steps (and the timeout). A rank that waits for the
    // culprit has been silent for nearly as long as the culprit, only one step less.
    let recent = typical_gap(ranks).map_or(timeout_ms, |gap| ((4.0 * gap) as u64).max(1_000).min(timeout_ms));
    let moving = |r: &RankSummary| r.last_progress_ms.is_some_and(|l| now_ms.saturating_sub(l) < recent);
    let (moving, stuck): (Vec<&RankSummary>, Vec<&RankSummary>) = ranks.iter().partition(|r| moving(r));
    if !stuck.is_empty() && !moving.is_empty() {
        let newest = moving.iter().filter_map(|r| r.last_progress_ms).max().unwrap_or(now_ms);
        let verb = if moving.len() == 1 { "still progresses" } else { "still progress" };
        let rest = format!("the other {} {verb} (last at {})", count(moving.len()), clock(newest));
        return blame(Kind::Stalled, &stuck, &rest, clock);
    }
    let newest = ranks.iter().filter_map(|r| r.last_progress_ms).max();
    let first = stopped_first(ranks);
    if !first.is_empty() && first.len() < ranks.len() {
        let others: Vec<&RankSummary> = ranks.iter().filter(|r| !first.iter().any(|f| f.rank == r.rank)).collect();
        let since = others.iter().filter_map(|r| r.last_progress_ms).min().unwrap_or(now_ms);
        let verb = if others.len() == 1 { "waits in" } else { "wait in" };
        let rest = format!("the other {} {} since {}", count(others.len()), groups(&others, verb), clock(since));
        return blame(Kind::StoppedFirst, &first, &rest, clock);
    }
    let since = newest.map(clock).unwrap_or_else(|| "their start".into());
    let all: Vec<&RankSummary> = ranks.iter().collect();
    Verdict {
        kind: Kind::JobWide,
        suspects: ranks.iter().map(|r| r.rank).collect(),
        line: format!("hang: job-wide: no rank made progress since {since}; {}", every(groups(&all, "in"))),
    }
}

fn blame(kind: Kind, suspects: &[&RankSummary], rest: &str, clock: &dyn Fn(u64) -> String) -> Verdict {
    let each: Vec<String> = suspects
        .iter()
        .map(|r| {
            let since = r.last_progress_ms.map(clock).unwrap_or_else(|| "its start".into());
            format!(
                "rank {} (node {}, local rank {}) made no progress since {since}; main thread {}",
                r.rank,
                r.node,
                r.local_rank,
                where_in(r, true)
            )
        })
        .collect();
    Verdict {
        kind,
        suspects: suspects.iter().map(|r| r.rank).collect(),
        line: format!("hang: {}; {rest}", each.join("; ")),
    }
}

/// The ranks that stopped before the rest: those before the widest gap between the ranks' last marks, when
/// it is wider than half a typical step (the ranks that wait for them stopped within scheduling noise of each
/// other, a step later). A rank with no mark at all comes first.
fn stopped_first(ranks: &[RankSummary]) -> Vec<&RankSummary> {
    let Some(gap) = typical_gap(ranks) else { return Vec::new() };
    let margin = (gap / 2.0).max(1.0);
    let mut sorted: Vec<&RankSummary> = ranks.iter().collect();
    sorted.sort_by_key(|r| r.last_progress_ms);
    let widest = sorted
        .windows(2)
        .enumerate()
        .filter_map(|(i, w)| Some((i, w[1].last_progress_ms? as f64 - w[0].last_progress_ms.unwrap_or(0) as f64)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match widest {
        Some((i, width)) if width > margin => sorted[..=i].to_vec(),
        _ => Vec::new(),
    }
}

/// The median of the ranks' typical gaps between marks.
fn typical_gap(ranks: &[RankSummary]) -> Option<f64> {
    let mut gaps: Vec<f64> = ranks.iter().filter_map(|r| r.gap_ms).collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_by(f64::total_cmp);
    Some(gaps[gaps.len() / 2])
}

/// Where a rank's main thread is: `in train.py:88 load_batch (time.sleep(3600))`, the code only with `code`.
fn where_in(r: &RankSummary, code: bool) -> String {
    match (r.frames.first(), &r.error) {
        (Some(f), _) => match (&f.code, code) {
            (Some(c), true) => format!("in {}:{} {} ({c})", f.file, f.line, f.function),
            _ => format!("in {} ({}:{})", f.function, f.file, f.line),
        },
        (None, Some(e)) => format!("unknown ({e})"),
        (None, None) => "unknown".into(),
    }
}

/// Ranks grouped by where their main thread is, the largest group first: `ranks 0-2 in all_reduce
/// (distributed_c10d.py:2501); rank 3 in ...`. `verb` comes before the first place.
fn groups(ranks: &[&RankSummary], verb: &str) -> String {
    let mut by_place: Vec<(String, Vec<u32>)> = Vec::new();
    for r in ranks {
        let place = where_in(r, false);
        match by_place.iter_mut().find(|(p, _)| *p == place) {
            Some((_, members)) => members.push(r.rank),
            None => by_place.push((place, vec![r.rank])),
        }
    }
    by_place.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
    let text: Vec<String> = by_place
        .iter()
        .enumerate()
        .map(|(i, (place, members))| {
            let place = place.strip_prefix("in ").unwrap_or(place);
            let place = if i == 0 { format!("{verb} {place}") } else { format!("in {place}") };
            if ranks.len() == members.len() && i == 0 {
                place
            } else {
                format!("{} {place}", rank_list(members))
            }
        })
        .collect();
    text.join("; ")
}

/// `in all_reduce (...)` (one group, every rank) reads as `every rank in all_reduce (...)`.
fn every(groups: String) -> String {
    if groups.starts_with("in ") {
        format!("every rank {groups}")
    } else {
        groups
    }
}

fn count(n: usize) -> String {
    if n == 1 {
        "rank".into()
    } else {
        format!("{n} ranks")
    }
}

/// `rank 3`, `ranks 0-2`, `ranks 0, 2, 5-7`.
pub fn rank_list(ranks: &[u32]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", sorted[i], sorted[j]) } else { sorted[i].to_string() });
        i = j + 1;
    }
    let noun = if sorted.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: i32, code: Option<&str>) -> SummaryFrame {
        SummaryFrame { function: function.into(), file: file.into(), line, code: code.map(String::from) }
    }

    fn rank(rank: u32, last: Option<u64>, at: SummaryFrame) -> RankSummary {
        RankSummary {
            rank,
            local_rank: rank % 2,
            node: format!("n{}", rank / 2),
            group_rank: rank / 2,
            last_progress_ms: last,
            marks: 20,
            gap_ms: Some(60.0),
            state: Some("S".into()),
            frames: vec![at],
            error: None,
        }
    }

    fn clock(ms: u64) -> String {
        format!("t{ms}")
    }

    #[test]
    fn verdicts() {
        let reduce =
            || frame("all_reduce", "distributed_c10d.py", 2501, Some("work = group.allreduce([tensor], opts)"));
        let sleep = || frame("train_step", "hang_train.py", 88, Some("time.sleep(3600)"));
        let lock = || frame("wait_lock", "hang_train.py", 70, Some("LOCK.acquire()"));
        // (ranks, now, kind, suspects, line)
        type Case = (Vec<RankSummary>, u64, Kind, Vec<u32>, &'static str);
        let cases: Vec<Case> = vec![
            // Rank 3 stopped before the step whose collective the others wait in.
            (
                vec![rank(0, Some(1_060), reduce()), rank(1, Some(1_061), reduce()), rank(2, Some(1_060), reduce()), rank(3, Some(1_000), sleep())],
                12_000,
                Kind::StoppedFirst,
                vec![3],
                "hang: rank 3 (node n1, local rank 1) made no progress since t1000; main thread in hang_train.py:88 \
                 train_step (time.sleep(3600)); the other 3 ranks wait in all_reduce (distributed_c10d.py:2501) since t1060",
            ),
            // Judged before the waiters' own timeout: silent for many steps, they do not progress either.
            (
                vec![rank(0, Some(1_250), reduce()), rank(1, Some(1_251), reduce()), rank(2, Some(1_250), reduce()), rank(3, Some(1_000), sleep())],
                11_100,
                Kind::StoppedFirst,
                vec![3],
                "hang: rank 3 (node n1, local rank 1) made no progress since t1000; main thread in hang_train.py:88 \
                 train_step (time.sleep(3600)); the other 3 ranks wait in all_reduce (distributed_c10d.py:2501) since t1250",
            ),
            // Every rank stopped within the same step: job-wide, the odd one visible by place.
            (
                vec![rank(0, Some(1_060), reduce()), rank(1, Some(1_061), reduce()), rank(2, Some(1_060), reduce()), rank(3, Some(1_059), lock())],
                12_000,
                Kind::JobWide,
                vec![0, 1, 2, 3],
                "hang: job-wide: no rank made progress since t1061; ranks 0-2 in all_reduce (distributed_c10d.py:2501); \
                 rank 3 in wait_lock (hang_train.py:70)",
            ),
            // Scheduling noise within the step is no culprit: job-wide.
            (
                vec![rank(0, Some(1_000), reduce()), rank(1, Some(1_025), reduce()), rank(2, Some(1_010), reduce()), rank(3, Some(1_020), lock())],
                12_000,
                Kind::JobWide,
                vec![0, 1, 2, 3],
                "hang: job-wide: no rank made progress since t1025; ranks 0-2 in all_reduce (distributed_c10d.py:2501); \
                 rank 3 in wait_lock (hang_train.py:70)",
            ),
            // Rank 1 is stuck while the others go on (no collective ties them).
            (
                vec![rank(0, Some(11_900), reduce()), rank(1, Some(1_000), sleep())],
                12_000,
                Kind::Stalled,
                vec![1],
                "hang: rank 1 (node n0, local rank 1) made no progress since t1000; main thread in hang_train.py:88 \
                 train_step (time.sleep(3600)); the other rank still progresses (last at t11900)",
            ),
            // Every rank in one place.
            (
                vec![rank(0, Some(1_000), reduce()), rank(1, Some(1_001), reduce())],
                12_000,
                Kind::JobWide,
                vec![0, 1],
                "hang: job-wide: no rank made progress since t1001; every rank in all_reduce (distributed_c10d.py:2501)",
            ),
        ];
        for (ranks, now, kind, suspects, line) in cases {
            let v = judge(&ranks, now, 10_000, &clock);
            assert_eq!((v.kind, &v.suspects, v.line.as_str()), (kind, &suspects, line));
        }
    }

    #[test]
    fn a_rank_without_a_stack_says_why() {
        let mut r = rank(3, Some(1_000), frame("x", "y.py", 1, None));
        r.frames.clear();
        r.error = Some(crate::hang::capture::CaptureError::Denied.short().into());
        assert_eq!(where_in(&r, true), "unknown (ptrace not permitted)");
    }

    #[test]
    fn rank_lists_are_ranges() {
        let cases: &[(&[u32], &str)] =
            &[(&[3], "rank 3"), (&[2, 0, 1], "ranks 0-2"), (&[0, 2, 5, 6, 7], "ranks 0, 2, 5-7"), (&[1, 1], "rank 1")];
        for (ranks, want) in cases {
            assert_eq!(rank_list(ranks), *want);
        }
    }
}
