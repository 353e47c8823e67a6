//! In place for the jobs large models run: DDP, FSDP2 and HSDP written as users write them
//! (`tests/fixtures/inplace_shapes.py`: `fully_shard`, `init_device_mesh`, a DataLoader over a
//! DistributedSampler, AdamW, a DCP checkpoint every 5 steps), 2 agents x 2 workers. A fault never leaves
//! a job that exits 0 with weights other than a fault-free run's: a replicated part comes back from a
//! holder of the same part, and a shard no survivor holds fails every rank with one line and restarts the
//! job cold from its checkpoint. The API's own account of each restore (what it received, sent, copied)
//! says that the ranks that held their part received nothing.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

use common::cluster::*;
use common::*;

use crate::inplace;

const STEPS: u32 = 30;

/// A job of the fixture: its nodes' arguments and environment.
struct Job<'a> {
    dir: &'a Path,
    shape: &'a str,
    nnodes: &'a str,
    holds: &'a str,
    run_id: String,
    extra: Vec<String>,
    env: Vec<(&'static str, String)>,
}

impl Job<'_> {
    fn new<'a>(dir: &'a Path, shape: &'a str, nnodes: &'a str, holds: &'a str, name: &str) -> Job<'a> {
        let run_id = format!("{name}{shape}{}", std::process::id());
        Job { dir, shape, nnodes, holds, run_id, extra: vec!["--max-restarts=3".into()], env: Vec::new() }
    }

    fn agent(&self, node: &str, endpoint: &str) -> Agent {
        let script = [self.dir.display().to_string(), self.shape.to_string(), STEPS.to_string(), self.holds.to_string()];
        let args = inplace::two_worker_node(node, endpoint, self.nnodes, &self.run_id, &self.extra).script(fixture("inplace_shapes.py")).args(script);
        Agent::start_with_env(node, &args.build(), &self.env)
    }

    /// Both nodes started; once every rank waits at step 20, node b's agent SIGKILLed (its workers with it).
    /// Agent a, and each rank's processes until then.
    fn lose_b_at_step_20(&self) -> (Agent, BTreeMap<u32, Vec<i32>>) {
        let (a, mut b) = self.start();
        assert!(eventually(LONG, || inplace::all_at(self.dir, 0..4, 20)), "every rank at step 20\n{}\n---\n{}", a.log(), b.log());
        let first = pids_by_rank(self.dir);
        b.guard.0.kill().expect("SIGKILL b's agent");
        (a, first)
    }

    /// Agents a (hosting the store) and b.
    fn start(&self) -> (Agent, Agent) {
        let a = self.agent("a", "127.0.0.1:0");
        let b = self.agent("b", &format!("127.0.0.1:{}", a.hosted_port()));
        (a, b)
    }

    /// Runs the job to its end: both agents exit 0.
    fn finish(&self) -> String {
        let (mut a, mut b) = self.start();
        let (ca, cb) = (a.exit_code(LONG * 2), b.exit_code(LONG * 2));
        let logs = format!("{}\n---\n{}", a.log(), b.log());
        assert_eq!((ca, cb), (Some(0), Some(0)), "{logs}");
        logs
    }
}

/// The fault-free run's final state (model and AdamW, gathered whole), one run per shape for the module.
fn reference(shape: &'static str) -> &'static [f64] {
    static REFS: [OnceLock<Vec<f64>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match shape {
        "ddp" => &REFS[0],
        "fsdp" => &REFS[1],
        _ => &REFS[2],
    };
    slot.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        Job::new(dir.path(), shape, "2", "-1", "ref").finish();
        final_state(dir.path())
    })
}

fn final_state(dir: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(dir.join("final")).unwrap_or_default();
    text.split_whitespace().map(|w| w.parse::<f64>().expect("a float")).collect()
}

