//! The agent: a pure transition function (`step.rs` over `state.rs`'s types, with one file per cause) and a
//! driver (`driver.rs`) that runs each phase's operation (`ops.rs`, `start.rs`) and feeds every event, from every
//! source, back into it; `setup.rs` sets it up, `transitions.rs` reports each phase change.
//!
//! Where each decision lives:
//! - a worker dies, a stopped group restarts (restart accounting): `worker.rs`;
//! - a peer dies or joins, the round changes: `peer.rs`;
//! - a GPU fault (XID, ECC, lost GPU) arrives: `gpu.rs`;
//! - a signal arrives: `signal.rs`;
//! - a hang is found (captured and judged by `crate::hang`): `hang.rs`.
//!
//! Every transition is an event with a timestamp and the time spent in the state it leaves; every way the
//! agent ends emits exactly one final transition.

mod banner;
mod driver;
mod gate;
mod gpu;
mod hang;
mod inplace;
mod links;
mod ops;
mod peer;
mod prestart;
mod setup;
mod signal;
mod start;
pub mod state;
mod step;
mod stores;
mod transitions;
mod worker;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod step_table;

use std::sync::Arc;

use nix::sys::signal::Signal;
use tracing::Instrument;

use crate::config::LaunchConfig;
use crate::gpu::health::Fault;
use crate::observe::Sinks;
use crate::rendezvous::RdzvError;
use crate::store::StoreError;
use crate::supervisor::failure::ProcessFailure;
use crate::supervisor::logs::LogError;
use crate::supervisor::guard::OrphanGuard;
use crate::supervisor::SupervisorError;

/// What ended the agent with an error; each one's exit code is `crate::exit::of::of_error`.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("{0}")]
    Rendezvous(#[from] RdzvError),
    #[error("rendezvous store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Gpu(String),
    /// A check of the health gate failed (its line); the node drained before it joined.
    #[error("{0}")]
    Unhealthy(String),
    #[error("cannot resolve the rendezvous endpoint {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error(transparent)]
    Logs(#[from] LogError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error(transparent)]
    InPlace(#[from] crate::inplace::InPlaceError),
    #[error("internal error, please report it: {0}")]
    Internal(String),
}

/// How the agent ended.
#[derive(Debug)]
pub enum Outcome {
    Succeeded,
    /// Restarts exhausted; `name` titles the failure summary.
    Failed { name: String, failures: Vec<ProcessFailure> },
    /// Stopped because of a handled signal (workers got the same signal first).
    Interrupted(Signal),
    /// A GPU fault drained this node: workers stopped, the rendezvous left, the hook run.
    Drained(Fault),
}

/// Runs the job on this node until it succeeds, fails for good, drains, or is stopped by a signal.
/// `gpu_job`: the placement checked before start put the workers on GPUs, so every later placement must
/// too (a GPU job never silently runs without its GPUs). `sinks`: where events, metrics and health go
/// (opened before anything started); the event log is written out before this returns.
pub async fn run(
    cfg: LaunchConfig,
    guard: Arc<OrphanGuard>,
    gpu_job: bool,
    mut sinks: Sinks,
) -> Result<Outcome, AgentError> {
    let cfg = Arc::new(cfg);
    let end = async {
        sinks.serve();
        match driver::Agent::set_up(cfg.clone(), guard, gpu_job, &sinks).await {
            Ok(agent) => agent.drive().await,
            Err(end) => {
                transitions::Transitions::new(&cfg, &sinks).go(None, end.kind(), transitions::end_detail(&end), None);
                end
            }
        }
    }
    .instrument(crate::telemetry::agent_span(&cfg.run_id))
    .await;
    sinks.events.close();
    match end {
        state::End::Succeeded => Ok(Outcome::Succeeded),
        state::End::Failed(failures) => Ok(Outcome::Failed { name: cfg.entrypoint.name.clone(), failures }),
        state::End::Interrupted(sig) => Ok(Outcome::Interrupted(sig)),
        state::End::Drained(fault) => Ok(Outcome::Drained(fault)),
        state::End::Error(e) => Err(e),
    }
}
