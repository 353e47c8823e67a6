//! Table tests of `step`: every (phase, input) pair, and the incidents that overlap.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;

use super::state::{Cause, Effect, End, Grace, Input, Job, Op, Phase, State, StopFor, Verdict};
use super::step::step;
use super::AgentError;
use crate::gpu::health::Fault;
use crate::gpu::xid::{Action, FaultKind};
use crate::gpu::GpuInfo;
use crate::rendezvous::{Closure, RdzvError, RdzvEvent};
use crate::supervisor::failure::ProcessFailure;

fn job() -> Job {
    Job {
        run_id: "job".into(),
        nproc_per_node: 4,
        max_restarts: 3,
        on_hang: crate::config::OnHang::Restart,
        multi_node: false,
        gpus: (0..4).collect(),
        in_place: false,
    }
}

fn fault(gpu: u32, kind: FaultKind, action: Action) -> Fault {
    let gpu = GpuInfo { index: gpu, uuid: format!("GPU-{gpu}"), pci_bus_id: String::new(), name: String::new(), memory_total: 0 };
    Fault { gpu, kind, action }
}

fn failure(local_rank: u32) -> ProcessFailure {
    ProcessFailure { local_rank, global_rank: local_rank, pid: 100 + local_rank as i32, exitcode: 1, error_file: None, error_data: None, timestamp: 0 }
}

/// One of each phase, named as the table names them.
fn phases() -> Vec<(&'static str, Phase)> {
    let f = fault(0, FaultKind::Lost, Action::Drain);
    vec![
        ("joining", Phase::Joining),
        ("starting", Phase::Starting),
        ("running", Phase::Running),
        ("stopping:restart", Phase::Stopping(Cause::Restart { failures: vec![failure(0)], fault: None, hang: false })),
        ("stopping:membership", Phase::Stopping(Cause::Membership(RdzvEvent::PeerLost("n".into())))),
        ("stopping:signal", Phase::Stopping(Cause::Signal(Signal::SIGTERM))),
        ("stopping:drain", Phase::Stopping(Cause::Drain(f.clone()))),
        ("reforming", Phase::Reforming { open: true }),
        ("draining", Phase::Draining(f)),
        ("finishing:ok", Phase::Finishing(End::Succeeded)),
        ("finishing:failed", Phase::Finishing(End::Failed(vec![failure(0)]))),
        ("done", Phase::Done(End::Succeeded)),
    ]
}

/// One of each input.
fn inputs() -> Vec<(&'static str, Input)> {
    vec![
        ("signal", Input::Signal(Signal::SIGINT)),
        ("notice", Input::Notice(Signal::SIGUSR1)),
        ("xid79", Input::Fault(fault(1, FaultKind::Lost, Action::Drain))),
        ("dbe-exclude", Input::Fault(fault(2, FaultKind::DoubleBitEcc, Action::Exclude))),
        ("xid13", Input::Fault(fault(1, FaultKind::Xid(Some(13)), Action::Restart))),
        ("xid-ignored", Input::Fault(fault(1, FaultKind::Xid(Some(43)), Action::Ignore))),
        ("joined", Input::Joined { nproc: 4 }),
        ("join-changed", Input::JoinChanged(RdzvEvent::PeerLost("n".into()))),
        ("started", Input::Started { gpus: Some((0..4).collect()), kept: 0 }),
        ("start-lost", Input::StartLost(fault(3, FaultKind::Lost, Action::Drain))),
        ("succeeded", Input::Succeeded),
        ("worker-failed", Input::WorkerFailed { failure: failure(1), change: None }),
        ("membership", Input::Membership(RdzvEvent::JoinersWaiting)),
        ("stopped", Input::Stopped(vec![failure(2)])),
        ("reformed", Input::Reformed),
        ("drained", Input::Drained),
        ("finished", Input::Finished),
        ("failed", Input::Failed(AgentError::Internal("boom".into()))),
        ("hung", hung(true)),
    ]
}

