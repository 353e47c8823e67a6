//! What `/healthz` answers: healthy (200) while the agent runs its workers or re-forms its group after a
//! failure or a membership change; unhealthy (503) once it is failing for good, draining for a GPU fault or
//! stopping for a signal, so a load balancer or a Kubernetes probe stops counting on the node.

use std::sync::Mutex;

use super::record::{PhaseKind, StateRecord, StopKind};

/// Whether a node in `state` is healthy: it runs, or re-forms after a failure or a membership change.
pub fn healthy(state: &StateRecord) -> bool {
    match state.phase {
        PhaseKind::Init | PhaseKind::Rendezvous | PhaseKind::Starting | PhaseKind::Running | PhaseKind::Restarting => true,
        PhaseKind::Stopping => state.stop.is_some_and(|stop| {
            matches!(
                stop,
                StopKind::MembershipChange
                    | StopKind::Fenced
                    | StopKind::WorkerFailure
                    | StopKind::GpuFault
                    | StopKind::Hang
                    | StopKind::GpuExcluded
            )
        }),
        PhaseKind::Finishing => state.succeeding,
        PhaseKind::Succeeded => true,
        PhaseKind::Draining | PhaseKind::Failed | PhaseKind::Interrupted | PhaseKind::Drained => false,
    }
}

/// The state `/healthz` reports, set at every transition.
#[derive(Debug)]
pub struct Health {
    now: Mutex<(bool, &'static str)>,
}

impl Default for Health {
    fn default() -> Health {
        Health { now: Mutex::new((true, "init")) }
    }
}

impl Health {
    pub fn set(&self, healthy: bool, state: &'static str) {
        if let Ok(mut now) = self.now.lock() {
            *now = (healthy, state);
        }
    }

    /// Whether the node is healthy, and its state's name.
    pub fn get(&self) -> (bool, &'static str) {
        self.now.lock().map(|now| *now).unwrap_or((false, "unknown"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_while_running_or_reforming_unhealthy_when_failing_or_draining() {
        use PhaseKind::*;
        let state = |phase, stop, succeeding| StateRecord {
            phase,
            stop,
            succeeding,
            nproc: 1,
            restart_count: 0,
            restarts_left: 0,
            kept: 0,
        };
        let cases = [
            (state(Rendezvous, None, false), true),
            (state(Starting, None, false), true),
            (state(Running, None, false), true),
            (state(Restarting, None, false), true),
            (state(Stopping, Some(StopKind::MembershipChange), false), true),
            (state(Stopping, Some(StopKind::WorkerFailure), false), true),
            (state(Stopping, Some(StopKind::Hang), false), true),
            (state(Stopping, Some(StopKind::GpuExcluded), false), true),
            (state(Stopping, Some(StopKind::NodeDrained), false), false),
            (state(Stopping, Some(StopKind::Signal), false), false),
            (state(Stopping, Some(StopKind::Error), false), false),
            (state(Draining, None, false), false),
            (state(Finishing, None, true), true),
            (state(Finishing, None, false), false),
            (state(Drained, None, false), false),
            (state(Interrupted, None, false), false),
        ];
        for (s, expected) in cases {
            assert_eq!(healthy(&s), expected, "{s:?}");
        }
    }
}
