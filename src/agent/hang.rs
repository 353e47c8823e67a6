//! What happens when a hang is found (`crate::hang` noticed it, captured every rank's stack and has the
//! verdict): with `--on-hang report` nothing stops; with `restart`, a node with a suspect among its ranks
//! stops and restarts its group as for a worker failure (one restart spent, cause "hang"), and every other
//! node stops for the re-formation that follows (a membership change: no restart spent), so that no node
//! waits for its workers to fail on the culprit's departure.

use super::state::{unexpected, Cause, Phase};
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
