//! In place (`--in-place on`, the default): workers that use `muster_inplace` keep their processes across
//! a re-formation; only what failed starts again. `tests/fixtures/inplace_train.py` is a DDP job written
//! with the API: it records each call of its training function (rank, pid, round) and its final weights.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::cluster::*;
use common::*;

/// `rank -> pid` of the calls of the training function in `round` order: the first call of each rank and
/// the calls after each re-formation.
fn calls(dir: &Path) -> Vec<(u32, i32, u64)> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// Each rank's final weights, exactly.
fn finals(dir: &Path, world: u32) -> Vec<String> {
    (0..world).map(|r| std::fs::read_to_string(dir.join(format!("final-{r}"))).unwrap_or_default()).collect()
}

/// Two agents of two workers each running the fixture (`steps`, holding at step `hold`).
fn two_nodes(dir: &Path, steps: u32, hold: i64, run_id: &str) -> (Agent, Agent) {
    let args = |node: &str, endpoint: &str| {
        let host = if node == "a" { "is_host=1," } else { "" };
        AgentArgs::c10d(2, endpoint)
            .nproc(2)
            .conf(format!("{host}last_call_timeout=1"))
            .run_id(run_id)
            .opt("--max-restarts=2")
            .script(fixture("inplace_train.py"))
            .arg(dir)
            .arg(steps.to_string())
            .arg(hold.to_string())
            .build()
    };
    let a = Agent::start("a", &args("a", "127.0.0.1:0"));
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let b = Agent::start("b", &args("b", &endpoint));
    (a, b)
}

const STEPS: u32 = 40;
const HOLD: i64 = 20;

/// A worker SIGKILLed mid-training: the other three keep their processes and re-form with a new rank 1,
/// which receives the state; the job ends with the weights of a run without the fault, on every rank.
#[test]
fn a_dead_worker_starts_again_and_the_others_keep_their_processes() {
    let reference = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(reference.path(), STEPS, -1, &format!("ref{}", std::process::id()));
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    let want = finals(reference.path(), 4);
    assert!(want.iter().all(|w| !w.is_empty() && *w == want[0]), "the fault-free run's ranks agree: {want:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(dir.path(), STEPS, HOLD, &format!("kill{}", std::process::id()));
    let at_hold = || (0..4).all(|r| std::fs::read_to_string(dir.path().join(format!("step-{r}"))).is_ok_and(|s| s == HOLD.to_string()));
    assert!(eventually(LONG, at_hold), "every rank reached step {HOLD}\n{}\n---\n{}", a.log(), b.log());
    let first: BTreeMap<u32, i32> = calls(dir.path()).into_iter().map(|(rank, pid, _)| (rank, pid)).collect();
    assert_eq!(first.len(), 4, "{first:?}");
    // SAFETY: a worker of this test's own job.
    unsafe { libc::kill(first[&1], libc::SIGKILL) };
    std::fs::write(dir.path().join("go"), "").expect("go");
    assert_eq!(a.exit_code(LONG), Some(0), "{}\n---\n{}", a.log(), b.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());

    let all = calls(dir.path());
    let logs = format!("{}\n---\n{}", a.log(), b.log());
    let again: BTreeMap<u32, i32> = all.iter().skip(4).map(|(rank, pid, _)| (*rank, *pid)).collect();
    assert_eq!(again.len(), 4, "every rank ran the training function again once: {all:?}\n{logs}");
    for rank in [0, 2, 3] {
        assert_eq!(again[&rank], first[&rank], "rank {rank} kept its process: {all:?}\n{logs}");
    }
    assert_ne!(again[&1], first[&1], "rank 1 started again: {all:?}");
    let got = finals(dir.path(), 4);
    assert!(got.iter().all(|w| *w == got[0]), "every rank holds the same weights: {got:?}");
    assert_close(&got[0], &want[0]);
}

/// The same weights as the run without the fault, to float32 rounding: the re-formed DDP module's first
/// step reduces its gradients in its initial bucket order (the run without the fault did so only at step
/// 0), which sums each element across ranks in another order.
fn assert_close(got: &str, want: &str) {
    let parse = |s: &str| s.split_whitespace().map(|w| w.parse::<f64>().expect("a float")).collect::<Vec<f64>>();
    let (got, want) = (parse(got), parse(want));
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-2), "weight {i}: {g} against {w} without the fault");
    }
}