fn observed(state: &State) -> String {
    match &state.phase {
        Phase::Stopping(c) => format!(
            "stopping:{}",
            match c {
                Cause::Membership(_) => "membership",
                Cause::Restart { .. } => "restart",
                Cause::Exclude(_) => "exclude",
                Cause::Error(_) => "error",
                Cause::Drain(_) => "drain",
                Cause::Signal(_) => "signal",
            }
        ),
        _ => state.phase_name().to_string(),
    }
}

/// What `step` made of one pair, in `step_table.rs`'s terms.
fn effect_name(e: &Effect) -> String {
    match e {
        Effect::Fault(_, verdict) => format!("fault {verdict:?}").to_lowercase(),
        Effect::Forward(sig) => format!("forward {}", sig.as_str()),
        Effect::RestartSpent(kind) => format!("restart spent ({})", kind.as_str()),
        Effect::Excluded(gpu) => format!("exclude gpu {gpu}"),
    }
}

#[test]
fn every_phase_and_input() {
    let mut seen = BTreeSet::new();
    for &(pname, iname, after, spent, effects) in super::step_table::TABLE {
        assert!(seen.insert((pname, iname)), "the table has {pname}/{iname} twice");
        let phase = phases().into_iter().find(|(n, _)| *n == pname).map(|(_, p)| p);
        let input = inputs().into_iter().find(|(n, _)| *n == iname).map(|(_, i)| i);
        let (Some(phase), Some(input)) = (phase, input) else { panic!("no phase {pname} or input {iname}") };
        let mut state = State::new(job());
        state.phase = phase;
        let got: Vec<String> = step(&mut state, input).iter().map(effect_name).collect();
        let want: Vec<String> = effects.iter().map(|e| e.to_string()).collect();
        assert_eq!((observed(&state).as_str(), state.restart_count, got), (after, spent, want), "phase {pname}, input {iname}");
    }
    assert_eq!(seen.len(), phases().len() * inputs().len(), "every (phase, input) pair has its row");
}

#[test]
fn a_preemption_warning_then_the_stop() {
    // Slurm: `--signal=USR1@T` (listed in --signals-to-handle), later scancel's SIGTERM.
    let mut state = State::new(job());
    state.phase = Phase::Running;
    let effects = run(&mut state, vec![Input::Notice(Signal::SIGUSR1), Input::Notice(Signal::SIGUSR1)]);
    assert_eq!(effects, [Effect::Forward(Signal::SIGUSR1), Effect::Forward(Signal::SIGUSR1)]);
    assert!(matches!(state.phase, Phase::Running), "{:?}", state.phase);
    run(&mut state, vec![Input::Signal(Signal::SIGTERM), Input::Notice(Signal::SIGUSR1)]);
    assert!(matches!(state.phase, Phase::Stopping(Cause::Signal(Signal::SIGTERM))), "{:?}", state.phase);
    assert_eq!(state.op(), stop(Grace::Shutdown, StopFor::Shutdown, false));
    run(&mut state, vec![Input::Stopped(vec![failure(0)])]);
    assert!(matches!(state.phase, Phase::Done(End::Interrupted(Signal::SIGTERM))), "{:?}", state.phase);
    assert_eq!(state.restart_count, 0, "a preemption spends no restart");
}

