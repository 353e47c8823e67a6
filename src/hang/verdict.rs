//! The job-wide verdict on a hang, from every rank's summary (pure). Which ranks are to blame:
//! - some ranks still progress and others do not: the ones that do not;
//! - none progresses, but some stopped earlier than the rest by more than half a typical step: those
//!   (a rank stuck before its step's collective stops one step before the ranks that wait in it), unless one
//!   of them is seen waiting on the others;
//! - none progresses, and some wait on the others (`hang::wait`: in a collective, or asleep below torch, as
//!   DDP's ranks wait inside `backward`) while others do not: those that do not;
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
    /// The innermost frame of the job's own code, where the main thread is blocked below it (`frames[0]` is
    /// in the standard library or a package): the frame the verdict names. None where `frames[0]` is the
    /// job's own, no frame is, or the record is from an agent that did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_frame: Option<SummaryFrame>,
    /// Why there is no stack, if there is none.
    pub error: Option<String>,
    /// Whether the main thread waits on the other ranks (`hang::wait`); None without a stack, or from an
    /// agent that did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits: Option<bool>,
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

/// The innermost frame of a stack (innermost first) that is the job's own code, where the stack goes on below
/// it: with the innermost frame, where the thread is blocked, the pair the verdict names. None where the
/// innermost frame is the job's own (it names that one alone) or no frame is (it names the innermost).
pub fn own_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().position(|f| is_own(&f.file)).filter(|&i| i > 0).map(|i| &frames[i])
}

/// Whether a frame's file (its full path) is the job's own code: not the standard library (a `pythonX.Y`
/// directory under `lib`, `lib64`; frozen modules), not an installed package (anything under a
/// `site-packages` or `dist-packages`), and a file one can open (not `<string>`: code compiled at run time,
/// muster's warm-spare bootstrap among it).
pub fn is_own(path: &str) -> bool {
    if path.starts_with('<') {
        return false;
    }
    let parts: Vec<&str> = path.split('/').collect();
    let package = parts.iter().any(|p| matches!(*p, "site-packages" | "dist-packages"));
    let stdlib = parts.windows(2).any(|w| matches!(w[0], "lib" | "lib64") && is_python_version_dir(w[1]));
    !package && !stdlib
}