/// Equal to float rounding: a re-formed group sums each gradient across ranks in another order.
fn assert_close(got: &[f64], want: &[f64], logs: &str) {
    assert!(!want.is_empty() && got.len() == want.len(), "{} values against {}\n{logs}", got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1e-2), "value {i}: {g} against {w} without the fault\n{logs}");
    }
}

/// Each call of the training function: (rank, pid, round).
fn calls(dir: &Path) -> Vec<(u32, i32, String)> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, f.get(2)?.to_string()))
        })
        .collect()
}

/// rank -> the processes that held it, in order.
fn pids_by_rank(dir: &Path) -> BTreeMap<u32, Vec<i32>> {
    let mut out: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
    for (rank, pid, _) in calls(dir) {
        let pids = out.entry(rank).or_default();
        if !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    out
}

/// One restore as the API accounts for it.
#[derive(Debug)]
struct Restore {
    rank: u32,
    pid: i32,
    round: u64,
    source: Option<u32>,
    received: u64,
    sent: u64,
}

fn restores(dir: &Path) -> Vec<Restore> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the job's folder").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("restore-") else { continue };
        let parts: Vec<&str> = rest.split('-').collect();
        let text = std::fs::read_to_string(entry.path()).expect("a restore record");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        if !v["kept"].as_bool().unwrap_or(false) {
            continue;
        }
        let sent = v["sent"].as_object().map(|m| m.values().filter_map(|b| b.as_u64()).sum()).unwrap_or(0);
        out.push(Restore {
            rank: parts[0].parse().expect("rank"),
            pid: parts[1].parse().expect("pid"),
            round: parts[2].parse().expect("round"),
            source: v["source"].as_u64().map(|s| s as u32),
            received: v["received"].as_u64().expect("received"),
            sent,
        });
    }
    out.sort_by_key(|r| (r.round, r.rank));
    out
}

/// No survivor waited out a bound: the agents stopped no kept worker, no worker waited for its assignment.
fn assert_no_bound_waited(logs: &str) {
    assert!(!logs.contains("did not re-form in place within"), "{logs}");
    assert!(!logs.contains("no re-formation from the agent within"), "{logs}");
}

/// A process that held its part received nothing in any restore (those of `kept`, and one started by a
/// re-formation in every later one); a process started by a re-formation received its part, in that one,
/// from a rank holding the same part (`same_part(receiver, source)`); and something was sent.
fn assert_only_the_new_received(dir: &Path, kept: &BTreeSet<i32>, same_part: impl Fn(u32, u32) -> bool, logs: &str) {
    let all = restores(dir);
    assert!(!all.is_empty(), "no restore after a re-formation\n{logs}");
    let mut seen = BTreeSet::new();
    for r in &all {
        if kept.contains(&r.pid) || !seen.insert(r.pid) {
            assert!(r.source.is_none() && r.received == 0, "a holder received: {r:?}\n{all:?}");
        } else {
            let source = r.source.unwrap_or_else(|| panic!("a rank started again received nothing: {r:?}\n{all:?}"));
            assert!(r.received > 0 && same_part(r.rank, source), "{r:?}\n{all:?}");
        }
    }
    assert!(all.iter().any(|r| r.sent > 0), "{all:?}");
}

/// No bound waited out, only the new processes received, and the final state is the fault-free run's.
fn assert_in_place_and_fault_free(dir: &Path, kept: &BTreeSet<i32>, same_part: impl Fn(u32, u32) -> bool, want: &[f64], logs: &str) {
    assert_no_bound_waited(logs);
    assert_only_the_new_received(dir, kept, same_part, logs);
    assert_close(&final_state(dir), want, logs);
}

