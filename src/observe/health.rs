//! What `/healthz` answers: healthy (200) while the agent runs its workers or re-forms its group after a
//! failure or a membership change; unhealthy (503) once it is failing for good, draining for a GPU fault or
//! stopping for a signal, so a load balancer or a Kubernetes probe stops counting on the node.

use std::sync::Mutex;

use crate::agent::state::{Cause, End, Phase};

/// Whether a node in `phase` is healthy.
pub fn healthy(phase: &Phase) -> bool {
    match phase {
        Phase::Joining | Phase::Starting | Phase::Running | Phase::Reforming { .. } => true,
        Phase::Stopping(cause) => matches!(cause, Cause::Membership(_) | Cause::Restart { .. } | Cause::Exclude(_)),
        Phase::Finishing(end) | Phase::Done(end) => matches!(end, End::Succeeded),
        Phase::Draining(_) => false,
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
    use crate::agent::AgentError;
    use crate::gpu::health::Fault;
    use crate::gpu::xid::{Action, FaultKind};
    use crate::gpu::GpuInfo;
    use crate::rendezvous::RdzvEvent;
    use nix::sys::signal::Signal;

    fn fault() -> Fault {
        let gpu = GpuInfo { index: 0, uuid: "GPU-0".into(), pci_bus_id: "0".into(), name: String::new(), memory_total: 0 };
        Fault { gpu, kind: FaultKind::Lost, action: Action::Drain }
    }

    #[test]
    fn healthy_while_running_or_reforming_unhealthy_when_failing_or_draining() {
        let cases: Vec<(Phase, bool)> = vec![
            (Phase::Joining, true),
            (Phase::Starting, true),
            (Phase::Running, true),
            (Phase::Reforming { open: true }, true),
            (Phase::Stopping(Cause::Membership(RdzvEvent::PeerLost("b".into()))), true),
            (Phase::Stopping(Cause::Restart { failures: Vec::new(), fault: None, hang: false }), true),
            (Phase::Stopping(Cause::Exclude(fault())), true),
            (Phase::Stopping(Cause::Drain(fault())), false),
            (Phase::Stopping(Cause::Signal(Signal::SIGTERM)), false),
            (Phase::Stopping(Cause::Error(AgentError::Internal("x".into()))), false),
            (Phase::Draining(fault()), false),
            (Phase::Finishing(End::Succeeded), true),
            (Phase::Finishing(End::Failed(Vec::new())), false),
            (Phase::Done(End::Drained(fault())), false),
            (Phase::Done(End::Interrupted(Signal::SIGINT)), false),
        ];
        for (phase, expected) in cases {
            assert_eq!(healthy(&phase), expected, "{phase:?}");
        }
    }
}