#[test]
fn the_store_host_gone_stops_with_the_membership_grace_and_a_failure_closes_with_its_line() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    let gone = RdzvError::StoreHostEnded { node: "n0_7_0".into(), addr: "n0:29400".into() };
    run(&mut state, vec![Input::Failed(AgentError::Rendezvous(gone))]);
    // Its peers went with the store's host: no collective, nor a collective checkpoint, can complete.
    assert_eq!(state.op(), stop(Grace::Membership, StopFor::Shutdown, false));
    run(&mut state, vec![Input::Stopped(Vec::new())]);
    assert!(matches!(&state.phase, Phase::Done(End::Error(AgentError::Rendezvous(RdzvError::StoreHostEnded { .. })))));
    let mut state = State::new(job());
    state.phase = Phase::Finishing(End::Failed(vec![failure(1)]));
    let Op::Finish { barrier: false, failed: Some(line) } = state.op() else { panic!("{:?}", state.op()) };
    assert!(line.contains("(local_rank 1) exited with 1, restarts spent (--max-restarts"), "{line}");
    state.phase = Phase::Finishing(End::Succeeded);
    assert_eq!(state.op(), Op::Finish { barrier: true, failed: None });
}

fn run(state: &mut State, inputs: Vec<Input>) -> Vec<Effect> {
    inputs.into_iter().flat_map(|i| step(state, i)).collect()
}

#[test]
fn xid13_with_its_workers_crash_spends_one_restart() {
    // The worker dies first, the XID comes during the stop, or after it (while re-forming or joining).
    for late in 0..3 {
        let mut state = State::new(job());
        state.phase = Phase::Running;
        let xid = || Input::Fault(fault(1, FaultKind::Xid(Some(13)), Action::Restart));
        let mut inputs = vec![Input::WorkerFailed { failure: failure(1), change: None }];
        match late {
            0 => inputs.extend([xid(), Input::Stopped(vec![]), Input::Reformed]),
            1 => inputs.extend([Input::Stopped(vec![]), xid(), Input::Reformed]),
            _ => inputs.extend([Input::Stopped(vec![]), Input::Reformed, xid()]),
        }
        run(&mut state, inputs);
        assert_eq!(state.restart_count, 1, "case {late}");
        assert!(matches!(state.phase, Phase::Joining), "case {late}: {:?}", state.phase);
    }
    // The XID first, then the crash it caused.
    let mut state = State::new(job());
    state.phase = Phase::Running;
    let xid = Input::Fault(fault(1, FaultKind::Xid(Some(13)), Action::Restart));
    // The crash it caused is seen while the group stops.
    run(&mut state, vec![xid, Input::Stopped(vec![failure(1)])]);
    assert_eq!(state.restart_count, 1);
}

#[test]
fn dbe_then_xid48_excludes_once_and_continues() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    let effects = run(
        &mut state,
        vec![
            Input::Fault(fault(2, FaultKind::DoubleBitEcc, Action::Exclude)),
            Input::Fault(fault(2, FaultKind::Xid(Some(48)), Action::Exclude)),
            // The worker on GPU 2 died of it while the group stopped.
            Input::Stopped(vec![failure(2)]),
        ],
    );
    assert!(matches!(state.phase, Phase::Reforming { open: true }), "{:?}", state.phase);
    assert_eq!(state.excluded, BTreeSet::from([2]));
    assert_eq!(state.restart_count, 0, "excluding spends no restart");
    assert_eq!(state.nproc(), 3);
    let verdicts: Vec<Verdict> =
        effects.iter().filter_map(|e| if let Effect::Fault(_, v) = e { Some(*v) } else { None }).collect();
    assert_eq!(verdicts, [Verdict::Acted, Verdict::Excluded]);
    // Later: XID 79 on the excluded GPU is ignored.
    state.phase = Phase::Running;
    state.in_use = Some([0, 1, 3].into());
    let effects = run(&mut state, vec![Input::Fault(fault(2, FaultKind::Lost, Action::Drain))]);
    assert!(matches!(state.phase, Phase::Running));
    assert_eq!(effects, [Effect::Fault(Box::new(fault(2, FaultKind::Lost, Action::Drain)), Verdict::Excluded)]);
}

