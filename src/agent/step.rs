//! The agent's one transition function, `step(state, input)`.
//!
//! Every input is seen in every phase: a signal, a GPU fault, and the completion of the one operation the
//! current phase runs (joining a round, starting the workers, watching them, stopping them, ...). `step` is
//! pure; the driver (`driver.rs`) runs each phase's operation and turns what happens into inputs. What each
//! cause decides lives in one file each: `worker.rs` (a worker exits, a stopped group's restart accounting),
//! `peer.rs` (a peer dies or joins, the round changes), `gpu.rs` (a GPU fault arrives), `signal.rs` (a
//! signal arrives), `hang.rs` (a hang is found); this file dispatches to them and decides the rest.

use super::state::{unexpected, Cause, Effect, End, Input, Phase, State};
use super::AgentError;

/// The transition function: the new phase (in `state`) and the effects to carry out.
pub fn step(state: &mut State, input: Input) -> Vec<Effect> {
    if state.is_done() {
        return Vec::new();
    }
    let phase = std::mem::replace(&mut state.phase, Phase::Done(End::Succeeded));
    let (next, effects) = match input {
        Input::Signal(sig) => (super::signal::on_signal(phase, sig), Vec::new()),
        Input::Notice(sig) => super::signal::on_notice(phase, sig),
        Input::Fault(fault) => super::gpu::on_fault(state, phase, fault),
        Input::StartLost(fault) => super::gpu::on_start_lost(state, phase, fault),
        Input::Membership(event) => (super::peer::on_membership(phase, event), Vec::new()),
        Input::Hung(found) => (super::hang::on_hang(phase, &found, state.job.on_hang), Vec::new()),
        Input::JoinChanged(event) => (super::peer::on_join_changed(&state.job, phase, event), Vec::new()),
        Input::Stopped(later) => super::worker::on_stopped(state, phase, later),
        Input::Failed(error) => (on_failed(phase, error), Vec::new()),
        completion => (on_completion(state, phase, completion), Vec::new()),
    };
    state.phase = next;
    effects
}

/// An operation failed: stop a running group first; while finishing or draining it is only logged (both
/// are bounded and best-effort); elsewhere it ends the agent.
fn on_failed(phase: Phase, error: AgentError) -> Phase {
    match phase {
        Phase::Running => Phase::Stopping(Cause::Error(error)),
        Phase::Stopping(cause) => Phase::Stopping(cause.merge(Cause::Error(error))),
        Phase::Finishing(end) => {
            tracing::warn!("{error}");
            Phase::Done(end)
        }
        Phase::Draining(fault) => {
            tracing::warn!("{error}");
            Phase::Done(End::Drained(fault))
        }
        Phase::Done(end) => Phase::Done(end),
        _ => Phase::Done(End::Error(error)),
    }
}

/// The completions that need no cause-specific decision.
fn on_completion(state: &mut State, phase: Phase, input: Input) -> Phase {
    match (phase, input) {
        (Phase::Joining, Input::Joined { nproc }) if nproc == state.nproc() => Phase::Starting,
        (Phase::Joining, Input::Joined { .. }) => Phase::Reforming { open: true },
        (Phase::Starting, Input::Started { gpus, kept }) => {
            state.in_use = gpus;
            state.kept = kept;
            state.spent_by_last_stop = false;
            Phase::Running
        }
        (Phase::Running, Input::Succeeded) => Phase::Finishing(End::Succeeded),
        (Phase::Running, Input::WorkerFailed { failure, change }) => {
            state.worker_died();
            super::worker::on_worker_failed(failure, change)
        }
        (Phase::Reforming { .. }, Input::Reformed) => {
            state.unrecorded = None;
            state.died_on = None;
            Phase::Joining
        }
        (Phase::Draining(fault), Input::Drained) => Phase::Done(End::Drained(fault)),
        (Phase::Finishing(end), Input::Finished) => Phase::Done(end),
        (phase, input) => unexpected(phase, input.name()),
    }
}

