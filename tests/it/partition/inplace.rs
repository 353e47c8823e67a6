//! In place (`muster_inplace`, tests/fixtures/inplace_train.py: DDP over gloo) when a node is cut off
//! silently: the survivors' workers block in all_reduce on a peer that never answers (no FIN, no RST), and
//! their agent ends that wait by handing them the new round. Fencing is as without in place.

use std::path::Path;

use crate::common::netns::Net;
use crate::common::{cluster, eventually, fixture};
use crate::inplace::all_at;
use super::cut::{check_cut, CutOutcome};
use super::job::{Job, Rdzv, Workload};
use super::{epoch, round3, scenario, Checks, Timings, STORE_PORT};

/// W = 3 s; read_timeout 10 s (the cut node's exit).
const TIMINGS: Timings =
    Timings { interval: 1, attempts: 3, keep_alive: true, read_timeout: Some(10), join_timeout: None, last_call: 1 };
const STEPS: u32 = 40;
/// `--in-place-timeout`: the bound on a kept worker's re-formation.
const BOUND: f64 = 20.0;

/// One call of the training function: `rank pid round commits time`.
#[derive(Debug, Clone)]
struct Call {
    rank: u32,
    pid: i32,
    round: i64,
    t: f64,
}

fn calls(dir: &Path) -> Vec<Call> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Call { rank: f.first()?.parse().ok()?, pid: f.get(1)?.parse().ok()?, round: f.get(2)?.parse().ok()?, t: f.get(4)?.parse().ok()? })
        })
        .collect()
}

/// c10d, two agents × two workers on two hosts (`--nnodes 1:2`, the store on host 0's agent); host 1 is cut
/// silently while every rank waits in all_reduce at step 20:
/// - the cut node fences, its workers are gone before the survivor's run in the new round (as any cut);
/// - host 0's two workers keep their processes and re-form in a world of 2 within W + I + 1 s + the
///   in-place bound of the cut, spending no restart;
/// - the job finishes its steps in a world of 2 with exit 0.
#[test]
fn a_node_cut_off_silently_leaves_the_survivors_in_place() {
    let (_serial, mut report) = scenario("c10d-inplace-cut");
    let net = Net::new(2);
    let mut job = Job::new(&net, TIMINGS, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "1:2");
    job.nproc = 2;
    job.opts.push(format!("--in-place-timeout={BOUND}"));
    job.workload = Workload { script: fixture("inplace_train.py"), args: vec![STEPS.to_string(), "20".into()], shutdown_timeout: 30 };
    job.start_c10d(&[0, 1]);
    let dir = job.path().to_path_buf();
    assert!(eventually(cluster::LONG, || all_at(&dir, 0..4, 20)), "every rank reached step 20\n{}", job.logs());
    let first = calls(&dir);
    assert_eq!(first.len(), 4, "{first:?}");
    let r0 = first[0].round;
    let t_cut = epoch(net.cut(1));
    let kept = |c: &&Call| c.rank < 2 && c.round > r0;
    let reformed = eventually(cluster::LONG, || calls(&dir).iter().filter(kept).count() == 2);
    std::fs::write(dir.join("go-20"), "").expect("go");
    let o = CutOutcome::read(&job, &[0, 1], 1, r0, t_cut);
    let mut checks = Checks::default();
    check_cut(&job, t_cut, &o, 0.0, &mut checks, &mut report);
    let all = calls(&dir);
    let again: Vec<&Call> = all.iter().filter(kept).collect();
    checks.check(reformed && again.len() == 2, || format!("host 0's workers did not re-form after the cut: {all:?}"));
    let mine: Vec<i32> = first.iter().filter(|c| c.rank < 2).map(|c| c.pid).collect();
    checks.check(again.iter().all(|c| mine.contains(&c.pid)), || format!("host 0's workers did not keep their processes: {all:?}"));
    let reform_s = again.iter().map(|c| c.t - t_cut).fold(0.0, f64::max);
    report.set("in_place_reform_s", round3(reform_s));
    let tm = TIMINGS;
    let bound = tm.w() + tm.i() + 1.0 + BOUND;
    checks.check(reformed && reform_s <= bound, || format!("re-formed in place {reform_s:.3} s after the cut; expected <= W + I + 1 + bound = {bound} s"));
    // The cut node's workers were gone before the survivors' re-formed in the new round.
    let first_reformed = again.iter().map(|c| c.t).fold(f64::INFINITY, f64::min);
    let cut_workers: Vec<_> = job.sampler.seen().into_iter().filter(|s| s.node == "h1").collect();
    checks.check(!cut_workers.is_empty() && cut_workers.iter().all(|s| s.gone && s.last < first_reformed), || {
        format!("a worker of the cut node was alive at {:+.3} s, when the survivors re-formed: {cut_workers:?}", first_reformed - t_cut)
    });
    let spent: Vec<_> = job.events(0).into_iter().filter(|t| t.restart_count != Some(0)).collect();
    checks.check(spent.is_empty(), || format!("h0: events with a restart spent: {spent:?}"));
    job.assert_checks(checks, t_cut, "the cut");
    let code = job.wait_exit(0, cluster::LONG).map(|(_, c)| c);
    assert_eq!(code, Some(Some(0)), "h0 did not finish with exit 0: {}", job.node(0).agent.log());
}
