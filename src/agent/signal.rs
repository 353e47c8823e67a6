//! What happens when a signal the agent handles arrives, in every phase (which signals stop and which only
//! warn: `crate::signals`).
//!
//! A stop signal (`--signals-to-handle`: SIGTERM, SIGINT, SIGHUP, SIGQUIT): running workers get the signal
//! itself (torchrun forwards it), have `--shutdown-timeout` to exit, then the agent exits 128+N. With no
//! workers running the agent stops at once. A node that is draining finishes draining (its exit code says
//! "unhealthy", which a scheduler must see); a node closing a failed job finishes closing (bounded by
//! `close_timeout`) so the other nodes stop too.
//!
//! A notice (SIGUSR1/SIGUSR2 when listed: a scheduler's warning that a stop is coming) goes to running
//! workers, which keep running; in any other phase there is no worker to tell, and nothing changes.

use nix::sys::signal::Signal;

use super::state::{Cause, Effect, End, Phase};

pub fn on_signal(phase: Phase, sig: Signal) -> Phase {
    match phase {
        Phase::Running => Phase::Stopping(Cause::Signal(sig)),
        Phase::Stopping(cause) => Phase::Stopping(cause.merge(Cause::Signal(sig))),
        Phase::Joining | Phase::Starting | Phase::Reforming { .. } => Phase::Done(End::Interrupted(sig)),
        Phase::Finishing(End::Succeeded) => Phase::Done(End::Interrupted(sig)),
        phase @ (Phase::Finishing(_) | Phase::Draining(_) | Phase::Done(_)) => phase,
    }
}

pub fn on_notice(phase: Phase, sig: Signal) -> (Phase, Vec<Effect>) {
    match phase {
        Phase::Running => (Phase::Running, vec![Effect::Forward(sig)]),
        phase => {
            tracing::info!("received {} while no worker runs ({}); nothing to forward", sig.as_str(), phase.name());
            (phase, Vec::new())
        }
    }
}