#[test]
fn xid79_after_its_worker_died_drains_in_every_phase_the_event_can_meet() {
    for after in ["stopping", "reforming", "joining", "starting"] {
        let mut state = State::new(job());
        state.phase = Phase::Running;
        let mut inputs = vec![Input::WorkerFailed { failure: failure(1), change: None }];
        let tail: &[fn() -> Input] = match after {
            "stopping" => &[],
            "reforming" => &[|| Input::Stopped(vec![])],
            "joining" => &[|| Input::Stopped(vec![]), || Input::Reformed],
            _ => &[|| Input::Stopped(vec![]), || Input::Reformed, || Input::Joined { nproc: 4 }],
        };
        inputs.extend(tail.iter().map(|f| f()));
        inputs.push(Input::Fault(fault(1, FaultKind::Lost, Action::Drain)));
        if after == "stopping" {
            inputs.push(Input::Stopped(vec![]));
        }
        inputs.push(Input::Drained);
        run(&mut state, inputs);
        assert!(matches!(state.phase, Phase::Done(End::Drained(_))), "{after}: {:?}", state.phase);
    }
}

#[test]
fn exclude_without_a_spare_gpu_drains() {
    let mut state = State::new(Job { nproc_per_node: 1, gpus: [0].into(), ..job() });
    state.phase = Phase::Running;
    run(&mut state, vec![Input::Fault(fault(0, FaultKind::DoubleBitEcc, Action::Exclude))]);
    assert!(matches!(state.phase, Phase::Stopping(Cause::Drain(_))), "{:?}", state.phase);
}

#[test]
fn faults_on_gpus_this_node_does_not_use_are_ignored() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    state.in_use = Some([0, 1].into());
    let effects = run(&mut state, vec![Input::Fault(fault(3, FaultKind::Lost, Action::Drain))]);
    assert!(matches!(state.phase, Phase::Running));
    assert!(matches!(effects[..], [Effect::Fault(_, Verdict::Unused)]));
}

#[test]
fn restarts_are_spent_until_none_is_left() {
    let mut state = State::new(Job { max_restarts: 1, ..job() });
    for _ in 0..2 {
        state.phase = Phase::Running;
        run(&mut state, vec![Input::WorkerFailed { failure: failure(0), change: None }, Input::Stopped(vec![failure(1)])]);
    }
    let Phase::Finishing(End::Failed(failures)) = &state.phase else { panic!("{:?}", state.phase) };
    assert_eq!(failures.len(), 2, "the failures seen while stopping join the summary");
    assert_eq!(state.restart_count, 1);
    // A membership change spends none.
    let mut state = State::new(Job { max_restarts: 0, ..job() });
    state.phase = Phase::Running;
    run(&mut state, vec![Input::Membership(RdzvEvent::PeerLost("b".into())), Input::Stopped(vec![failure(0)])]);
    assert!(matches!(state.phase, Phase::Reforming { open: true }));
    assert_eq!(state.restart_count, 0);
}

fn stop(grace: Grace, why: StopFor, open_first: bool) -> Op {
    Op::Stop { sig: Signal::SIGTERM, grace, why, open_first, keep: false }
}

#[test]
fn a_worker_failure_behind_a_membership_change_spends_no_restart() {
    // (the change found behind the failure, the next round opened before the stop, where the stopped group
    // goes): a change this node saw moves the round before its workers stop, so that the failures their stop
    // causes on the other nodes read as the change's; a store out of reach is not waited for.
    let table = [
        (RdzvEvent::RoundChanged, false, false),
        (RdzvEvent::PeerLost("b".into()), true, true),
        (RdzvEvent::JoinersWaiting, true, true),
        (RdzvEvent::HangElsewhere, true, true),
        (RdzvEvent::StoreOutage, false, true),
        (RdzvEvent::Fenced { silent: std::time::Duration::from_secs(3) }, false, true),
    ];
    for (change, first, open) in table {
        let mut state = State::new(Job { max_restarts: 0, ..job() });
        state.phase = Phase::Running;
        let failed = Input::WorkerFailed { failure: failure(0), change: Some(change.clone()) };
        run(&mut state, vec![failed]);
        assert!(matches!(&state.phase, Phase::Stopping(Cause::Membership(e)) if *e == change), "{change:?}: {:?}", state.phase);
        let fenced = matches!(change, RdzvEvent::Fenced { .. });
        let grace = if fenced { Grace::Fenced } else { Grace::Membership };
        assert_eq!(state.op(), stop(grace, StopFor::Reformation, first), "{change:?}");
        run(&mut state, vec![Input::Stopped(vec![failure(1)])]);
        assert!(matches!(state.phase, Phase::Reforming { open: o } if o == open), "{change:?}: {:?}", state.phase);
        assert_eq!(state.restart_count, 0, "{change:?}");
    }
}

