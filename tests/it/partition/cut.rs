//! The expectations of a silent cut (docs/multi-node.md: "When a node is cut off: timing guarantees"), shared by
//! the scenarios that cut a node: what the cut did, read off the event logs, the exit and the /proc
//! samples, and the checks of it.

use std::time::{Duration, SystemTime};

use crate::common::eventually;
use crate::common::netns::Net;
use super::job::Job;
use super::{epoch, now, round3, starts, Checks, Report, Seen, Tr};

/// What a silent cut of `victim` did, read off the event logs, the exit and the /proc samples.
pub(crate) struct CutOutcome {
    /// The victim's transition to "stopping" after the cut, and the one that ended it.
    pub(crate) fence: Option<Tr>,
    pub(crate) stopped: Option<Tr>,
    /// Each survivor's first transition to "stopping" after the cut, and to "running" in a newer round.
    pub(crate) evicted: Vec<(usize, Option<Tr>)>,
    pub(crate) running: Vec<(usize, Option<Tr>)>,
    exit: Option<(f64, Option<i32>)>,
    pub(crate) split_brain: f64,
    split_pair: Option<(Seen, Seen)>,
}

impl CutOutcome {
    /// What the job says now of `victim`'s cut at `t_cut`, when every agent on `hosts` ran round `r0`.
    pub(crate) fn read(job: &Job, hosts: &[usize], victim: usize, r0: i64, t_cut: f64) -> CutOutcome {
        let survivors: Vec<usize> = hosts.iter().copied().filter(|h| *h != victim).collect();
        let v = job.events_after(victim, t_cut);
        let fence_i = v.iter().position(|t| t.to == "stopping");
        let fence = fence_i.map(|i| v[i].clone());
        let stopped = fence_i.and_then(|i| v[i + 1..].iter().find(|t| t.from == "stopping").cloned());
        let evicted = survivors.iter().map(|&h| (h, job.events_after(h, t_cut).into_iter().find(|t| t.to == "stopping"))).collect();
        let running = survivors
            .iter()
            .map(|&h| (h, job.events_after(h, t_cut).into_iter().find(|t| t.to == "running" && t.round.is_some_and(|r| r > r0))))
            .collect();
        let (split_brain, split_pair) = job.split_brain(victim, t_cut);
        CutOutcome { fence, stopped, evicted, running, exit: job.node(victim).exit, split_brain, split_pair }
    }
}

/// Hits `victim` with `fault` (`Net::cut`, `Net::cut_inbound`, `Net::link_down`) once every agent on
/// `hosts` runs one round, waits for the victim to give up (`store_timeout` after its fence) and the
/// survivors to re-form, and gathers what happened.
fn observe_fault(
    job: &mut Job,
    hosts: &[usize],
    victim: usize,
    store_timeout: f64,
    fault: fn(&Net, usize) -> SystemTime,
) -> (f64, CutOutcome) {
    let tm = job.timings;
    let r0 = job.settled(hosts);
    let t_cut = epoch(fault(job.net, victim));
    let survivors: Vec<usize> = hosts.iter().copied().filter(|h| *h != victim).collect();
    // The victim should be gone at fence + store_timeout; waited for with head-room, then the survivors.
    let exit_bound = tm.fence_after() + store_timeout + 10.0;
    job.wait_exit(victim, Duration::from_secs_f64(exit_bound));
    let reformed = eventually(Duration::from_secs_f64((t_cut + tm.w() + tm.i() + 15.0 - now()).max(1.0)), || {
        job.running_round(&survivors, t_cut).is_some_and(|r| r > r0)
    });
    if !reformed {
        eprintln!("the survivors {survivors:?} did not run a newer round than {r0}");
    }
    (t_cut, CutOutcome::read(job, hosts, victim, r0, t_cut))
}

/// `observe_fault`, then every expectation of a cut checked and reported: the fence and the re-form
/// (`check_cut`, with `late`), the cut node's exit, the workers' rounds. The caller adds its own checks.
pub(crate) fn expect_cut(
    job: &mut Job,
    hosts: &[usize],
    victim: usize,
    store_timeout: f64,
    fault: fn(&Net, usize) -> SystemTime,
    late: f64,
    report: &mut Report,
) -> (f64, CutOutcome, Checks) {
    let (t_cut, o) = observe_fault(job, hosts, victim, store_timeout, fault);
    let mut checks = Checks::default();
    check_cut(job, t_cut, &o, late, &mut checks, report);
    check_cut_exit(job, t_cut, &o, store_timeout, &mut checks, report);
    check_rounds(job, &mut checks);
    (t_cut, o, checks)
}

