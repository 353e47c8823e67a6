//! The agent: one state machine, rendezvous → start → run → restart / finish.
//!
//! Every transition is an event with a timestamp and the time spent in the state it leaves (design
//! invariant 2), so a recovery can be timed phase by phase. Restart accounting follows torchrun: a failed
//! local worker group spends one restart; the count is exported as TORCHELASTIC_RESTART_COUNT.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::config::{LaunchConfig, Rendezvous};
use crate::supervisor::failure::ProcessFailure;
use crate::supervisor::logs::{LogError, RunLogs};
use crate::supervisor::reaper::{self, OrphanGuard};
use crate::supervisor::{GroupOutcome, GroupSpec, SupervisorError, WorkerGroup};
use crate::telemetry::Events;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error("cannot reserve a port for the workers' store: {0}")]
    Port(std::io::Error),
    #[error(transparent)]
    Logs(#[from] LogError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// How the agent ended.
#[derive(Debug)]
pub enum Outcome {
    Succeeded,
    /// Restarts exhausted; `name` titles the failure summary.
    Failed { name: String, failures: Vec<ProcessFailure> },
    /// Stopped because of a handled signal (workers got the same signal first).
    Interrupted(Signal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Init,
    Rendezvous,
    Starting,
    Running,
    Restarting,
    Succeeded,
    Failed,
    Interrupted,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Init => "init",
            State::Rendezvous => "rendezvous",
            State::Starting => "starting",
            State::Running => "running",
            State::Restarting => "restarting",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Interrupted => "interrupted",
        }
    }

    /// The transitions the loop may take; anything else is a bug.
    fn can_go_to(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Init, Rendezvous)
                | (Init, Interrupted)
                | (Rendezvous, Starting)
                | (Starting, Running)
                | (Starting, Failed)
                | (Running, Succeeded | Failed | Interrupted | Restarting)
                | (Restarting, Rendezvous)
                | (Restarting, Interrupted)
        )
    }
}

struct Machine {
    state: State,
    since: Instant,
    events: Events,
    run_id: String,
}

impl Machine {
    fn go(&mut self, to: State, detail: serde_json::Value) {
        debug_assert!(self.state.can_go_to(to), "{:?} -> {:?}", self.state, to);
        let spent_ms = self.since.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(from = self.state.name(), to = to.name(), spent_ms, "transition");
        let mut fields = json!({ "from": self.state.name(), "to": to.name(), "spent_ms": spent_ms, "run_id": self.run_id });
        if let (Some(f), serde_json::Value::Object(d)) = (fields.as_object_mut(), detail) {
            f.extend(d);
        }
        self.events.emit("muster.agent.transition", fields);
        self.state = to;
        self.since = Instant::now();
    }
}

/// The endpoint workers use for `init_process_group(init_method="env://")`.
struct WorkerStore {
    addr: String,
    port: u16,
    use_agent_store: bool,
    /// Held for the job's lifetime so no other process takes the port; rank 0 binds it with SO_REUSEADDR.
    _reservation: Option<OwnedFd>,
}

impl WorkerStore {
    fn open(rendezvous: &Rendezvous) -> Result<WorkerStore, AgentError> {
        Ok(match rendezvous {
            Rendezvous::Local { master_addr } => {
                let (fd, port) = reserve_port().map_err(AgentError::Port)?;
                WorkerStore { addr: master_addr.clone(), port, use_agent_store: false, _reservation: Some(fd) }
            }
            Rendezvous::Static { master_addr, master_port } => WorkerStore {
                addr: master_addr.clone(),
                port: *master_port,
                use_agent_store: false,
                _reservation: None,
            },
        })
    }
}

/// Binds a dual-stack ephemeral port with SO_REUSEADDR and does not listen on it: the worker that hosts the
/// TCPStore (rank 0, which also sets SO_REUSEADDR) can bind and listen on it, nobody else can take it.
fn reserve_port() -> std::io::Result<(OwnedFd, u16)> {
    use nix::sys::socket::{bind, getsockname, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType};
    use nix::sys::socket::{SockaddrIn, SockaddrIn6};
    let flags = SockFlag::SOCK_CLOEXEC;
    let v6 = socket(AddressFamily::Inet6, SockType::Stream, flags, None).and_then(|fd| {
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn6::from(std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, 0, 0, 0)))?;
        let port = getsockname::<SockaddrIn6>(std::os::fd::AsRawFd::as_raw_fd(&fd))?.port();
        Ok((fd, port))
    });
    match v6 {
        Ok(r) => Ok(r),
        Err(_) => {
            let fd = socket(AddressFamily::Inet, SockType::Stream, flags, None)?;
            setsockopt(&fd, sockopt::ReuseAddr, &true)?;
            bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::new(0, 0, 0, 0, 0))?;
            let port = getsockname::<SockaddrIn>(std::os::fd::AsRawFd::as_raw_fd(&fd))?.port();
            Ok((fd, port))
        }
    }
}

