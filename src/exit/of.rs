//! Which ending of the agent gets which exit code, as one table.

use super::{signal, FAILED, NODE_UNHEALTHY, RDZV_CLOSED, RDZV_INCOMPLETE, RESTART_BUDGET_SPENT, SUCCESS, USAGE};
use crate::agent::{AgentError, Outcome};
use crate::rendezvous::RdzvError;
use crate::store::StoreError;

/// The exit code of a finished agent.
pub fn of_outcome(outcome: &Result<Outcome, AgentError>) -> u8 {
    match outcome {
        Ok(Outcome::Succeeded) => SUCCESS,
        Ok(Outcome::Failed { .. }) => FAILED,
        Ok(Outcome::Interrupted(sig)) => signal(*sig),
        Ok(Outcome::Drained(_)) => NODE_UNHEALTHY,
        Err(e) => of_error(e),
    }
}

/// The exit code of an agent that ended with an error.
pub fn of_error(e: &AgentError) -> u8 {
    match e {
        AgentError::Rendezvous(e) => of_rendezvous(e),
        AgentError::Store(e) => of_store(e),
        // The endpoint's name may not be published yet (a Kubernetes service, DNS in flux).
        AgentError::Resolve(..) => RDZV_INCOMPLETE,
        AgentError::Unhealthy(_) => NODE_UNHEALTHY,
        AgentError::Signals(_)
        | AgentError::Gpu(_)
        | AgentError::Logs(_)
        | AgentError::Supervisor(_)
        | AgentError::InPlace(_)
        | AgentError::Internal(_) => FAILED,
    }
}

fn of_rendezvous(e: &RdzvError) -> u8 {
    match e {
        RdzvError::Store(e) => of_store(e),
        RdzvError::Timeout { .. }
        | RdzvError::StoreLost
        | RdzvError::StoreHostEnded { .. }
        | RdzvError::StoreRefused { .. } => RDZV_INCOMPLETE,
        RdzvError::Closed(_) | RdzvError::FailedElsewhere(_) => RDZV_CLOSED,
        RdzvError::RestartBudget(_) => RESTART_BUDGET_SPENT,
        // The store's host was stopped by this signal: every node ends as if it had been.
        RdzvError::StoppedElsewhere { signal: sig, .. } => nix::sys::signal::Signal::try_from(*sig).map_or(FAILED, signal),
        RdzvError::KeptOut(_) => NODE_UNHEALTHY,
        // The same on every retry: the nodes were started with different settings.
        RdzvError::Mismatch(_) | RdzvError::State(_) => FAILED,
    }
}

fn of_store(e: &StoreError) -> u8 {
    match e {
        // Input that stays wrong on every retry: the endpoint is some other program, or the token is wrong.
        StoreError::NotAStore { .. }
        | StoreError::WrongToken { .. }
        | StoreError::NotEtcd { .. }
        | StoreError::EtcdAuth { .. }
        | StoreError::KubeForbidden { .. }
        | StoreError::Tls { .. }
        | StoreError::BadSetting { .. } => USAGE,
        StoreError::Resolve { .. }
        | StoreError::Connect { .. }
        | StoreError::Timeout { .. }
        | StoreError::WaitTimeout { .. }
        | StoreError::Closed { .. }
        | StoreError::Io { .. }
        | StoreError::Broken { .. }
        | StoreError::Refused { .. }
        | StoreError::Unreachable { .. }
        | StoreError::ApiServerUnreachable { .. } => RDZV_INCOMPLETE,
        StoreError::Bind { .. }
        | StoreError::Handshake { .. }
        | StoreError::Protocol { .. }
        | StoreError::Etcd { .. }
        | StoreError::Kube { .. } => FAILED,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::sys::signal::Signal;

    use super::*;
    use crate::gpu::health::Fault;
    use crate::gpu::xid::{Action, FaultKind};
    use crate::gpu::GpuInfo;

    fn addr() -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], 29500))
    }

    #[test]
    fn every_ending_has_its_documented_code() {
        let io = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let store = |e: StoreError| Err(AgentError::Store(e));
        let rdzv = |e: RdzvError| Err(AgentError::Rendezvous(e));
        let gpu = GpuInfo { index: 0, uuid: "GPU-0".into(), pci_bus_id: String::new(), name: String::new(), memory_total: 0 };
        let table: Vec<(&str, Result<Outcome, AgentError>, u8)> = vec![
            ("success", Ok(Outcome::Succeeded), 0),
            ("restarts spent", Ok(Outcome::Failed { name: "train.py".into(), failures: vec![] }), 1),
            ("SIGTERM", Ok(Outcome::Interrupted(Signal::SIGTERM)), 143),
            ("SIGINT", Ok(Outcome::Interrupted(Signal::SIGINT)), 130),
            ("drained", Ok(Outcome::Drained(Fault { gpu, kind: FaultKind::Lost, action: Action::Drain })), 75),
            ("join timeout", rdzv(RdzvError::Timeout { run_id: "j".into(), timeout: Duration::from_secs(1), joined: 1, min: 2 }), 3),
            ("store lost", rdzv(RdzvError::StoreLost), 3),
            ("unreachable", rdzv(RdzvError::Store(StoreError::Connect { addr: addr(), timeout: Duration::from_secs(1), last: "refused".into() })), 3),
            ("unreachable at set-up", store(StoreError::Connect { addr: addr(), timeout: Duration::from_secs(1), last: "refused".into() }), 3),
            ("no such host", Err(AgentError::Resolve("n1:29500".into(), io())), 3),
            ("closed", rdzv(RdzvError::Closed("j".into())), 4),
            ("failed on another node", rdzv(RdzvError::FailedElsewhere("node n1: workers failed".into())), 4),
            ("stopped on the store's host", rdzv(RdzvError::StoppedElsewhere { signal: 15, line: "x".into() }), 143),
            ("store's host ended", rdzv(RdzvError::StoreHostEnded { node: "n0".into(), addr: "n0:29500".into() }), 3),
            ("store refused", rdzv(RdzvError::StoreRefused { addr: "s:29500".into(), waited: Duration::from_secs(15) }), 3),
            ("refused at the store", rdzv(RdzvError::Store(StoreError::Refused { addr: addr() })), 3),
            ("job restart budget spent", rdzv(RdzvError::RestartBudget("the job restarted 3 times".into())), 5),
            ("a lemon kept out", rdzv(RdzvError::KeptOut("this host (n1) caused 2 incidents".into())), 75),
            ("a health check failed", Err(AgentError::Unhealthy("health check 'storage' failed".into())), 75),
            ("not a store", store(StoreError::NotAStore { addr: addr(), answer: "HTTP" }), 2),
            ("wrong token", rdzv(RdzvError::Store(StoreError::WrongToken { addr: addr() })), 2),
            ("mismatch", rdzv(RdzvError::Mismatch("--nnodes".into())), 1),
            ("port taken", store(StoreError::Bind { addr: addr(), source: io() }), 1),
            ("internal", Err(AgentError::Internal("bug".into())), 1),
        ];
        for (what, outcome, code) in table {
            assert_eq!(of_outcome(&outcome), code, "{what}");
        }
    }
}
