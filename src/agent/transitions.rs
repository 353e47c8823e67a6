//! Transition events: each phase change with the time spent in the state it leaves, handed to `observe`.

use std::time::Instant;

use serde_json::{json, Value};

use super::state::{Cause, End, Phase, State};
use crate::config::LaunchConfig;
use crate::gpu::health::Fault;
use crate::observe::record::PhaseKind;
use crate::observe::{Observer, Sinks, Transition};
use crate::rendezvous::{RdzvEvent, RoundInfo};

/// Transition events: each with the time spent in the state it leaves. Its observer turns them, with the
/// inputs and faults, into the event log, the metrics and `/healthz` (see `observe`).
pub struct Transitions {
    pub(super) observer: Observer,
    from: PhaseKind,
    since: Instant,
}

impl Transitions {
    /// The first state, `init`, began when the agent did (`sinks.started`).
    pub fn new(cfg: &LaunchConfig, sinks: &Sinks) -> Transitions {
        Transitions { observer: Observer::new(sinks, &cfg.run_id), from: PhaseKind::Init, since: sinks.started }
    }

    /// Into `to`; `state` is None when set-up failed, `input_at` when the input that caused it arrived.
    pub fn go(&mut self, state: Option<&State>, to: PhaseKind, detail: Value, input_at: Option<Instant>) {
        let now = Instant::now();
        let t = Transition { from: self.from, to, spent: now.saturating_duration_since(self.since), now, input_at };
        self.observer.transition(t, state.map(State::record).as_ref(), detail);
        self.from = to;
        self.since = now;
    }

    /// The round just joined (before the transition it causes).
    pub(super) fn joined(&mut self, round: &RoundInfo) {
        self.observer.joined(round, self.since.elapsed());
    }
}

/// What a transition's event says about the state it enters.
pub fn detail(state: &State) -> Value {
    match &state.phase {
        Phase::Joining => json!({ "restart_count": state.restart_count, "nproc": state.nproc() }),
        Phase::Stopping(Cause::Membership(RdzvEvent::PeerLost(peer))) => json!({ "reason": "membership change", "peer": peer }),
        Phase::Stopping(Cause::Membership(RdzvEvent::Fenced { silent })) => {
            json!({ "reason": "fenced", "silent_ms": silent.as_millis() as u64 })
        }
        Phase::Stopping(cause) => json!({ "reason": cause.name() }),
        Phase::Reforming { .. } => {
            json!({ "restart_count": state.restart_count, "remaining_restarts": state.restarts_left() })
        }
        Phase::Draining(f) => fault_detail(f),
        Phase::Done(end) => end_detail(end),
        _ => json!({}),
    }
}

fn fault_detail(f: &Fault) -> Value {
    json!({ "gpu": f.gpu.index, "fault": f.kind.to_string(), "action": f.action.as_str() })
}

/// What the final transition's event says.
pub fn end_detail(end: &End) -> Value {
    match end {
        End::Drained(f) => fault_detail(f),
        End::Error(e) => json!({ "error": e.to_string() }),
        End::Failed(failures) => json!({ "failures": failures.len() }),
        End::Interrupted(sig) => json!({ "signal": sig.as_str() }),
        End::Succeeded => json!({}),
    }
}