/// A worker SIGKILLed as its step's backward begins (rank 1, step 11) and another in the optimizer step,
/// after the vote (rank 2, step 21): the other three keep their processes each time, the new one receives
/// its part, and the job ends with the fault-free weights.
fn two_workers_die_and_the_others_stay(shape: &'static str, same_part: impl Fn(u32, u32) -> bool) {
    let want = reference(shape);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::new(dir.path(), shape, "2", "-1", "kill");
    job.env.push(("INPLACE_KILL", "1:11:backward,2:21:optimizer".into()));
    let logs = job.finish();
    let pids = pids_by_rank(dir.path());
    let counts: Vec<usize> = (0..4).map(|r| pids.get(&r).map_or(0, Vec::len)).collect();
    assert_eq!(counts, [1, 2, 2, 1], "ranks 0 and 3 kept their processes, 1 and 2 started once more: {pids:?}\n{logs}");
    let kept: BTreeSet<i32> = pids.values().map(|p| p[0]).collect();
    assert_in_place_and_fault_free(dir.path(), &kept, same_part, want, &logs);
}

#[test]
fn a_ddp_job_keeps_its_survivors_and_the_fault_free_weights() {
    two_workers_die_and_the_others_stay("ddp", |_, _| true);
}

/// HSDP on a 2 x 2 replicate x shard mesh: rank r holds shard r % 2, which only a rank of the other
/// replica can give back.
#[test]
fn an_hsdp_job_restores_a_shard_from_its_replica() {
    two_workers_die_and_the_others_stay("hsdp", |rank, source| rank % 2 == source % 2 && rank != source);
}

/// FSDP2 over all four ranks: a dead rank's shard is in no survivor's memory. Every rank says so in one
/// line, the agents keep no worker, and the job restarts cold from its last checkpoint (step 10, then 20):
/// it ends with the weights of the fault-free run, which passed through the same checkpoints.
#[test]
fn an_fsdp2_job_that_loses_a_shard_says_so_and_resumes_from_its_checkpoint() {
    let want = reference("fsdp");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::new(dir.path(), "fsdp", "2", "-1", "lost");
    job.env.push(("INPLACE_KILL", "1:11:backward,2:21:optimizer".into()));
    let logs = job.finish();
    for rank in [1, 2] {
        let line = format!("no surviving rank holds the state rank {rank} needs (mesh shard {rank} of 4)");
        assert!(logs.contains(&line), "{line}\n{logs}");
    }
    let pids = pids_by_rank(dir.path());
    assert!(pids.values().all(|p| p.len() == 3), "every rank started cold after each loss: {pids:?}\n{logs}");
    assert!(restores(dir.path()).is_empty(), "nothing restored in place: {:?}", restores(dir.path()));
    assert_close(&final_state(dir.path()), want, &logs);
}

/// `--nnodes 1:2`: node b's agent SIGKILLed (its two workers with it) while every rank waits at step 20;
/// a's workers re-form in a world of 2 and wait there; node c joins, its workers receive their parts from
/// a's, and the world of 4 trains on to the fault-free weights, a's workers in their first processes.
fn a_lost_node_and_a_joiner(shape: &'static str, same_part: impl Fn(u32, u32) -> bool) {
    let want = reference(shape);
    let dir = tempfile::tempdir().expect("tempdir");
    let job = Job::new(dir.path(), shape, "1:2", "20", "grow");
    let (mut a, first) = job.lose_b_at_step_20();
    // a's two workers re-formed in a world of 2 (they wait at step 20 again).
    assert!(eventually(LONG, || calls(dir.path()).len() == 6), "a's workers re-formed: {:?}\n{}", calls(dir.path()), a.log());
    let mut c = job.agent("c", &format!("127.0.0.1:{}", a.hosted_port()));
    assert!(eventually(LONG, || calls(dir.path()).len() == 10), "a world of 4 again: {:?}\n{}\n---\n{}", calls(dir.path()), a.log(), c.log());
    std::fs::write(dir.path().join("go-20"), "").expect("go");
    let (ca, cc) = (a.exit_code(LONG), c.exit_code(LONG));
    let logs = format!("{}\n---\n{}", a.log(), c.log());
    assert_eq!((ca, cc), (Some(0), Some(0)), "{logs}");
    let pids = pids_by_rank(dir.path());
    for rank in [0, 1] {
        assert_eq!(pids[&rank], first[&rank], "a's rank {rank} kept its process\n{logs}");
    }
    let kept: BTreeSet<i32> = [first[&0][0], first[&1][0]].into();
    assert_in_place_and_fault_free(dir.path(), &kept, same_part, want, &logs);
}