fn hung(here: bool) -> Input {
    let verdict = crate::hang::verdict::Verdict {
        kind: crate::hang::verdict::Kind::StoppedFirst,
        suspects: vec![3],
        line: "hang: rank 3".into(),
    };
    Input::Hung(Box::new(crate::hang::Found { incident: 1, verdict, here, judged: !here, stacks: None }))
}

#[test]
fn a_hang_restarts_the_suspects_node_and_reforms_the_others_or_is_only_reported() {
    use crate::config::OnHang;
    // (on-hang, suspect here, phase after the hang, op, phase once stopped, restarts spent)
    let table = [
        (OnHang::Restart, true, "stopping", Some((Grace::Membership, StopFor::Restart)), "restarting", 1),
        (OnHang::Restart, false, "stopping", Some((Grace::Membership, StopFor::Reformation)), "restarting", 0),
        (OnHang::Report, true, "running", None, "running", 0),
        (OnHang::Report, false, "running", None, "running", 0),
    ];
    for (on_hang, here, after, grace, stopped, spent) in table {
        let case = format!("{on_hang:?} here={here}");
        let mut state = State::new(Job { on_hang, ..job() });
        state.phase = Phase::Running;
        run(&mut state, vec![hung(here)]);
        assert_eq!(state.phase_name(), after, "{case}");
        match grace {
            Some((g, why)) => assert_eq!(state.op(), stop(g, why, !here), "{case}"),
            None => assert_eq!(state.op(), Op::Watch, "{case}"),
        }
        if grace.is_some() {
            run(&mut state, vec![Input::Stopped(vec![failure(3)])]);
            assert!(matches!(state.phase, Phase::Reforming { open: true }), "{case}: {:?}", state.phase);
        }
        assert_eq!(state.phase_name(), stopped, "{case}");
        assert_eq!(state.restart_count, spent, "{case}");
    }
    // The last restart spent on a hang ends the job as a failure, the stopped workers its summary.
    let mut state = State::new(Job { max_restarts: 0, ..job() });
    state.phase = Phase::Running;
    run(&mut state, vec![hung(true), Input::Stopped(vec![failure(3)])]);
    assert!(matches!(&state.phase, Phase::Finishing(End::Failed(f)) if f.len() == 1), "{:?}", state.phase);
}

