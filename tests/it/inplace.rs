//! In place (`--in-place on`, the default): workers that use `muster_inplace` keep their processes across
//! a re-formation; only what failed starts again. `tests/fixtures/inplace_train.py` is a DDP job written
//! with the API: it records each call of its training function (rank, pid, round) and its final weights.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use common::cluster::*;
use common::gpus::FakeNode;
use common::*;

/// `rank -> pid` of the calls of the training function in `round` order: the first call of each rank and
/// the calls after each re-formation.
fn calls(dir: &Path) -> Vec<(u32, i32, u64)> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // The round is `-` under torchrun.
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, f.get(2)?.parse().unwrap_or(0)))
        })
        .collect()
}

/// Each rank's final weights, exactly.
fn finals(dir: &Path, world: u32) -> Vec<String> {
    (0..world).map(|r| std::fs::read_to_string(dir.join(format!("final-{r}"))).unwrap_or_default()).collect()
}

/// A job of the fixture (`steps`, holding at the steps `holds`): its nodes' arguments and environment.
struct Job<'a> {
    dir: &'a Path,
    nnodes: &'a str,
    holds: &'a str,
    run_id: String,
    extra: Vec<String>,
}

impl Job<'_> {
    fn new<'a>(dir: &'a Path, nnodes: &'a str, holds: &'a str, name: &str) -> Job<'a> {
        Job { dir, nnodes, holds, run_id: format!("{name}{}", std::process::id()), extra: vec!["--max-restarts=3".into()] }
    }

    /// Agent `node` (`a` hosts the store; the others reach it at `endpoint`), with `envs`.
    fn agent(&self, node: &str, endpoint: &str, envs: &[(&str, String)]) -> Agent {
        let script = [self.dir.display().to_string(), STEPS.to_string(), self.holds.to_string()];
        let args = two_worker_node(node, endpoint, self.nnodes, &self.run_id, &self.extra).script(fixture("inplace_train.py")).args(script);
        Agent::start_with_env(node, &args.build(), envs)
    }

    /// Agents a and b.
    fn start(&self) -> (Agent, Agent) {
        let a = self.agent("a", "127.0.0.1:0", &[]);
        let b = self.agent("b", &format!("127.0.0.1:{}", a.hosted_port()), &[]);
        (a, b)
    }
}

/// The arguments of agent `node` of an in-place test job, two workers (`a` hosts the store; the others reach
/// it at `endpoint`), before its script.
pub(crate) fn two_worker_node(node: &str, endpoint: &str, nnodes: &str, run_id: &str, extra: &[String]) -> AgentArgs {
    let host = if node == "a" { "is_host=1," } else { "" };
    AgentArgs::c10d(nnodes, endpoint)
        .nproc(2)
        // Both nodes in the first round (MAX seals it at once); a shrink waits for no last call.
        .conf(format!("{host}last_call_timeout=30"))
        .run_id(run_id)
        .ranked(node)
        .opts(extra)
}

/// Two agents of two workers each running the fixture (`steps`, holding at `holds`).
fn two_nodes(dir: &Path, holds: &str, name: &str) -> (Agent, Agent) {
    Job::new(dir, "2", holds, name).start()
}

const STEPS: u32 = 40;