/// `python3.11`, `python3.13t` (free-threaded): the standard library's directory.
fn is_python_version_dir(name: &str) -> bool {
    let Some(version) = name.strip_prefix("python") else { return false };
    let version = version.strip_suffix('t').unwrap_or(version);
    let mut numbers = version.split('.');
    let number = |n: Option<&str>| n.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    number(numbers.next()) && number(numbers.next()) && numbers.next().is_none()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Some ranks progress, the suspects do not.
    Stalled,
    /// No rank progresses; the suspects stopped first.
    StoppedFirst,
    /// No rank progresses; the others wait on the suspects.
    WaitedOn,
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
    // The ranks that stopped first, unless one of them is seen waiting on the others: then where each waits
    // says more than when each stopped.
    if !first.is_empty() && first.len() < ranks.len() && first.iter().all(|r| r.waits != Some(true)) {
        let others: Vec<&RankSummary> = ranks.iter().filter(|r| !first.iter().any(|f| f.rank == r.rank)).collect();
        let since = others.iter().filter_map(|r| r.last_progress_ms).min().unwrap_or(now_ms);
        let verb = if others.len() == 1 { "waits in" } else { "wait in" };
        let rest = format!("the other {} {} since {}", count(others.len()), groups(&others, verb), clock(since));
        return blame(Kind::StoppedFirst, &first, &rest, clock);
    }
    let (waiting, holding): (Vec<&RankSummary>, Vec<&RankSummary>) =
        ranks.iter().filter(|r| r.waits.is_some()).partition(|r| r.waits == Some(true));
    if !waiting.is_empty() && !holding.is_empty() {
        let since = waiting.iter().filter_map(|r| r.last_progress_ms).min().unwrap_or(now_ms);
        let verb = if waiting.len() == 1 { "waits" } else { "wait" };
        let verb = format!("{verb} on {} in", if holding.len() == 1 { "it" } else { "them" });
        let rest = format!("the other {} {} since {}", count(waiting.len()), groups(&waiting, &verb), clock(since));
        return blame(Kind::WaitedOn, &holding, &rest, clock);
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

/// Where a rank's main thread is: `in train.py:88 load_batch (time.sleep(3600))` (`code`, and the code is
/// known), else `in load_batch (train.py:88)`; below the job's own frame, the frame it is blocked in:
/// `in train.py:88 fetch_shard (ready.wait()) → threading.py:327 Condition.wait`.
fn where_in(r: &RankSummary, code: bool) -> String {
    let Some(inner) = r.frames.first() else {
        return r.error.as_ref().map_or_else(|| "unknown".into(), |e| format!("unknown ({e})"));
    };
    let named = r.own_frame.as_ref().unwrap_or(inner);
    let code = named.code.as_deref().filter(|_| code);
    let show = |f: &SummaryFrame| match code {
        Some(_) => format!("{}:{} {}", f.file, f.line, f.function),
        None => format!("{} ({}:{})", f.function, f.file, f.line),
    };
    let mut text = format!("in {}", show(named));
    if let Some(c) = code {
        text.push_str(&format!(" ({c})"));
    }
    if r.own_frame.is_some() {
        text.push_str(&format!(" → {}", show(inner)));
    }
    text
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
            own_frame: None,
            error: None,
            waits: None,
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
        let backward = || frame("_engine_run_backward", "graph.py", 1113, Some("return Variable._execution_engine.run_backward("));
        let fetch = || frame("fetch_batch", "ddp.py", 15, Some("time.sleep(3600)"));
        let waits = |mut r: RankSummary, w: bool| {
            r.waits = Some(w);
            r
        };
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
            // DDP: every rank stopped within the same step; three wait inside backward, rank 1 does not.
            (
                vec![waits(rank(0, Some(1_060), backward()), true), waits(rank(1, Some(1_059), fetch()), false),
                     waits(rank(2, Some(1_061), backward()), true), waits(rank(3, Some(1_060), backward()), true)],
                12_000,
                Kind::WaitedOn,
                vec![1],
                "hang: rank 1 (node n0, local rank 1) made no progress since t1059; main thread in ddp.py:15 fetch_batch \
                 (time.sleep(3600)); the other 3 ranks wait on it in _engine_run_backward (graph.py:1113) since t1060",
            ),
            // Two ranks held up, one waiting: it waits on them; where the waits are unknown (an older agent's
            // summary, no stack), they count neither way.
            (
                vec![waits(rank(0, Some(1_060), reduce()), true), waits(rank(1, Some(1_059), fetch()), false),
                     waits(rank(2, Some(1_061), lock()), false), rank(3, Some(1_060), reduce())],
                12_000,
                Kind::WaitedOn,
                vec![1, 2],
                "hang: rank 1 (node n0, local rank 1) made no progress since t1059; main thread in ddp.py:15 fetch_batch \
                 (time.sleep(3600)); rank 2 (node n1, local rank 0) made no progress since t1061; main thread in \
                 hang_train.py:70 wait_lock (LOCK.acquire()); the other rank waits on them in all_reduce \
                 (distributed_c10d.py:2501) since t1060",
            ),
            // Every rank waits (mismatched collectives): job-wide.
            (
                vec![waits(rank(0, Some(1_000), reduce()), true), waits(rank(1, Some(1_001), backward()), true)],
                12_000,
                Kind::JobWide,
                vec![0, 1],
                "hang: job-wide: no rank made progress since t1001; rank 0 in all_reduce (distributed_c10d.py:2501); \
                 rank 1 in _engine_run_backward (graph.py:1113)",
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

    /// A frame of a capture: `function@path:line`.
    fn at(spec: &str) -> Frame {
        let (function, rest) = spec.split_once('@').expect("function@path:line");
        let (file, line) = rest.rsplit_once(':').expect("path:line");
        Frame { function: function.into(), file: file.into(), line: line.parse().expect("line"), code: None }
    }

    #[test]
    fn the_named_frame_is_the_innermost_of_the_jobs_own_code() {
        const WAIT: &str = "Condition.wait@/usr/lib/python3.11/threading.py:327";
        const EVENT: &str = "Event.wait@/usr/lib/python3.11/threading.py:629";
        const TRAIN: &str = "fetch_shard@/job/train.py:88";
        const MAIN: &str = "<module>@/job/train.py:120";
        // (the stack, innermost first; the frame named and the one it is blocked in, as `file:line function`)
        type Case = (&'static [&'static str], Option<(&'static str, &'static str)>);
        let cases: &[Case] = &[
            // Threading's waits (Event, Queue, Thread.join, Future.result): the script's frame above them.
            (&[WAIT, EVENT, TRAIN, MAIN], Some(("train.py:88 fetch_shard", "threading.py:327 Condition.wait"))),
            (
                &["Queue.get@/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py:171", TRAIN],
                Some(("train.py:88 fetch_shard", "queue.py:171 Queue.get")),
            ),
            (
                &["Thread.join@/opt/conda/lib64/python3.13t/threading.py:1092", TRAIN],
                Some(("train.py:88 fetch_shard", "threading.py:1092 Thread.join")),
            ),
            // A package (site-packages, Debian's dist-packages), its own wrappers, the script above.
            (
                &[
                    "all_reduce@/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2501",
                    "wrapper@/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:79",
                    "train_step@/job/train.py:60",
                ],
                Some(("train.py:60 train_step", "distributed_c10d.py:2501 all_reduce")),
            ),
            (
                &["get@/usr/lib/python3/dist-packages/redis/client.py:10", "load@job/train.py:5"],
                Some(("train.py:5 load", "client.py:10 get")),
            ),
            // Frozen modules are the standard library's; `<string>` code has no file of the job's.
            (
                &["_find_and_load@<frozen importlib._bootstrap>:1176", "<module>@<string>:3", MAIN],
                Some(("train.py:120 <module>", "<frozen importlib._bootstrap>:1176 _find_and_load")),
            ),
            // The script's own frame innermost (time.sleep, os.read, a lock: C calls below it): that one.
            (&[TRAIN, MAIN], None),
            // None of the job's own: the innermost.
            (&[WAIT, EVENT, "run_module@/usr/lib/python3.11/runpy.py:226"], None),
            (&[], None),
            // Directories that only look like the standard library's are the job's.
            (&["f@/home/me/lib/python3/x.py:1", TRAIN], None),
            (&["f@/home/me/lib/pythonic3.11/x.py:1", TRAIN], None),
            (&["f@/home/me/python3.11/x.py:1", TRAIN], None),
        ];
        for (stack, want) in cases {
            let frames: Vec<Frame> = stack.iter().map(|s| at(s)).collect();
            let got = own_frame(&frames).map(|own| (own.short(), frames[0].short()));
            let want = want.map(|(own, below)| (own.to_string(), below.to_string()));
            assert_eq!(got, want, "{stack:?}");
        }
    }

    #[test]
    fn the_verdict_names_the_jobs_frame_and_the_one_it_is_blocked_in() {
        let wait = || frame("Condition.wait", "threading.py", 327, Some("waiter.acquire()"));
        let own = |line| frame("fetch_shard", "train.py", line, Some("ready.wait()"));
        let blocked = |rank_: u32, last: u64, line: i32| {
            let mut r = rank(rank_, Some(last), wait());
            r.own_frame = Some(own(line));
            r
        };
        let v = judge(&[blocked(0, 1_500, 88), blocked(1, 1_000, 90)], 12_000, 10_000, &clock);
        assert_eq!(
            v.line,
            "hang: rank 1 (node n0, local rank 1) made no progress since t1000; main thread in train.py:90 \
             fetch_shard (ready.wait()) → threading.py:327 Condition.wait; the other rank waits in fetch_shard \
             (train.py:88) → Condition.wait (threading.py:327) since t1500"
        );
        let v = judge(&[blocked(0, 1_000, 88), blocked(1, 1_001, 88), blocked(2, 1_000, 90)], 12_000, 10_000, &clock);
        assert_eq!(
            v.line,
            "hang: job-wide: no rank made progress since t1001; ranks 0-1 in fetch_shard (train.py:88) → \
             Condition.wait (threading.py:327); rank 2 in fetch_shard (train.py:90) → Condition.wait (threading.py:327)"
        );
        // The job's frame without its code (a file not readable here): the short form.
        let mut r = blocked(0, 1_000, 88);
        r.own_frame = Some(frame("fetch_shard", "train.py", 88, None));
        assert_eq!(where_in(&r, true), "in fetch_shard (train.py:88) → Condition.wait (threading.py:327)");
    }

    #[test]
    fn a_summary_without_the_jobs_frame_reads_as_before() {
        // As an agent without `own_frame` hands it in.
        let old = r#"{"rank":3,"local_rank":1,"node":"n1","group_rank":1,"last_progress_ms":5,"marks":2,
            "gap_ms":null,"state":"S","frames":[{"function":"f","file":"t.py","line":4,"code":"x()"}],"error":null}"#;
        let r: RankSummary = serde_json::from_str(old).expect("an old summary");
        assert_eq!(r.own_frame, None);
        assert_eq!(where_in(&r, true), "in t.py:4 f (x())");
        assert!(!serde_json::to_string(&r).expect("json").contains("own_frame"));
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
