//! What the agent hands its observers: plain records of its state and inputs, named once here. Events,
//! metrics, `/healthz` and the recovery tracker read these and nothing of the agent's own types.

/// A phase of the agent as operators see it; `as_str` is the one name events, metrics and logs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    /// Before the first transition.
    Init,
    Rendezvous,
    Starting,
    Running,
    Stopping,
    Restarting,
    Draining,
    Finishing,
    Succeeded,
    Failed,
    Interrupted,
    Drained,
}

impl PhaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Init => "init",
            PhaseKind::Rendezvous => "rendezvous",
            PhaseKind::Starting => "starting",
            PhaseKind::Running => "running",
            PhaseKind::Stopping => "stopping",
            PhaseKind::Restarting => "restarting",
            PhaseKind::Draining => "draining",
            PhaseKind::Finishing => "finishing",
            PhaseKind::Succeeded => "succeeded",
            PhaseKind::Failed => "failed",
            PhaseKind::Interrupted => "interrupted",
            PhaseKind::Drained => "drained",
        }
    }
}

/// Why the running group is being stopped, as operators see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    MembershipChange,
    Fenced,
    WorkerFailure,
    GpuFault,
    Hang,
    GpuExcluded,
    Error,
    NodeDrained,
    Signal,
}

impl StopKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StopKind::MembershipChange => "membership change",
            StopKind::Fenced => "fenced",
            StopKind::WorkerFailure => "worker failure",
            StopKind::GpuFault => "gpu fault",
            StopKind::Hang => "hang",
            StopKind::GpuExcluded => "gpu excluded",
            StopKind::Error => "error",
            StopKind::NodeDrained => "node drained",
            StopKind::Signal => "signal",
        }
    }

    /// The `cause` label of `muster_restarts_total` when this stop spends a restart.
    pub fn restart_label(self) -> &'static str {
        match self {
            StopKind::GpuFault => "gpu_fault",
            StopKind::Hang => "hang",
            _ => "worker_failure",
        }
    }
}

/// The agent's state as observers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRecord {
    pub phase: PhaseKind,
    /// While stopping, why.
    pub stop: Option<StopKind>,
    /// While finishing: whether the job succeeded.
    pub succeeding: bool,
    /// Workers this node runs now.
    pub nproc: u32,
    pub restart_count: u32,
    pub restarts_left: u32,
    /// Workers of the running group kept in place from the one before (0: every one started).
    pub kept: u32,
}

/// What an input says by itself, counted when it arrives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputRecord<'a> {
    /// Workers exited with these codes (minus the signal number when killed), one count each.
    Exits { exitcode: i32, count: u64 },
    /// Workers failed while the group stopped.
    Failures(&'a [crate::supervisor::failure::ProcessFailure]),
    /// The membership changed (the cause's metric label).
    Membership(&'static str),
    /// A hang was found and judged.
    Hang(&'a crate::hang::Found),
    Other,
}
