//! What happens when a worker dies, and what a stopped group does next (restart accounting as torchrun:
//! a failed local group spends one restart; TORCHELASTIC_RESTART_COUNT is the number spent).
//!
//! The first non-zero exit stops the group. Exits seen while it stops belong to the same incident: they
//! join the failure summary, and a GPU fault met meanwhile is the same cause (one restart, not two).

use super::peer::after_change;
use super::state::{unexpected, Cause, Effect, End, Phase, State};
use super::AgentError;
use crate::rendezvous::RdzvEvent;
use crate::supervisor::failure::ProcessFailure;

/// A worker exited non-zero while the group ran. With a membership change behind it (the round moved on,
/// a neighbour is gone, the store out of reach) the failure is that change's, not the worker's: no
/// restart is spent.
pub fn on_worker_failed(failure: ProcessFailure, change: Option<RdzvEvent>) -> Phase {
    match change {
        Some(event) => {
            let doing = format!(
                "worker {} failed (exitcode {}) during a membership change",
                failure.local_rank, failure.exitcode
            );
            super::peer::log_change(&event, &doing);
            Phase::Stopping(Cause::Membership(event))
        }
        None => Phase::Stopping(Cause::Restart { failures: vec![failure], fault: None, hang: false }),
    }
}

/// The group is stopped; `later` are the failures seen while stopping.
pub fn on_stopped(state: &mut State, phase: Phase, later: Vec<ProcessFailure>) -> (Phase, Vec<Effect>) {
    let cause = match phase {
        Phase::Stopping(cause) => cause,
        phase => return (unexpected(phase, "stopped"), Vec::new()),
    };
    let kind = cause.kind();
    let next = match cause {
        Cause::Restart { mut failures, fault, .. } => {
            failures.extend(later);
            if state.restart_count < state.job.max_restarts {
                state.restart_count += 1;
                state.spent_by_last_stop = true;
                state.unrecorded = Some(kind);
                return (Phase::Reforming { open: true }, vec![Effect::RestartSpent(kind)]);
            }
            match fault {
                Some(f) if failures.is_empty() => Phase::Finishing(End::Error(AgentError::Gpu(format!(
                    "{} on GPU {} ({}) and no restarts left (--max-restarts {})",
                    f.kind, f.gpu.index, f.gpu.uuid, state.job.max_restarts
                )))),
                _ => Phase::Finishing(End::Failed(failures)),
            }
        }
        Cause::Membership(event) => after_change(&state.job, &event),
        Cause::Exclude(_) => Phase::Reforming { open: true },
        Cause::Drain(fault) => Phase::Draining(fault),
        Cause::Signal(sig) => Phase::Done(End::Interrupted(sig)),
        Cause::Error(e) => Phase::Done(End::Error(e)),
    };
    (next, Vec::new())
}