#[test]
fn the_round_moving_while_a_hang_is_judged_waits_for_the_verdict_and_the_suspects_node_spends_its_restart() {
    use crate::config::OnHang;
    let moved = || Input::Membership(RdzvEvent::RoundChanged);
    let failed_with_it = || Input::WorkerFailed { failure: failure(0), change: Some(RdzvEvent::RoundChanged) };
    // (input, waits for the verdict)
    let waits = [
        (moved(), true),
        (failed_with_it(), true),
        (Input::Membership(RdzvEvent::Fenced { silent: std::time::Duration::from_secs(5) }), false),
        (Input::Membership(RdzvEvent::PeerLost("b".into())), false),
        (Input::WorkerFailed { failure: failure(0), change: Some(RdzvEvent::StoreOutage) }, false),
        (Input::WorkerFailed { failure: failure(0), change: None }, false),
    ];
    for (input, want) in &waits {
        assert_eq!(super::hang::waits_for_verdict(input), *want, "{}", input.name());
    }
    // (input, on-hang, verdict: suspect here / none in time, restarts spent once stopped)
    let table = [
        (moved(), OnHang::Restart, Some(true), 1),
        (failed_with_it(), OnHang::Restart, Some(true), 1),
        (moved(), OnHang::Restart, Some(false), 0),
        (moved(), OnHang::Restart, None, 0),
        (moved(), OnHang::Report, Some(true), 0),
    ];
    for (input, on_hang, here, spent) in table {
        let case = format!("{} {on_hang:?} {here:?}", input.name());
        let found = here.map(|h| match hung(h) {
            Input::Hung(found) => *found,
            _ => unreachable!("hung() is a hang"),
        });
        let mut state = State::new(Job { on_hang, ..job() });
        state.phase = Phase::Running;
        run(&mut state, vec![super::hang::after_verdict(input, found, on_hang)]);
        assert_eq!(state.phase_name(), "stopping", "{case}");
        run(&mut state, vec![Input::Stopped(Vec::new())]);
        assert_eq!(state.restart_count, spent, "{case}");
    }
}

#[test]
fn warm_spares_are_worth_it_while_another_start_can_come() {
    // (max restarts, spent, multi-node) -> another start possible
    let table = [((1, 0, false), true), ((1, 1, false), false), ((0, 0, true), true), ((0, 0, false), false)];
    for ((max_restarts, spent, multi_node), want) in table {
        let mut state = State::new(Job { max_restarts, multi_node, ..job() });
        state.restart_count = spent;
        assert_eq!(state.another_start_possible(), want, "{max_restarts} {spent} {multi_node}");
    }
}

#[test]
fn a_fenced_node_stops_with_the_fence_grace_and_rejoins() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    run(&mut state, vec![Input::Membership(RdzvEvent::Fenced { silent: std::time::Duration::from_secs(2) })]);
    assert_eq!(state.op(), stop(Grace::Fenced, StopFor::Reformation, false));
    run(&mut state, vec![Input::Stopped(vec![failure(0)])]);
    assert!(matches!(state.phase, Phase::Reforming { open: true }));
    assert_eq!(state.restart_count, 0);
}

#[test]
fn a_round_changed_elsewhere_is_followed_not_opened() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    run(&mut state, vec![Input::Membership(RdzvEvent::RoundChanged), Input::Stopped(vec![])]);
    assert!(matches!(state.phase, Phase::Reforming { open: false }));
    state.phase = Phase::Joining;
    run(&mut state, vec![Input::JoinChanged(RdzvEvent::Closed(Closure::Finished))]);
    assert!(matches!(state.phase, Phase::Done(End::Error(AgentError::Rendezvous(RdzvError::Closed(_))))));
    // A job over its restart budget ends every node with the budget's line.
    state.phase = Phase::Running;
    let over = RdzvEvent::Closed(Closure::OverBudget("the job restarted 3 times".into()));
    run(&mut state, vec![Input::Membership(over), Input::Stopped(vec![])]);
    assert!(matches!(&state.phase, Phase::Done(End::Error(AgentError::Rendezvous(RdzvError::RestartBudget(l)))) if l.contains("3 times")));
}

