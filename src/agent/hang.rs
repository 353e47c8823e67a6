//! What happens when a hang is found (`crate::hang` noticed it, captured every rank's stack and has the
//! verdict): with `--on-hang report` nothing stops; with `restart`, a node with a suspect among its ranks
//! stops and restarts its group as for a worker failure (one restart spent, cause "hang"), and every other
//! node stops for the re-formation that follows (a membership change: no restart spent), so that no node
//! waits for its workers to fail on the culprit's departure.
//!
//! Those other nodes open the next round before they stop: a node still waiting for the verdict may see
//! the round move (or its workers fail with it) first. Such a change waits for the verdict, so that a
//! node hosting a suspect spends its restart rather than following the round, which would start the hung
//! rank again as if nothing had happened to it.

use super::state::{unexpected, Cause, Input, Phase};
use crate::config::OnHang;
use crate::hang::Found;
use crate::rendezvous::RdzvEvent;

pub fn on_hang(phase: Phase, found: &Found, action: OnHang) -> Phase {
    match (phase, action) {
        (Phase::Running, OnHang::Report) => Phase::Running,
        (Phase::Running, OnHang::Restart) if found.here => {
            Phase::Stopping(Cause::Restart { failures: Vec::new(), fault: None, hang: true })
        }
        (Phase::Running, OnHang::Restart) => Phase::Stopping(Cause::Membership(RdzvEvent::HangElsewhere)),
        // Found while the group was already being stopped or re-formed: that incident's course stands.
        (phase @ (Phase::Stopping(_) | Phase::Reforming { .. } | Phase::Joining | Phase::Starting), _) => phase,
        (phase, _) => unexpected(phase, "hung"),
    }
}

/// Whether `input`, met while the group runs and an incident is being judged here, waits for the verdict:
/// the round moved, seen as such or behind a worker's failure. Nothing else waits: a fence's or an
/// outage's stop cannot, and a failure of the node's own spends a restart anyway.
pub fn waits_for_verdict(input: &Input) -> bool {
    matches!(
        input,
        Input::Membership(RdzvEvent::RoundChanged) | Input::WorkerFailed { change: Some(RdzvEvent::RoundChanged), .. }
    )
}

/// What an input that waited comes to: the hang, when it restarts this node's group; else the input.
pub fn after_verdict(input: Input, found: Option<Found>, action: OnHang) -> Input {
    match found {
        Some(found) if found.here && action == OnHang::Restart => Input::Hung(Box::new(found)),
        _ => input,
    }
}
