//! The straggler judgement, pure: what one stack sample says (waiting on the others, or working, and
//! where), and which ranks of a window set the job's pace.
//!
//! In a synchronous job every rank waits for the slowest at each collective: the slowest rank is the one
//! that almost never waits while the others mostly do. A rank is named when, over one window, its share of
//! samples spent waiting is at most [`LAG_RATIO`] of the job's median share, and [`LAG_SIGMAS`] standard errors
//! of its own share below it (sampling noise names nobody), while that median is at least [`MIN_MEDIAN_WAIT`]
//! (a job whose ranks hardly wait has no straggler to find), or when its GPU's clocks
//! were slowed (hardware slowdown, thermal, power brake) in most samples, or ran at under
//! [`SLOW_CLOCK_RATIO`] of both its node's and the job's median SM clock.

use serde::{Deserialize, Serialize};

use crate::hang::capture::Frame;
use crate::hang::wait::{waits_on_peers, ThreadState};

/// A rank waits this much less than the median at most to be named: half. On a loaded host even a straggler
/// waits now and then (its peers lose the CPU too), so its share can reach 45% beside a median of 97%.
pub const LAG_RATIO: f64 = 0.5;
/// And this many standard errors of its own share below the median: `n` samples of a rank that waits as
/// the median does, `p`, count `p·n ± sqrt(p(1-p)n)` waits by chance; below three of those is not chance.
pub const LAG_SIGMAS: f64 = 3.0;
/// The job's median wait share below which nobody is named.
pub const MIN_MEDIAN_WAIT: f64 = 0.25;
/// Samples a rank needs in a window to be judged.
pub const MIN_SAMPLES: u32 = 8;
/// An SM clock under this share of its node's and the job's median is slow.
pub const SLOW_CLOCK_RATIO: f64 = 0.75;

/// What one sample of a rank's main thread says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sample {
    /// Still joining the process group (`init_process_group`) or building its distributed model (DDP's
    /// constructor, FSDP2's first-forward initialisation): not the job's pace yet; not counted.
    Starting,
    /// In a collective or a synchronisation: waiting on the other ranks (or its GPU).
    Waiting,
    /// Anything else; the innermost frame of the job's own code, where there is one.
    Working(Option<String>),
}

/// Classifies a main thread's frames (innermost first) in `state`: in `init_process_group` the rank is
/// starting; waiting on the other ranks as `hang::wait` tells it (a collective, a CUDA sync, or asleep below a
/// frame of torch's: DDP's reducer in `backward`); the rest is the rank's own work, a data loader's wait
/// included (a rank starved of data is slow by itself).
pub fn classify(frames: &[Frame], state: ThreadState) -> Sample {
    if frames.iter().any(starting) {
        return Sample::Starting;
    }
    if waits_on_peers(frames, state) {
        return Sample::Waiting;
    }
    let own = frames.iter().find(|f| crate::hang::verdict::is_own(&f.file)).map(Frame::short);
    Sample::Working(own)
}

/// A frame of the start: joining the process group, or DDP's and FSDP2's set-up (their first collectives
/// wait for the slowest rank to start, which is no one's pace).
fn starting(f: &Frame) -> bool {
    f.function == "init_process_group"
        || f.file.ends_with("torch/distributed/rendezvous.py")
        || (f.function == "__init__" && f.file.ends_with("torch/nn/parallel/distributed.py"))
        || (f.function == "_lazy_init" && f.file.contains("torch/distributed/fsdp/"))
}

/// One rank's window, as its agent's heartbeat carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankWindow {
    pub rank: u32,
    pub local_rank: u32,
    /// Stack samples taken, and how many were waiting; besides them, the samples still starting (joining
    /// the process group, building the distributed model), which count for nothing but this.
    pub samples: u32,
    pub waiting: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub starting: u32,
    /// Where it worked most: its innermost own frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<String>,
    /// Its GPU, that GPU's median SM clock, and the slowing clock reasons seen in most samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowed: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RankWindow {
    pub fn wait_share(&self) -> Option<f64> {
        (self.samples >= MIN_SAMPLES).then(|| f64::from(self.waiting) / f64::from(self.samples))
    }
}

/// One agent's window: which one (`unix time / window`, the same for every agent), its node's address,
/// its ranks; `denied`: its stacks cannot be read (ptrace refused), so only its GPUs are judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeWindow {
    pub window: u64,
    pub node: String,
    pub id: String,
    pub group_rank: u32,
    pub ranks: Vec<RankWindow>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub denied: bool,
}

/// A rank named as setting the job's pace.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggler {
    pub rank: u32,
    pub local_rank: u32,
    pub node: String,
    pub group_rank: u32,
    /// The agent's id (whose node drains, under `--on-straggler drain`).
    pub id: String,
    /// The rest of the line: what it showed.
    pub why: String,
}

impl Straggler {
    pub fn line(&self) -> String {
        format!(
            "straggler: rank {} on node {} (group rank {}, local rank {}) {}",
            self.rank, self.node, self.group_rank, self.local_rank, self.why
        )
    }
}

