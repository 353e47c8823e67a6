//! What happens when a GPU fault (an XID, a double-bit ECC error, a lost GPU, ...) arrives, in every phase.
//!
//! First, whether it concerns this node at all: a fault on a GPU that is excluded (or being excluded) or
//! that no worker of this node uses is reported and ignored, so the driver's follow-up report of one
//! incident (DBE then XID 48, XID 79 on a GPU excluded earlier) changes nothing. Then the policy's action:
//! - drain: in every phase, workers stop (if running), the node leaves the rendezvous, runs the hook, exits
//!   with the unhealthy-node code;
//! - exclude (when another GPU is left): the GPU is excluded at once and the group re-forms with one worker
//!   fewer, no restart spent; without a GPU to spare it drains;
//! - restart: a running group stops and spends one restart; met during a stop it merges with that stop's
//!   cause, and with no group running (the group restarts anyway) it is absorbed: one incident, one restart.

use std::collections::BTreeMap;

use super::state::{Cause, Effect, Phase, State, Verdict};
use crate::gpu::health::Fault;
use crate::gpu::xid::Action;

pub fn on_fault(state: &mut State, phase: Phase, fault: Fault) -> (Phase, Vec<Effect>) {
    if let Some(verdict) = irrelevant(state, &fault) {
        return (phase, vec![Effect::Fault(Box::new(fault), verdict)]);
    }
    // The fault a death was waited for has come: what it comes to is decided here.
    state.died_on = None;
    let action = effective_action(state, &fault);
    let (next, verdict) = match (phase, action) {
        (phase @ (Phase::Done(_) | Phase::Draining(_) | Phase::Finishing(_)), _) => (phase, Verdict::Absorbed),
        (Phase::Running, Action::Drain) => (Phase::Stopping(Cause::Drain(fault.clone())), Verdict::Acted),
        (Phase::Stopping(c), Action::Drain) => (Phase::Stopping(c.merge(Cause::Drain(fault.clone()))), Verdict::Acted),
        (_, Action::Drain) => (Phase::Draining(fault.clone()), Verdict::Acted),
        (phase, Action::Exclude) => {
            let next = exclude(state, phase, &fault);
            let gpu = fault.gpu.index;
            return (next, vec![Effect::Excluded(gpu), Effect::Fault(Box::new(fault), Verdict::Acted)]);
        }
        (Phase::Running, Action::Restart) => {
            (Phase::Stopping(Cause::Restart { failures: Vec::new(), fault: Some(fault.clone()), hang: false }), Verdict::Acted)
        }
        (Phase::Stopping(c), Action::Restart) => {
            let merged = c.merge(Cause::Restart { failures: Vec::new(), fault: Some(fault.clone()), hang: false });
            (Phase::Stopping(merged), Verdict::Absorbed)
        }
        (phase, Action::Restart | Action::Ignore) => (phase, Verdict::Absorbed),
    };
    (next, vec![Effect::Fault(Box::new(fault), verdict)])
}

/// Excludes the fault's GPU: a running group stops; a join in progress finishes and re-forms after (see
/// `Op::Join`); a start re-forms at once. A restart the worker's death spent just before its GPU's event
/// is refunded: one incident, one cause.
fn exclude(state: &mut State, phase: Phase, fault: &Fault) -> Phase {
    state.excluded.insert(fault.gpu.index);
    if state.spent_by_last_stop && !matches!(phase, Phase::Running | Phase::Stopping(_)) {
        state.restart_count = state.restart_count.saturating_sub(1);
        state.spent_by_last_stop = false;
        state.unrecorded = None;
    }
    match phase {
        Phase::Running => Phase::Stopping(Cause::Exclude(fault.clone())),
        Phase::Stopping(c) => Phase::Stopping(c.merge(Cause::Exclude(fault.clone()))),
        Phase::Starting => Phase::Reforming { open: true },
        phase => phase,
    }
}

/// Starting found a GPU the workers need not answering: as a fault on it, but the start is over, so a
/// restart-class action cannot be absorbed: the GPU is excluded where the policy allows, else the node
/// drains.
pub fn on_start_lost(state: &mut State, phase: Phase, fault: Fault) -> (Phase, Vec<Effect>) {
    if !matches!(phase, Phase::Starting) {
        return (super::state::unexpected(phase, "start_lost"), Vec::new());
    }
    let mut effects = Vec::new();
    let next = if effective_action(state, &fault) == Action::Exclude && !state.excluded.contains(&fault.gpu.index) {
        state.excluded.insert(fault.gpu.index);
        effects.push(Effect::Excluded(fault.gpu.index));
        Phase::Reforming { open: true }
    } else {
        Phase::Draining(fault.clone())
    };
    effects.push(Effect::Fault(Box::new(fault), Verdict::Acted));
    (next, effects)
}

/// Why a fault changes nothing here, if it does not.
fn irrelevant(state: &State, fault: &Fault) -> Option<Verdict> {
    let gpu = fault.gpu.index;
    if state.excluded.contains(&gpu) {
        return Some(Verdict::Excluded);
    }
    if state.in_use.as_ref().is_some_and(|used| !used.contains(&gpu)) {
        return Some(Verdict::Unused);
    }
    (fault.action == Action::Ignore).then_some(Verdict::Ignored)
}

/// The policy's action, with exclude becoming drain when no GPU or worker would be left.
fn effective_action(state: &State, fault: &Fault) -> Action {
    let usable = state.job.gpus.len().saturating_sub(state.excluded.len());
    match fault.action {
        Action::Exclude if usable > 1 && state.nproc() > 1 => Action::Exclude,
        Action::Exclude => Action::Drain,
        other => other,
    }
}

/// Counts of GPU faults by GPU and kind, carried in every fault event.
#[derive(Default)]
pub struct FaultLog {
    counts: BTreeMap<(u32, String), u64>,
}

impl FaultLog {
    /// Counts the fault (returned: how many of its kind this GPU has had) and says what was decided when
    /// it changes nothing; its event and metrics are the observer's.
    pub fn record(&mut self, fault: &Fault, verdict: Verdict) -> u64 {
        let count = self.counts.entry((fault.gpu.index, fault.kind.to_string())).or_insert(0);
        *count += 1;
        if verdict != Verdict::Acted {
            tracing::info!(gpu = fault.gpu.index, "{} on GPU {}: {}", fault.kind, fault.gpu.index, verdict.as_str());
        }
        *count
    }
}

/// The `--on-node-fault` hook's environment.
pub fn hook_env(fault: &Fault, run_id: &str) -> Vec<(String, String)> {
    [
        ("MUSTER_FAULT_KIND", fault.kind.to_string()),
        ("MUSTER_FAULT_XID", fault.kind.xid().map(|x| x.to_string()).unwrap_or_default()),
        ("MUSTER_FAULT_ACTION", fault.action.as_str().to_string()),
        ("MUSTER_FAULT_GPU_INDEX", fault.gpu.index.to_string()),
        ("MUSTER_FAULT_GPU_UUID", fault.gpu.uuid.clone()),
        ("MUSTER_FAULT_GPU_PCI_BUS_ID", fault.gpu.pci_bus_id.clone()),
        ("MUSTER_FAULT_HOSTNAME", crate::host::hostname()),
        ("MUSTER_RUN_ID", run_id.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}