/// A worker SIGKILLed mid-training: the other three keep their processes and re-form with a new rank 1,
/// which receives the state; the job ends with the weights of a run without the fault, on every rank.
#[test]
fn a_dead_worker_starts_again_and_the_others_keep_their_processes() {
    let reference = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(reference.path(), "-1", "ref");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    let want = finals(reference.path(), 4);
    assert!(want.iter().all(|w| !w.is_empty() && *w == want[0]), "the fault-free run's ranks agree: {want:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(dir.path(), "20", "kill");
    assert!(eventually(LONG, || all_at(dir.path(), 0..4, 20)), "every rank reached step 20\n{}\n---\n{}", a.log(), b.log());
    let first: BTreeMap<u32, i32> = calls(dir.path()).into_iter().map(|(rank, pid, _)| (rank, pid)).collect();
    assert_eq!(first.len(), 4, "{first:?}");
    // SAFETY: a worker of this test's own job.
    unsafe { libc::kill(first[&1], libc::SIGKILL) };
    go(dir.path(), 20);
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

/// Whether every rank of `ranks` wrote step `step` (it waits there for the test).
pub(crate) fn all_at(dir: &Path, ranks: std::ops::Range<u32>, step: u32) -> bool {
    ranks.into_iter().all(|r| std::fs::read_to_string(dir.join(format!("step-{r}"))).is_ok_and(|s| s == step.to_string()))
}

fn go(dir: &Path, step: u32) {
    std::fs::write(dir.join(format!("go-{step}")), "").expect("go");
}

/// `--nnodes 1:2`: node b's agent is SIGKILLed (its workers die with it): a's two workers keep their
/// processes and train on in a world of 2. Then a new node c joins: its workers set up while a's train on,
/// then a world of 4 again, a's workers still in their processes, c's ranks given the state, every rank
/// ending with the same weights.
#[test]
fn a_lost_node_and_a_joiner_leave_the_survivors_training_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = Job::new(dir.path(), "1:2", "20,30", "lost");
    let (mut a, mut b) = job.start();
    assert!(eventually(LONG, || all_at(dir.path(), 0..4, 20)), "every rank reached step 20\n{}\n---\n{}", a.log(), b.log());
    let first = calls(dir.path());
    let a_pids: Vec<i32> = first.iter().filter(|(rank, _, _)| *rank < 2).map(|(_, pid, _)| *pid).collect();
    b.guard.0.kill().expect("SIGKILL b's agent");
    go(dir.path(), 20);
    assert!(eventually(LONG, || all_at(dir.path(), 0..2, 30)), "a's ranks trained on to step 30\n{}", a.log());
    let all = calls(dir.path());
    let shrunk: Vec<(u32, i32)> = all.iter().skip(4).map(|(rank, pid, _)| (*rank, *pid)).collect();
    assert_eq!(shrunk.len(), 2, "a's two workers ran the training function again: {all:?}\n{}", a.log());
    assert!(shrunk.iter().all(|(rank, pid)| *rank < 2 && a_pids.contains(pid)), "a's workers kept their processes: {all:?}");

    let shrunk_round = all[4].2;
    // c's workers take seconds to set up (a checkpoint's load, say): a's train on meanwhile.
    let mut c = job.agent("c", &format!("127.0.0.1:{}", a.hosted_port()), &[("INPLACE_PRELUDE_S", "3".into())]);
    assert!(eventually(LONG, || calls(dir.path()).len() == 10), "a world of 4 again: {:?}\n{}\n---\n{}", calls(dir.path()), a.log(), c.log());
    let grown: Vec<(u32, i32)> = calls(dir.path()).iter().skip(6).map(|(rank, pid, _)| (*rank, *pid)).collect();
    for (rank, pid) in &grown {
        assert_eq!(*rank < 2, a_pids.contains(pid), "a's workers kept ranks 0 and 1, c's are new: {grown:?}");
    }
    // Not paused for the joiner's start: a's ranks were still at work in world 2 after c's workers were set up.
    let time = |name: String| std::fs::read_to_string(dir.path().join(&name)).ok().and_then(|t| t.parse::<f64>().ok());
    let ready: Vec<f64> = grown.iter().filter(|(rank, _)| *rank >= 2).filter_map(|(_, pid)| time(format!("ready-{pid}"))).collect();
    let last_held: Vec<f64> = (0..2).filter_map(|rank| time(format!("held-{rank}-{shrunk_round}"))).collect();
    assert!(ready.len() == 2 && last_held.len() == 2, "c's set-up times {ready:?}, a's last waits in round {shrunk_round} {last_held:?}");
    assert!(
        ready.iter().all(|r| last_held.iter().all(|h| r < h)),
        "a's ranks stopped for c's start: c's set-up ended at {ready:?}, a's ranks last trained in world 2 at {last_held:?}\n{}\n---\n{}",
        a.log(),
        c.log()
    );
    // `muster status`: a joined two rounds in place (the shrink, the growth), c one (its workers started ahead).
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let out = run(muster().args(["status", "--rdzv-endpoint", &endpoint, "--rdzv-id", &job.run_id, "--format", "json"]), LONG);
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    let rounds_in_place = |agent: &Agent| {
        let id = format!("_{}_", agent.guard.0.id());
        status["nodes"].as_array().and_then(|n| n.iter().find(|r| r["node"].as_str().is_some_and(|s| s.contains(&id))))
            .and_then(|r| r["in_place"].as_u64())
    };
    assert_eq!((rounds_in_place(&a), rounds_in_place(&c)), (Some(2), Some(1)), "{status}");
    go(dir.path(), 30);
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(c.exit_code(LONG), Some(0), "{}", c.log());
    let got = finals(dir.path(), 4);
    assert!(!got[0].is_empty() && got.iter().all(|w| *w == got[0]), "every rank ends with the same weights: {got:?}");
}

/// The same script under torchrun, and under muster with `--in-place off`: `run` calls the training
/// function once per process; with `--in-place off` a dead worker restarts every worker, as torchrun does.
#[test]
fn without_in_place_the_script_runs_as_under_torchrun() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Under torchrun the API comes from its own folder (installed with `pip install src/inplace/python`).
    let api = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/inplace/python");
    let out = torchrun()
        .env("PYTHONPATH", api)
        .args(["--standalone", "--nproc-per-node=2"])
        .arg(fixture("inplace_train.py"))
        .arg(dir.path())
        .args([STEPS.to_string(), "-1".into()])
        .output()
        .expect("torchrun");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(calls(dir.path()).len(), 2, "one call per rank: {:?}", calls(dir.path()));
    let got = finals(dir.path(), 2);
    assert!(!got[0].is_empty() && got[0] == got[1], "{got:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::new(dir.path(), "2", "20", "off");
    job.extra.push("--in-place=off".into());
    let (mut a, mut b) = job.start();
    assert!(eventually(LONG, || all_at(dir.path(), 0..4, 20)), "every rank reached step 20\n{}\n---\n{}", a.log(), b.log());
    let first: BTreeMap<u32, i32> = calls(dir.path()).into_iter().map(|(rank, pid, _)| (rank, pid)).collect();
    // SAFETY: a worker of this test's own job.
    unsafe { libc::kill(first[&1], libc::SIGKILL) };
    go(dir.path(), 20);
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    let again: BTreeMap<u32, i32> = calls(dir.path()).into_iter().skip(4).map(|(rank, pid, _)| (rank, pid)).collect();
    assert_eq!(again.len(), 4, "{:?}", calls(dir.path()));
    assert!(again.iter().all(|(rank, pid)| first[rank] != *pid), "every worker started again: {first:?} {again:?}");
}

/// A worker stuck where it cannot re-form (rank 2 asleep outside any collective) when rank 1 dies: it is
/// killed after `--in-place-timeout` and starts again cold; the others stay in place and the job ends.
#[test]
fn a_worker_that_does_not_reform_is_started_cold_after_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::new(dir.path(), "2", "20", "stuck");
    // Above a cold start beside another test on 2 cores (the replacements of ranks 1 and 2 import torch while
    // the kept ranks wait for them), so that only the stuck rank is stopped.
    job.extra.push("--in-place-timeout=20".into());
    let stuck = [("INPLACE_STUCK", "2:20".to_string())];
    let a = job.agent("a", "127.0.0.1:0", &stuck);
    let b = job.agent("b", &format!("127.0.0.1:{}", a.hosted_port()), &stuck);
    let (mut a, mut b) = (a, b);
    assert!(eventually(LONG, || all_at(dir.path(), 0..4, 20)), "every rank reached step 20\n{}\n---\n{}", a.log(), b.log());
    let first: BTreeMap<u32, i32> = calls(dir.path()).into_iter().map(|(rank, pid, _)| (rank, pid)).collect();
    // SAFETY: a worker of this test's own job.
    unsafe { libc::kill(first[&1], libc::SIGKILL) };
    go(dir.path(), 20);
    assert_eq!(a.exit_code(LONG), Some(0), "{}\n---\n{}", a.log(), b.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    let logs = format!("{}\n---\n{}", a.log(), b.log());
    assert!(logs.contains(&format!("worker process(es) {} did not re-form in place", first[&2])), "{logs}");
    let last: BTreeMap<u32, i32> = calls(dir.path()).into_iter().map(|(rank, pid, _)| (rank, pid)).collect();
    assert!(last[&0] == first[&0] && last[&3] == first[&3], "ranks 0 and 3 stayed in place: {first:?} {last:?}\n{logs}");
    assert!(last[&1] != first[&1] && last[&2] != first[&2], "ranks 1 and 2 started again: {first:?} {last:?}\n{logs}");
    let got = finals(dir.path(), 4);
    assert!(!got[0].is_empty() && got.iter().all(|w| *w == got[0]), "{got:?}");
}

/// XID 79 on one of node b's (fake) GPUs: b drains (exit 75) and a's workers keep their processes.
#[test]
fn a_node_drained_by_xid_79_leaves_the_others_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a_gpus, b_gpus) = (FakeNode::new(dir.path(), "a", 2, &[]), FakeNode::new(dir.path(), "b", 2, &[]));
    let job = Job::new(dir.path(), "1:2", "20", "xid");
    let mut a = job.agent("a", "127.0.0.1:0", &a_gpus.env());
    let mut b = job.agent("b", &format!("127.0.0.1:{}", a.hosted_port()), &b_gpus.env());
    assert!(eventually(LONG, || all_at(dir.path(), 0..4, 20)), "every rank reached step 20\n{}\n---\n{}", a.log(), b.log());
    let first = calls(dir.path());
    b_gpus.inject(1, "xid 1 79");
    assert_eq!(b.exit_code(LONG), Some(75), "{}", b.log());
    go(dir.path(), 20);
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    let a_pids: Vec<i32> = first.iter().filter(|(rank, _, _)| *rank < 2).map(|(_, pid, _)| *pid).collect();
    let again: Vec<(u32, i32)> = calls(dir.path()).iter().skip(4).map(|(rank, pid, _)| (*rank, *pid)).collect();
    assert!(again.len() == 2 && again.iter().all(|(_, pid)| a_pids.contains(pid)), "a's workers stayed in place: {first:?} {again:?}\n{}", a.log());
}

