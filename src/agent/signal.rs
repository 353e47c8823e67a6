//! What happens when a signal the agent handles (`--signals-to-handle`) arrives, in every phase.
//!
//! Running workers get the signal itself (torchrun forwards it), then the agent exits 128+N. With no
//! workers running the agent stops at once. A node that is draining finishes draining (its exit code says
//! "unhealthy", which a scheduler must see); a node closing a failed job finishes closing (bounded by
//! `close_timeout`) so the other nodes stop too.

use nix::sys::signal::Signal;

use super::state::{Cause, End, Phase};

pub fn on_signal(phase: Phase, sig: Signal) -> Phase {
    match phase {
        Phase::Running => Phase::Stopping(Cause::Signal(sig)),
        Phase::Stopping(cause) => Phase::Stopping(cause.merge(Cause::Signal(sig))),
        Phase::Joining | Phase::Starting | Phase::Reforming { .. } => Phase::Done(End::Interrupted(sig)),
        Phase::Finishing(End::Succeeded) => Phase::Done(End::Interrupted(sig)),
        phase @ (Phase::Finishing(_) | Phase::Draining(_) | Phase::Done(_)) => phase,
    }
}