/// The spec's expectations of a silent cut up to the survivors' new round, checked and reported. `late`:
/// seconds more for the survivors' re-form (a fault that lets the victim's heartbeats reach the store for a
/// while after it starts, an inbound-only cut, starts their W later; workers that ignore SIGTERM make
/// their stop last membership_grace).
pub(crate) fn check_cut(job: &Job, t_cut: f64, o: &CutOutcome, late: f64, checks: &mut Checks, report: &mut Report) {
    let tm = job.timings;
    let reform = o.running.iter().map(|(_, t)| t.as_ref().map(|t| t.t - t_cut)).collect::<Option<Vec<f64>>>();
    let reform_max = reform.as_ref().map(|r| r.iter().copied().fold(0.0, f64::max));
    report.set("split_brain_s", round3(o.split_brain));
    report.set("reform_s", reform_max.map(round3));
    report.set("fence_s", o.fence.as_ref().map(|f| round3(f.t - t_cut)));
    report.set(
        "evict_s",
        o.evicted.iter().filter_map(|(_, t)| t.as_ref().map(|t| round3(t.t - t_cut))).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x)))),
    );

    // The cut node fences: its workers stopped with reason "fenced", no later than W - min(I, W/2) after
    // the cut (its last acknowledged heartbeat was sent before it), and the stop ended.
    match &o.fence {
        None => checks.check(false, || "the cut node never went to \"stopping\" after the cut (no fence)".into()),
        Some(f) => {
            checks.check(f.reason.as_deref() == Some("fenced"), || {
                format!("the cut node's stop has reason {:?}, not \"fenced\"", f.reason)
            });
            let bound = tm.fence_after() + 1.0;
            checks.check(f.t - t_cut <= bound, || {
                format!("the cut node fenced {:.3} s after the cut; expected <= W - min(I, W/2) + 1 = {bound} s", f.t - t_cut)
            });
        }
    }
    // Its stop ended before any survivor started the new round's workers.
    let first_new = o.running.iter().filter_map(|(_, t)| t.as_ref().map(|t| t.t)).fold(f64::INFINITY, f64::min);
    match &o.stopped {
        None => checks.check(false, || "the cut node's stop never ended (no transition from \"stopping\")".into()),
        Some(s) => checks.check(s.t < first_new, || {
            format!(
                "the cut node's workers were stopped at {:+.3} s, not before the survivors' new round ran at {:+.3} s",
                s.t - t_cut,
                first_new - t_cut
            )
        }),
    }
    // The survivors evict it no earlier than W after its last beat (which reached the store at most I
    // before the cut), stop for a membership change, and run a newer round within W + I + 1 s.
    for (h, t) in &o.evicted {
        match t {
            None => checks.check(false, || format!("survivor h{h} never stopped its workers after the cut")),
            Some(t) => {
                let earliest = tm.w() - tm.i() - 0.1;
                checks.check(t.t - t_cut >= earliest, || {
                    format!("survivor h{h} evicted {:.3} s after the cut: earlier than W - I = {} s", t.t - t_cut, tm.w() - tm.i())
                });
                checks.check(t.reason.as_deref() == Some("membership change"), || {
                    format!("survivor h{h} stopped with reason {:?}, not \"membership change\"", t.reason)
                });
            }
        }
    }
    for (h, t) in &o.running {
        let bound = tm.w() + tm.i() + 1.0 + late;
        match t {
            None => checks.check(false, || format!("survivor h{h} never ran a newer round after the cut")),
            Some(t) => checks.check(t.t - t_cut <= bound, || {
                format!("survivor h{h} ran its new round {:.3} s after the cut; expected <= W + I + 1 (+ {late}) = {bound} s", t.t - t_cut)
            }),
        }
    }
    // No worker of the cut node alive together with a new-round worker of the survivors.
    checks.check(o.split_brain == 0.0, || {
        format!("split brain: {:.3} s of the cut node's old worker and a new one alive at once: {:?}", o.split_brain, o.split_pair)
    });
}

/// The cut node gives up: exit 3 at about fence + the store's timeout (c10d: read_timeout, etcd:
/// join_timeout).
fn check_cut_exit(job: &Job, t_cut: f64, o: &CutOutcome, store_timeout: f64, checks: &mut Checks, report: &mut Report) {
    let tm = job.timings;
    report.set("cut_exit_s", o.exit.map(|(t, _)| round3(t - t_cut)));
    report.set("cut_exit_code", o.exit.and_then(|(_, c)| c));
    match (o.exit, &o.fence) {
        (None, _) => checks.check(false, || {
            format!("the cut node did not exit within W + store timeout ({store_timeout} s) + 10 s of the cut")
        }),
        (Some((t, code)), fence) => {
            checks.check(code == Some(3), || format!("the cut node exited with {code:?}, not 3 (rendezvous incomplete)"));
            let from = fence.as_ref().map(|f| f.t).unwrap_or(t_cut + tm.fence_after());
            let bound = store_timeout + 2.0;
            checks.check(t - from <= bound, || {
                format!("the cut node exited {:.3} s after its fence; expected <= store timeout + 2 = {bound} s", t - from)
            });
        }
    }
}

/// The workers' MUSTER_ROUND (a fencing token): set on every worker, the round of a transition of its agent
/// to "running", and never smaller than that of a worker its node started before.
pub(crate) fn check_rounds(job: &Job, checks: &mut Checks) {
    let st = starts(job.path());
    checks.check(st.iter().all(|s| s.round.is_some()), || "a worker has no MUSTER_ROUND in its environment".into());
    for n in &job.nodes {
        let name = n.name();
        let ran: Vec<i64> = job.events(n.host).iter().filter(|t| t.to == "running").filter_map(|t| t.round).collect();
        let mine: Vec<i64> = st.iter().filter(|s| s.node == name).filter_map(|s| s.round).collect();
        for r in &mine {
            checks.check(ran.contains(r), || format!("{name}: a worker's MUSTER_ROUND={r} is no round its agent ran ({ran:?})"));
        }
        checks.check(mine.windows(2).all(|w| w[0] <= w[1]), || format!("{name}: MUSTER_ROUND went back: {mine:?}"));
    }
}
