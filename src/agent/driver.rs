//! The driver: runs the current phase's operation (`ops.rs`) and feeds everything that happens (the
//! operation's completion, signals, GPU faults) into `step::step`. Effects live here and in `ops.rs`;
//! decisions don't. Set-up is `setup.rs`, the transition events `transitions.rs`.
//!
//! An operation keeps running while `step` leaves its [`Op`] unchanged (a fault absorbed while joining does
//! not make the node join twice); otherwise it is dropped and the next one starts. Dropping is safe: the store
//! client is cancel-safe, and the phases whose work must not be cut (spawning) have no await point inside.

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::gpu::FaultLog;
use super::ops::Work;
use super::state::{Effect, End, Input, Op, Phase, State};
use super::transitions::{detail, Transitions};
use super::AgentError;
use crate::gpu::health::Watcher;
use crate::signals::Delivery;

/// The inputs that can come in every phase: handled signals and GPU faults.
pub(super) struct Ambient {
    pub(super) signals: mpsc::UnboundedReceiver<Delivery>,
    pub(super) watcher: Option<Watcher>,
}

impl Ambient {
    /// The next signal or fault (cancel-safe: both are channel receives).
    async fn next(&mut self) -> Input {
        let fault = async {
            match &mut self.watcher {
                Some(w) => w.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(delivery) = self.signals.recv() => match delivery {
                Delivery::Stop(sig) => Input::Signal(sig),
                Delivery::Notice(sig) => Input::Notice(sig),
            },
            Some(fault) = fault => Input::Fault(fault),
            // Both sources gone (every watcher thread ended, signal intake closed): nothing more will come.
            else => std::future::pending().await,
        }
    }
}

pub struct Agent {
    pub(super) work: Work,
    pub(super) ambient: Ambient,
    pub(super) state: State,
    pub(super) faults: FaultLog,
    pub(super) transitions: Transitions,
}

impl Agent {
    /// Runs phases until the agent is done; emits every transition, the final one exactly once.
    pub async fn drive(mut self) -> End {
        let Agent { work, ambient, state, faults, transitions } = &mut self;
        transitions.go(Some(state), state.phase.kind(), detail(state), None);
        while !state.is_done() {
            let op = state.op();
            if matches!(op, Op::Start { .. }) {
                work.spares.set_next_start_possible(state.another_start_possible());
            }
            let (completion, forward) = {
                let run = work.operate(op.clone(), state.restart_count, state.nproc(), state.excluded.clone());
                tokio::pin!(run);
                loop {
                    let input = tokio::select! {
                        biased;
                        input = ambient.next() => input,
                        input = &mut run => break (Some(input), None),
                    };
                    let forward = apply(state, input, faults, transitions);
                    // A forward needs the group the operation holds: the watch is cancel-safe, so it is
                    // dropped, the signal sent, and the same operation started again.
                    if state.op() != op || forward.is_some() {
                        break (None, forward);
                    }
                }
            };
            if let (Some(sig), Some(group)) = (forward, work.group.as_ref()) {
                group.notify(sig);
            }
            // The operation is over (dropped or done), so its round can be read.
            if let Some(input) = completion {
                if let (Input::Joined { .. }, Some((round, _, _))) = (&input, &work.round) {
                    transitions.joined(round);
                }
                if let (Some(sig), Some(group)) = (apply(state, input, faults, transitions), work.group.as_ref()) {
                    group.notify(sig);
                }
            }
        }
        if let Phase::Done(End::Interrupted(sig)) = &state.phase {
            work.close_stopped(*sig).await;
        }
        // Workers kept in place by a re-formation that did not end in a start.
        work.stop_kept(&state.phase).await;
        // The store's host keeps serving a closed job until the others have read why it closed.
        work.rendezvous.outlive_closure().await;
        match std::mem::replace(&mut state.phase, Phase::Done(End::Succeeded)) {
            Phase::Done(end) => end,
            _ => End::Error(AgentError::Internal("the driver stopped before the end".into())),
        }
    }
}

/// One step: the decision, its effects, and the transition event when the phase changed. Returns the
/// notice signal to forward to the workers, if any (the caller holds the group).
fn apply(state: &mut State, input: Input, faults: &mut FaultLog, transitions: &mut Transitions) -> Option<Signal> {
    let before = state.phase_name();
    tracing::trace!(input = input.name(), phase = before, "input");
    if let (Input::Signal(sig), Phase::Running | Phase::Stopping(_)) = (&input, &state.phase) {
        tracing::warn!("received {} death signal, shutting down workers", sig.as_str());
    }
    let seen = transitions.observer.before(input.record(state));
    let mut forward = None;
    for effect in super::step::step(state, input) {
        match effect {
            Effect::Fault(fault, verdict) => {
                let count = faults.record(&fault, verdict);
                transitions.observer.fault(&fault, verdict.as_str(), count);
            }
            Effect::Forward(sig) => forward = Some(sig),
            Effect::RestartSpent(kind) => transitions.observer.restart_spent(kind),
            Effect::Excluded(_) => transitions.observer.gpu_excluded(),
        }
    }
    transitions.observer.after(&state.record());
    let after = state.phase_name();
    if after != before || state.is_done() {
        transitions.go(Some(state), state.phase.kind(), detail(state), Some(seen.at()));
    }
    forward
}

