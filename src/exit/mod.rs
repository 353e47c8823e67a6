//! The exit codes: how the agent ended, as a number a scheduler's policy can act on (requeue, reschedule
//! elsewhere, give up). `docs/exit-codes.md` is the table users and policies are written against; keep the
//! two in step. The codes are here; which ending gets which is `of.rs` (apart, so that every module can use
//! the codes without depending on the agent).

use nix::sys::signal::Signal;

pub mod of;

/// Every worker exited 0.
pub const SUCCESS: u8 = 0;
/// The workers failed and the restart budget is spent, or the agent could not run them.
pub const FAILED: u8 = 1;
/// Bad input: nothing was started.
pub const USAGE: u8 = 2;
/// The rendezvous did not complete (join timeout, the store unreachable or lost): requeueing is reasonable.
pub const RDZV_INCOMPLETE: u8 = 3;
/// The rendezvous was closed (the job ended or was closed without this node): do not requeue.
pub const RDZV_CLOSED: u8 = 4;
/// The job's restart budget (`--job-max-restarts`) is spent: it fails too often, do not requeue it.
pub const RESTART_BUDGET_SPENT: u8 = 5;
/// This node drained itself for a GPU fault: reschedule on another node. sysexits' EX_TEMPFAIL.
pub const NODE_UNHEALTHY: u8 = 75;

/// Stopped for (or killed by) signal `sig`: 128+N, as a shell reports it (143 = SIGTERM, a preemption).
pub fn signal(sig: Signal) -> u8 {
    // Signal numbers are below 65 on Linux, so this never saturates.
    128u8.saturating_add(sig as u8)
}