/// `examples/train_inplace.py` as a user runs it (`--standalone`, a `DataLoader` over a `DistributedSampler`,
/// a checkpoint): rank 1 SIGKILLed mid-training; rank 0 keeps its process, the job finishes its steps.
#[test]
fn the_example_re_forms_in_place_when_a_worker_dies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let steps = dir.path().join("steps");
    let args: Vec<String> = vec![
        "--standalone".into(),
        "--nproc-per-node=2".into(),
        "--max-restarts=1".into(),
        example("train_inplace.py").display().to_string(),
        "--steps=150".into(),
        "--step-sleep=0.05".into(),
        "--backbone-mb=1".into(),
        format!("--ckpt-dir={}", dir.path().display()),
        format!("--step-log={}", steps.display()),
    ];
    let mut agent = Agent::start("a", &args);
    let log = || std::fs::read_to_string(&steps).unwrap_or_default();
    // (rank, pid) of each start line, and the last step.
    let starts = || -> Vec<(String, String)> {
        log().lines().filter_map(|l| l.strip_prefix("start ")).map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1).unwrap_or(&"").to_string(), f.get(2).unwrap_or(&"").to_string())
        }).collect()
    };
    let step = || log().lines().rev().find_map(|l| l.strip_prefix("step ")?.split_whitespace().nth(1)?.parse::<u32>().ok());
    assert!(eventually(LONG, || step().is_some_and(|s| s >= 20)), "no step 20\n{}", agent.log());
    let first = starts();
    let pid_of = |rank: &str| first.iter().find(|(r, _)| r == rank).map(|(_, p)| p.clone()).expect("a start line");
    let victim: i32 = pid_of("1").parse().expect("a pid");
    // SAFETY: a worker of this test's own job.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
    let all = starts();
    assert_eq!(all.len(), 4, "each rank trained twice: {all:?}\n{}", agent.log());
    assert_eq!(all[2..].iter().find(|(r, _)| r == "0").map(|(_, p)| p.clone()), Some(pid_of("0")), "rank 0 kept its process: {all:?}");
    assert_eq!(step(), Some(150), "the job finished its steps\n{}", agent.log());
    assert!(agent.log().contains("re-formed in place"), "{}", agent.log());
}