#[test]
fn a_gpu_excluded_while_joining_lets_the_join_finish_then_reforms_and_refunds_the_restart() {
    let mut state = State::new(job());
    state.phase = Phase::Running;
    // The worker on GPU 2 dies first (a restart is spent), its DBE arrives while the node rejoins.
    run(&mut state, vec![Input::WorkerFailed { failure: failure(2), change: None }, Input::Stopped(vec![]), Input::Reformed]);
    assert_eq!(state.restart_count, 1);
    run(&mut state, vec![Input::Fault(fault(2, FaultKind::DoubleBitEcc, Action::Exclude))]);
    assert!(matches!(state.phase, Phase::Joining), "the join goes on: {:?}", state.phase);
    assert_eq!(state.restart_count, 0, "the exclusion was the cause: no restart spent");
    assert_eq!(state.op(), super::state::Op::Join);
    run(&mut state, vec![Input::Joined { nproc: 4 }]);
    assert!(matches!(state.phase, Phase::Reforming { open: true }), "joined with 4, needs 3: {:?}", state.phase);
    run(&mut state, vec![Input::Reformed, Input::Joined { nproc: 3 }]);
    assert!(matches!(state.phase, Phase::Starting));
    run(&mut state, vec![Input::Started { gpus: Some([0, 1, 3].into()), kept: 0 }]);
    assert!(!state.spent_by_last_stop);
}

#[test]
fn every_stop_says_what_it_is_for() {
    let lost = || fault(0, FaultKind::Lost, Action::Drain);
    let restart = || Cause::Restart { failures: vec![failure(0)], fault: None, hang: false };
    // (the cause, restarts spent, what the stop is for, the next round opened first)
    let table = [
        (Cause::Membership(RdzvEvent::PeerLost("n1".into())), 0, StopFor::Reformation, true),
        (Cause::Membership(RdzvEvent::Fenced { silent: std::time::Duration::from_secs(2) }), 0, StopFor::Reformation, false),
        (Cause::Exclude(lost()), 0, StopFor::Reformation, true),
        (restart(), 2, StopFor::Restart, false),
        (restart(), 3, StopFor::Failure, false),
        (Cause::Drain(lost()), 0, StopFor::Drain, false),
        (Cause::Signal(Signal::SIGINT), 0, StopFor::Shutdown, false),
        (Cause::Error(AgentError::Internal("x".into())), 0, StopFor::Shutdown, false),
    ];
    for (cause, spent, want, first) in table {
        let case = format!("{cause:?} after {spent} restarts");
        let mut state = State::new(job());
        state.restart_count = spent;
        state.phase = Phase::Stopping(cause);
        let op = state.op();
        assert!(matches!(op, Op::Stop { why, open_first, .. } if why == want && open_first == first), "{case}: {op:?}");
    }
}

/// The op the node runs once its group, on GPUs 0 and 1, stopped after `cause`.
fn reform_after(job: Job, failed: Input) -> (State, Op) {
    let mut state = State::new(job);
    state.phase = Phase::Running;
    state.in_use = Some([0, 1].into());
    run(&mut state, vec![failed, Input::Stopped(Vec::new())]);
    let op = state.op();
    (state, op)
}

#[test]
fn a_workers_death_on_a_gpu_node_checks_its_gpus_before_any_re_formation() {
    let own = || Input::WorkerFailed { failure: failure(0), change: None };
    let membership = || Input::WorkerFailed { failure: failure(0), change: Some(RdzvEvent::RoundChanged) };
    let peer = || Input::Membership(RdzvEvent::PeerLost("n1".into()));
    let hung = || hung(true);
    let check = || Some([0, 1].into());
    // (what stopped the group, on a GPU node?, what the re-formation checks first)
    let table: [(&str, Input, bool, Option<BTreeSet<u32>>); 6] = [
        // A restart, or a death that came with a membership change: the GPU fault behind it may follow.
        ("death, restart", own(), true, check()),
        ("death with a membership change", membership(), true, check()),
        ("death without GPUs", own(), false, None),
        // No worker died by itself: nothing to wait for.
        ("a peer lost", peer(), true, None),
        ("a hang", hung(), true, None),
        ("a signal", Input::Signal(Signal::SIGTERM), true, None),
    ];
    for (case, input, gpus, want) in table {
        let job = if gpus { job() } else { Job { gpus: BTreeSet::new(), ..job() } };
        let (mut state, op) = reform_after(job, input);
        match op {
            Op::Reform { check, .. } => assert_eq!(check, want, "{case}"),
            other => assert!(want.is_none() && !matches!(other, Op::Start { .. }), "{case}: {other:?}"),
        }
        if want.is_some() {
            // Checked once: the re-formation done, the next one (another round) asks nothing.
            run(&mut state, vec![Input::Reformed]);
            state.phase = Phase::Reforming { open: false };
            assert!(matches!(state.op(), Op::Reform { check: None, .. }), "{case}: {:?}", state.op());
        }
    }
}