/// Whether a rank that waits `share` of its `samples` lags behind a median share of `med`.
fn lags(share: f64, samples: u32, med: f64) -> bool {
    let standard_error = (med * (1.0 - med) / f64::from(samples.max(1))).sqrt();
    share <= LAG_RATIO * med && share <= med - LAG_SIGMAS * standard_error
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// The job's median wait share over one window (None: fewer than two ranks judged by their stacks).
pub fn median_wait(windows: &[NodeWindow]) -> Option<f64> {
    let shares: Vec<f64> =
        windows.iter().filter(|w| !w.denied).flat_map(|w| w.ranks.iter().filter_map(RankWindow::wait_share)).collect();
    let n = shares.len();
    median(shares).filter(|_| n >= 2)
}

/// Every rank of `windows` (one window of the job) that sets its pace, by rank.
pub fn judge(windows: &[NodeWindow]) -> Vec<Straggler> {
    let ranks = || windows.iter().flat_map(|w| w.ranks.iter().map(move |r| (w, r)));
    let median_wait = median_wait(windows);
    let clocks = |node: Option<&str>| median(ranks().filter(|(w, _)| node.is_none_or(|n| w.id == n)).filter_map(|(_, r)| r.sm_mhz.map(f64::from)).collect());
    let job_mhz = clocks(None);
    let mut named = Vec::new();
    for (w, r) in ranks() {
        let name = |why: String| Straggler {
            rank: r.rank,
            local_rank: r.local_rank,
            node: w.node.clone(),
            group_rank: w.group_rank,
            id: w.id.clone(),
            why,
        };
        let gpu = r.gpu.map(|g| format!("GPU {g}")).unwrap_or_else(|| "its GPU".into());
        if let (Some(slowed), Some(mhz)) = (&r.slowed, r.sm_mhz) {
            let job = job_mhz.map(|m| format!(", the job's median {m:.0} MHz")).unwrap_or_default();
            named.push(name(format!("runs on {gpu}, slowed ({slowed}) at {mhz} MHz{job}")));
            continue;
        }
        if let (Some(mhz), Some(job), Some(node)) = (r.sm_mhz, job_mhz, clocks(Some(&w.id))) {
            let m = f64::from(mhz);
            if m < SLOW_CLOCK_RATIO * job && m < SLOW_CLOCK_RATIO * node {
                named.push(name(format!("runs on {gpu} at {mhz} MHz, its node's median {node:.0} MHz, the job's {job:.0} MHz")));
                continue;
            }
        }
        let (Some(share), Some(med)) = (r.wait_share().filter(|_| !w.denied), median_wait) else { continue };
        if med >= MIN_MEDIAN_WAIT && lags(share, r.samples, med) {
            let place = r.frame.as_ref().map(|f| format!("; it works in {f}")).unwrap_or_default();
            named.push(name(format!("waits {} of the time, the job's median {}{place}", pct(share), pct(med))));
        }
    }
    named.sort_by_key(|s| s.rank);
    named
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str) -> Frame {
        Frame { function: function.into(), file: file.into(), line: 10, code: None }
    }

    #[test]
    fn a_sample_is_starting_waiting_or_working_where() {
        let torch = "/venv/lib/python3.12/site-packages/torch";
        let dist = frame("all_reduce", &format!("{torch}/distributed/distributed_c10d.py"));
        let backward = frame("_engine_run_backward", &format!("{torch}/autograd/graph.py"));
        let own = frame("heavy_step", "/job/train.py");
        let queue = frame("get", "/usr/lib/python3.12/queue.py");
        let working = || Sample::Working(Some("train.py:10 heavy_step".into()));
        use ThreadState::{Asleep, Other, Running};
        // (frames innermost first, the thread's state, what the sample is); `hang::wait` has the waits' table.
        let table = [
            (vec![dist.clone(), own.clone()], Asleep, Sample::Waiting),
            (vec![frame("wrapper", &format!("{torch}/distributed/c10d_logger.py")), dist, own.clone()], Running, Sample::Waiting),
            (vec![backward.clone(), own.clone()], Asleep, Sample::Waiting),
            (vec![backward.clone(), own.clone()], Running, working()),
            (vec![backward, own.clone()], Other, working()),
            (vec![frame("init_process_group", &format!("{torch}/distributed/c10d_logger.py")), own.clone()], Asleep, Sample::Starting),
            (vec![frame("_create_c10d_store", &format!("{torch}/distributed/rendezvous.py")), own.clone()], Asleep, Sample::Starting),
            (vec![frame("broadcast", &format!("{torch}/distributed/distributed_c10d.py")), frame("__init__", &format!("{torch}/nn/parallel/distributed.py")), own.clone()], Asleep, Sample::Starting),
            (vec![frame("_lazy_init", &format!("{torch}/distributed/fsdp/_fully_shard/_fsdp_state.py")), own.clone()], Asleep, Sample::Starting),
            (vec![own.clone()], Asleep, working()),
            (vec![queue, own], Asleep, working()),
            (vec![frame("matmul", &format!("{torch}/functional.py"))], Running, Sample::Working(None)),
        ];
        for (frames, state, want) in table {
            assert_eq!(classify(&frames, state), want, "{frames:?} {state:?}");
        }
    }

    #[test]
    fn a_rank_lags_at_half_the_median_and_beyond_its_sampling_noise() {
        // (waits of 20 samples, the median share, lagging)
        let table = [
            // A data-slow rank on a loaded host, and the first window of training, still its start's.
            (9, 0.975, true),
            (7, 0.85, true),
            (12, 0.85, false),
            // Half the median, but within three standard errors of it (0.11 at 20 samples of 0.5).
            (4, 0.5, false),
            (3, 0.5, true),
            // A balanced job's rank that waited little by chance.
            (2, 0.3, false),
            (0, 0.3, false),
        ];
        for (waits, med, want) in table {
            assert_eq!(lags(f64::from(waits) / 20.0, 20, med), want, "{waits} of 20 against {med}");
        }
    }

    fn rank(rank: u32, waiting: u32) -> RankWindow {
        RankWindow { rank, local_rank: rank % 2, samples: 100, waiting, starting: 0, frame: Some("train.py:40 step".into()), gpu: None, sm_mhz: None, slowed: None }
    }

    fn nodes(ranks: Vec<RankWindow>) -> Vec<NodeWindow> {
        let mut out: Vec<NodeWindow> = Vec::new();
        for r in ranks {
            let id = format!("n{}", r.rank / 2);
            match out.iter_mut().find(|w| w.id == id) {
                Some(w) => w.ranks.push(r),
                None => out.push(NodeWindow { window: 1, node: format!("host{}", r.rank / 2), id, group_rank: r.rank / 2, ranks: vec![r], denied: false }),
            }
        }
        out
    }

    #[test]
    fn the_rank_that_hardly_waits_while_the_others_mostly_do_is_named() {
        // (each rank's waiting samples of 100, the ranks named)
        let table: &[(&[u32], &[u32])] = &[
            (&[65, 66, 2, 64], &[2]),
            (&[10, 12, 9, 11], &[]),
            (&[40, 45, 50, 38], &[]),
            (&[70, 3, 2, 68], &[1, 2]),
            (&[30, 20], &[]),
            (&[60], &[]),
        ];
        for (waits, want) in table {
            let ranks = waits.iter().enumerate().map(|(i, w)| rank(i as u32, *w)).collect();
            let got: Vec<u32> = judge(&nodes(ranks)).iter().map(|s| s.rank).collect();
            assert_eq!(&got, want, "{waits:?}");
        }
        let s = &judge(&nodes(vec![rank(0, 65), rank(1, 66), rank(2, 2), rank(3, 64)]))[0];
        assert_eq!(s.line(), "straggler: rank 2 on node host1 (group rank 1, local rank 0) waits 2% of the time, the job's median 64%; it works in train.py:40 step");
    }

    #[test]
    fn too_few_samples_or_unreadable_stacks_judge_nobody_by_stacks() {
        let mut few = vec![rank(0, 60), rank(1, 60), rank(2, 0), rank(3, 60)];
        few[2].samples = MIN_SAMPLES - 1;
        few[2].waiting = 0;
        assert!(judge(&nodes(few)).is_empty());
        let mut denied = nodes(vec![rank(0, 60), rank(1, 60), rank(2, 0), rank(3, 60)]);
        denied[1].denied = true;
        assert!(judge(&denied).is_empty(), "a node whose stacks cannot be read is not judged by them");
    }

    #[test]
    fn a_slowed_or_slow_gpu_is_named() {
        let gpu = |r: u32, mhz: u32, slowed: Option<&str>| RankWindow {
            gpu: Some(r % 2),
            sm_mhz: Some(mhz),
            slowed: slowed.map(str::to_string),
            ..rank(r, 20)
        };
        let slowed = judge(&nodes(vec![gpu(0, 1980, None), gpu(1, 800, Some("HW_THERMAL_SLOWDOWN")), gpu(2, 1980, None)]));
        assert_eq!(slowed.len(), 1);
        assert_eq!(slowed[0].line(), "straggler: rank 1 on node host0 (group rank 0, local rank 1) runs on GPU 1, slowed (HW_THERMAL_SLOWDOWN) at 800 MHz, the job's median 1980 MHz");
        let slow = judge(&nodes(vec![gpu(0, 1980, None), gpu(1, 1000, None), gpu(2, 1980, None), gpu(3, 1950, None)]));
        assert_eq!(slow.iter().map(|s| s.rank).collect::<Vec<_>>(), [1]);
        assert!(slow[0].why.contains("at 1000 MHz, its node's median 1490 MHz, the job's 1965 MHz"), "{}", slow[0].why);
        let even = judge(&nodes(vec![gpu(0, 1980, None), gpu(1, 1900, None)]));
        assert!(even.is_empty());
    }
}
