//! What happens when a peer dies or joins, or the round changes: the group re-forms without spending a
//! restart (torchrun's accounting: a membership change is nobody's failure).
//!
//! Whoever saw the change opens the next round (`Reforming { open: true }`); a node that only saw the round
//! counter move follows it. A job closed elsewhere (finished or failed for good on another node, or over its
//! restart budget) ends this node with that error.

use super::state::{unexpected, Cause, End, Job, Phase};
use super::AgentError;
use crate::rendezvous::{Closure, RdzvEvent};

/// A membership event while the workers run (the only phase that watches membership; joining watches it
/// itself and reports `JoinChanged`).
pub fn on_membership(phase: Phase, event: RdzvEvent) -> Phase {
    match phase {
        Phase::Running => Phase::Stopping(Cause::Membership(event)),
        phase => unexpected(phase, "membership"),
    }
}

/// The agent's line for a membership change seen while `doing` (running, joining, a worker failing): a
/// closed job ends this node, anything else re-forms the group.
pub fn log_change(event: &RdzvEvent, doing: &str) {
    match event {
        RdzvEvent::Closed(Closure::OverBudget(line)) => {
            tracing::info!("{doing}: the job was closed, its restart budget spent ({line}); ending")
        }
        RdzvEvent::Closed(Closure::Failed(line)) => tracing::info!("{doing}: the job failed on another node ({line}); ending"),
        RdzvEvent::Closed(Closure::Finished) => tracing::info!("{doing}: the job was closed on another node; ending"),
        RdzvEvent::Closed(Closure::Stopped { line, .. }) => tracing::info!("{doing}: the job was stopped ({line}); ending"),
        event => tracing::info!(?event, "{doing}; re-forming the group (no restart spent)"),
    }
}

/// The membership changed before the group started (group rank 0 lost before it published the workers'
/// store, or the round moved on).
pub fn on_join_changed(job: &Job, phase: Phase, event: RdzvEvent) -> Phase {
    match phase {
        Phase::Joining => after_change(job, &event),
        phase => unexpected(phase, "join_changed"),
    }
}

/// Where a membership change leads once no worker runs.
pub fn after_change(job: &Job, event: &RdzvEvent) -> Phase {
    match event {
        RdzvEvent::Closed(closure) => Phase::Done(End::Error(AgentError::Rendezvous(closure.clone().error(&job.run_id)))),
        RdzvEvent::RoundChanged => Phase::Reforming { open: false },
        // Cut off: the round is over for this node whatever the others did. Opening the next one is a no-op
        // when they already re-formed without it (the round counter moved), and tells them at once when the
        // cut healed before they could evict it (its workers are gone: theirs cannot finish a collective).
        RdzvEvent::PeerLost(_)
        | RdzvEvent::JoinersWaiting
        | RdzvEvent::Fenced { .. }
        | RdzvEvent::StoreOutage
        | RdzvEvent::HangElsewhere => {
            Phase::Reforming { open: true }
        }
    }
}
