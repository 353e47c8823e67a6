//! A real training job (examples/train.py: DDP over gloo on CPU, through tests/fixtures/partition_train.py)
//! whose member is cut silently. The survivors' workers block in all_reduce, waiting for a peer that never
//! answers, and a worker blocked there ignores SIGTERM: their stop lasts membership_grace (3 s by default),
//! not the 30 s --shutdown-timeout, and no restart is spent on anyone.

use std::path::Path;

use serde_json::Value;

use crate::common::netns::Net;
use crate::common::{cluster, eventually, fixture};
use super::cut::{check_cut, check_rounds, CutOutcome};
use super::job::{Job, Rdzv, Workload};
use super::{epoch, records, round3, scenario, show, starts, Checks, Timings, STORE_PORT};

/// `--rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=1` and nothing else:
/// membership_grace, read_timeout and join_timeout at their defaults.
const TRAIN: Timings =
    Timings { interval: 1, attempts: 3, keep_alive: true, read_timeout: None, join_timeout: None, last_call: 1 };
/// muster's default membership_grace: the SIGTERM-to-SIGKILL grace of a stop for a membership change.
const MEMBERSHIP_GRACE: f64 = 3.0;
/// Optimizer steps of the job: some 30 s of training on two cores (a sleep of 50 ms a step, and the rest).
const STEPS: u32 = 400;

fn train(dir: &Path) -> Workload {
    let args = [
        format!("--steps={STEPS}"),
        "--step-sleep=0.05".into(),
        "--ckpt-every=10".into(),
        format!("--ckpt-dir={}", dir.join("ckpt").display()),
        format!("--result={}", dir.join("result.json").display()),
    ];
    Workload { script: fixture("partition_train.py"), args: args.into(), shutdown_timeout: 30 }
}

/// One checkpoint rank 0 wrote, as tests/fixtures/partition_train.py records it.
#[derive(Debug)]
struct Progress {
    round: Option<i64>,
    world_size: Option<u32>,
    step: u32,
    t: f64,
}

fn progress(dir: &Path) -> Vec<Progress> {
    records(dir, "progress", |f| {
        Some(Progress {
            round: f.get(1)?.parse().ok(),
            world_size: f.get(2)?.parse().ok(),
            step: f.get(3)?.parse().ok()?,
            t: f.get(4)?.parse().ok()?,
        })
    })
}

/// c10d, three agents × one worker on three hosts (the store hosted by host 0's agent), `--shutdown-timeout
/// 30`; host 2 is cut silently while the job trains:
/// - the cut node fences and its worker is gone before the survivors' new workers start (as any cut);
/// - each survivor runs again within membership_grace + 2 s of its stop's start: the stop lasted the short
///   grace, although the workers blocked in all_reduce did not end on SIGTERM;
/// - no restart is spent: every worker started with TORCHELASTIC_RESTART_COUNT 0, every event of every
///   agent has restart_count 0;
/// - the survivors train on in a world of two from the last checkpoint, and finish with exit 0.
#[test]
fn a_gloo_job_whose_member_is_cut_reforms_within_the_membership_grace_and_trains_on() {
    let (_serial, mut report) = scenario("c10d-train-cut");
    let net = Net::new(3);
    let mut job = Job::new(&net, TRAIN, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.workload = train(job.path());
    job.start_c10d(&[0, 1, 2]);
    let r0 = job.wait_running(&[0, 1, 2], 0.0, cluster::LONG, "the first round");
    // Training, not starting: rank 0 checkpointed at step 20 or later (torch imported, gloo connected).
    let training = eventually(cluster::LONG, || progress(job.path()).iter().any(|p| p.round == Some(r0) && p.step >= 20));
    assert!(training, "the job did not reach step 20 in round {r0}\n{}", job.logs());
    let t_cut = epoch(net.cut(2));
    let step_at_cut = progress(job.path()).iter().map(|p| p.step).max().unwrap_or(0);
    report.set("step_at_cut", step_at_cut);
    // The survivors re-form, resume from the last checkpoint and train past it in a newer round.
    let trained_on = |job: &Job| {
        progress(job.path()).into_iter().find(|p| p.round.is_some_and(|r| r > r0) && p.step > step_at_cut)
    };
    // (A worker's first steps are slow: torch imported, gloo connected, the checkpoint loaded, DDP warmed.)
    eventually(cluster::LONG, || trained_on(&job).is_some());
    let o = CutOutcome::read(&job, &[0, 1, 2], 2, r0, t_cut);
    let mut checks = Checks::default();
    // The fence, the cut node's stop before the survivors' start, the eviction, no split brain; the
    // survivors' new round comes up to the grace and a second of its rendezvous later than for workers
    // that end on SIGTERM.
    check_cut(&job, t_cut, &o, MEMBERSHIP_GRACE + 1.0, &mut checks, &mut report);
    let (mut stop_s, mut stop_to_running_s) = (Vec::new(), Vec::new());
    for ((h, stop), (_, run)) in o.evicted.iter().zip(&o.running) {
        let (Some(stop), Some(run)) = (stop, run) else { continue };
        let ended = job.events_after(*h, stop.t).into_iter().find(|t| t.from == "stopping");
        stop_s.extend(ended.map(|e| round3(e.t - stop.t)));
        let bound = MEMBERSHIP_GRACE + 2.0;
        stop_to_running_s.push(round3(run.t - stop.t));
        checks.check(run.t - stop.t <= bound, || {
            format!(
                "survivor h{h} ran again {:.3} s after its stop began; expected <= membership_grace + 2 = {bound} s: {}",
                run.t - stop.t,
                show(&job.events_after(*h, stop.t), t_cut)
            )
        });
    }
    report.set("stop_s", stop_s);
    report.set("stop_to_running_s", stop_to_running_s);
    let st = starts(job.path());
    checks.check(st.iter().all(|s| s.restart_count == Some(0)), || format!("a worker started with TORCHELASTIC_RESTART_COUNT != 0: {st:?}"));
    for n in &job.nodes {
        let spent: Vec<_> = job.events(n.host).into_iter().filter(|t| t.restart_count != Some(0)).collect();
        checks.check(spent.is_empty(), || format!("{}: events with a restart spent: {spent:?}", n.name()));
    }
    check_rounds(&job, &mut checks);
    let on = trained_on(&job);
    report.set("trained_on_s", on.as_ref().map(|p| round3(p.t - t_cut)));
    checks.check(on.as_ref().is_some_and(|p| p.world_size == Some(2)), || {
        format!("the survivors did not train past step {step_at_cut} in a world of 2 after the cut: {on:?}")
    });
    // Who ran its SIGTERM handler (the cut node's worker may have: it was not always in a collective).
    let handled = records(job.path(), "signals", |f| f.first().map(|node| node.to_string()));
    report.set("sigterm_handled", handled);
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&[0, 1]);
    let result: Value = std::fs::read_to_string(job.path().join("result.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("rank 0 wrote no result.json\n{}", job.logs()));
    report.set("resumed_from", result["resumed_from"].clone());
    let resumed = result["resumed_from"].as_u64().unwrap_or(0);
    assert!(
        result["steps"] == STEPS && result["world_size"] == 2 && result["restart_count"] == 0 && resumed >= 10,
        "the job did not finish its {STEPS} steps in a world of 2, resumed from a checkpoint, with no restart: {result}"
    );
}