#[test]
fn the_fault_behind_a_death_ends_the_wait_for_it_and_decides() {
    // XID 79 on GPU 1 while the re-formation waits, or as its own direct check found it: the node drains
    // before it joins a round, and starts no worker.
    let (mut state, _) = reform_after(job(), Input::WorkerFailed { failure: failure(1), change: None });
    run(&mut state, vec![Input::Fault(fault(1, FaultKind::Lost, Action::Drain))]);
    assert!(matches!(state.phase, Phase::Draining(_)), "{:?}", state.phase);
    // With exclude, GPU 1 goes and the re-formation asks only what is left, no more than once.
    let (mut state, _) = reform_after(job(), Input::WorkerFailed { failure: failure(1), change: None });
    run(&mut state, vec![Input::Fault(fault(1, FaultKind::Xid(Some(79)), Action::Exclude))]);
    assert!(matches!(state.op(), Op::Reform { check: None, .. }), "{:?}", state.op());
    assert!(state.excluded.contains(&1));
    assert_eq!(state.restart_count, 0, "the death's restart is refunded: one incident");
}

#[test]
fn a_stop_keeps_workers_in_place_only_for_a_change_or_a_death_with_a_restart_left() {
    let lost = || fault(0, FaultKind::Lost, Action::Drain);
    let died = |hang: bool, fault| Cause::Restart { failures: vec![failure(0)], fault, hang };
    let change = |e: RdzvEvent| Cause::Membership(e);
    let cut = || RdzvEvent::Fenced { silent: std::time::Duration::from_secs(2) };
    // (the cause, restarts spent of 3, whether the stop keeps the workers that can re-form in place)
    type Row<'a> = (Box<dyn Fn() -> Cause + 'a>, u32, bool);
    let table: Vec<Row> = vec![
        (Box::new(|| change(RdzvEvent::PeerLost("b".into()))), 0, true),
        (Box::new(|| change(RdzvEvent::JoinersWaiting)), 0, true),
        (Box::new(|| change(RdzvEvent::RoundChanged)), 0, true),
        (Box::new(|| change(RdzvEvent::StoreOutage)), 0, true),
        // Cut off: stopped before the others may evict it; a hang elsewhere restarts cold.
        (Box::new(move || change(cut())), 0, false),
        (Box::new(|| change(RdzvEvent::HangElsewhere)), 0, false),
        (Box::new(|| change(RdzvEvent::Closed(Closure::Finished))), 0, false),
        (Box::new(move || died(false, None)), 2, true),
        // No restart left: the group fails as a whole.
        (Box::new(move || died(false, None)), 3, false),
        (Box::new(move || died(true, None)), 0, false),
        (Box::new(move || died(false, Some(lost()))), 0, false),
        (Box::new(move || Cause::Exclude(lost())), 0, false),
        (Box::new(move || Cause::Drain(lost())), 0, false),
        (Box::new(|| Cause::Signal(Signal::SIGTERM)), 0, false),
        (Box::new(|| Cause::Error(AgentError::Internal("x".into()))), 0, false),
    ];
    for (cause, spent, want) in table {
        for in_place in [true, false] {
            let mut state = State::new(Job { in_place, ..job() });
            state.restart_count = spent;
            state.phase = Phase::Stopping(cause());
            let keep = matches!(state.op(), Op::Stop { keep: true, .. });
            assert_eq!(keep, want && in_place, "{:?} after {spent} restarts, in place {in_place}", cause());
        }
    }
}