/// Runs the job on this node until it succeeds, fails for good, or is stopped by a signal.
pub async fn run(cfg: LaunchConfig, guard: Arc<OrphanGuard>) -> Result<Outcome, AgentError> {
    let mut signals = crate::signals::install(&cfg.signals).map_err(AgentError::Signals)?;
    reaper::spawn_adopted_reaper();
    let events = Events { console: cfg.event_log_console };
    let mut machine = Machine { state: State::Init, since: Instant::now(), events, run_id: cfg.run_id.clone() };
    let hostname = crate::host::hostname();
    let logs = RunLogs::create(&cfg.logs, &cfg.run_id)?;
    let store = WorkerStore::open(&cfg.rendezvous)?;

    tracing::info!(
        "muster {}: nnodes={}:{} nproc_per_node={} rdzv_backend={} run_id={} max_restarts={} master={}:{} \
         log_dir={} entrypoint={}",
        env!("CARGO_PKG_VERSION"),
        cfg.min_nodes,
        cfg.max_nodes,
        cfg.nproc_per_node,
        cfg.rdzv_backend,
        cfg.run_id,
        cfg.max_restarts,
        store.addr,
        store.port,
        logs.run_dir().map(|d| d.display().to_string()).unwrap_or_else(|| "/dev/null".into()),
        cfg.entrypoint.name,
    );
    if std::env::var_os("OMP_NUM_THREADS").is_none() && cfg.nproc_per_node > 1 {
        tracing::warn!(
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your \
             system being overloaded, please further tune the variable for optimal performance in your \
             application as needed."
        );
    }

    let mut restart_count = 0u32;
    loop {
        if let Ok(sig) = signals.try_recv() {
            machine.go(State::Interrupted, json!({ "signal": sig.as_str() }));
            return Ok(Outcome::Interrupted(sig));
        }
        machine.go(State::Rendezvous, json!({ "restart_count": restart_count }));
        // One node: this node is the whole group. Multi-node rendezvous replaces this step.
        let nproc = cfg.nproc_per_node;
        let spec = GroupSpec {
            role: cfg.role.clone(),
            local_world_size: nproc,
            group_rank: cfg.node_rank,
            group_world_size: 1,
            base_global_rank: 0,
            world_size: nproc,
            base_role_rank: 0,
            role_world_size: nproc,
            master_addr: store.addr.clone(),
            master_port: store.port,
            restart_count,
            max_restarts: cfg.max_restarts,
            run_id: cfg.run_id.clone(),
            use_agent_store: store.use_agent_store,
            virtual_local_rank: cfg.virtual_local_rank,
            signals_to_handle: cfg.signals_text.clone(),
        };
        machine.go(State::Starting, json!({ "group_rank": spec.group_rank, "world_size": spec.world_size }));
        let attempt = logs.attempt(restart_count, nproc)?;
        let started = WorkerGroup::start(&spec, &cfg.entrypoint, &attempt, logs.config(), &hostname, guard.clone());
        let mut group = match started {
            Ok(g) => g,
            Err(e) => {
                machine.go(State::Failed, json!({ "error": e.to_string() }));
                return Err(e.into());
            }
        };
        machine.go(State::Running, json!({ "pids": group.pids(), "log_dir": attempt.dir() }));
        match group.wait(&mut signals, cfg.shutdown_timeout).await {
            GroupOutcome::Succeeded => {
                machine.go(State::Succeeded, json!({}));
                return Ok(Outcome::Succeeded);
            }
            GroupOutcome::Interrupted(sig) => {
                machine.go(State::Interrupted, json!({ "signal": sig.as_str() }));
                return Ok(Outcome::Interrupted(sig));
            }
            GroupOutcome::Failed(failures) if restart_count < cfg.max_restarts => {
                restart_count += 1;
                let remaining = cfg.max_restarts - restart_count;
                tracing::warn!(
                    "worker group failed ({} failure(s)); restarting ({restart_count}/{} restarts used, {remaining} left)",
                    failures.len(),
                    cfg.max_restarts
                );
                machine.go(State::Restarting, json!({ "restart_count": restart_count, "remaining_restarts": remaining }));
            }
            GroupOutcome::Failed(failures) => {
                machine.go(State::Failed, json!({ "failures": failures.len() }));
                return Ok(Outcome::Failed { name: cfg.entrypoint.name.clone(), failures });
            }
        }
    }
}