#[test]
fn a_ddp_job_keeps_its_survivors_through_a_lost_node_and_a_joiner() {
    a_lost_node_and_a_joiner("ddp", |_, _| true);
}

/// HSDP: the lost node held replica 1; the world of 2 is one replica (1 x 2) and c's ranks are replica 1
/// again, each receiving its shard from a's rank of the same shard.
#[test]
fn an_hsdp_job_keeps_its_survivors_through_a_lost_node_and_a_joiner() {
    a_lost_node_and_a_joiner("hsdp", |rank, source| rank % 2 == source % 2 && source < 2);
}

/// FSDP2 with `--nnodes 1:2`: b's agent SIGKILLed takes shards 2 and 3 with it. a's ranks say so in one
/// line and start cold, from the checkpoint of step 20, in a world of 2.
#[test]
fn an_fsdp2_job_that_loses_a_node_says_which_shard_and_starts_cold() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = Job::new(dir.path(), "fsdp", "1:2", "20", "gone");
    let (mut a, first) = job.lose_b_at_step_20();
    let cold = || pids_by_rank(dir.path()).iter().filter(|(r, _)| **r < 2).all(|(_, p)| p.len() == 2);
    assert!(eventually(LONG, cold), "a's ranks started cold: {:?}\n{}", calls(dir.path()), a.log());
    std::fs::write(dir.path().join("go-20"), "").expect("go");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    let logs = a.log();
    assert!(logs.contains("no surviving rank holds the state rank 0 needs (mesh shard 0 of 2)"), "{logs}");
    let pids = pids_by_rank(dir.path());
    assert!(pids[&0][1] != first[&0][0] && pids[&1][1] != first[&1][0], "{pids:?}");
}

/// With `--hang-timeout`: a worker's death still re-forms in place (ranks 0, 2 and 3 keep their processes,
/// watched for progress as before), and a rank that then stops (rank 2 asleep at step 16) is named and the
/// group restarts cold, from the checkpoint of step 15, to the fault-free weights.
fn with_hang_detection(shape: &'static str) {
    let want = reference(shape);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::new(dir.path(), shape, "2", "-1", "hang");
    job.extra.extend(["--hang-timeout=8".into(), "--progress-pattern=step \\d+".into()]);
    job.env.extend([("INPLACE_KILL", "1:11:backward".into()), ("INPLACE_STALL", "2:16".into())]);
    let logs = job.finish();
    let pids = pids_by_rank(dir.path());
    assert!(pids[&0].len() == 2 && pids[&1].len() == 3 && pids[&3].len() == 2, "{pids:?}\n{logs}");
    let all = calls(dir.path());
    for rank in [0, 2, 3] {
        let twice = all.iter().filter(|(_, pid, _)| *pid == pids[&rank][0]).count();
        assert_eq!(twice, 2, "rank {rank}'s first process re-formed in place after the death: {all:?}\n{logs}");
    }
    assert!(logs.contains("local rank 0) made no progress since "), "b's local rank 0 (rank 2) is named\n{logs}");
    assert_close(&final_state(dir.path()), want, &logs);
}

#[test]
fn with_hang_detection_a_ddp_job_keeps_a_death_in_place_and_restarts_a_hang_cold() {
    with_hang_detection("ddp");
}

#[test]
fn with_hang_detection_an_hsdp_job_keeps_a_death_in_place_and_restarts_a_hang_cold() {
    with_hang_detection("hsdp");
}
