//! The agent: one state machine, rendezvous → start → run → restart / finish.
//!
//! Every transition is an event with a timestamp and the time spent in the state it leaves (design
//! invariant 2), so a recovery can be timed phase by phase. Restart accounting follows torchrun: a failed
//! local worker group spends one restart; the count is exported as TORCHELASTIC_RESTART_COUNT.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use nix::sys::signal::Signal;
use serde_json::json;

use std::collections::BTreeSet;

use crate::config::{LaunchConfig, Rendezvous};
use crate::gpu::health::{self, Fault, Watcher};
use crate::gpu::xid::Action;
use crate::gpu::GpuInfo;
use crate::rendezvous::{self as rdzv, Fingerprint, NodeInfo, Published, RdzvError, RdzvEvent, RoundInfo, Settings};
use crate::store::remote::RemoteStore;
use crate::store::tcp::{Server, ServerConfig};
use crate::store::StoreError;
use crate::supervisor::failure::ProcessFailure;
use crate::supervisor::logs::{LogError, RunLogs};
use crate::supervisor::reaper::{self, OrphanGuard};
use crate::supervisor::spare::WarmSpares;
use crate::supervisor::{GroupOutcome, GroupSpec, Placement, SupervisorError, WorkerGroup};
use crate::telemetry::Events;

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
    #[error("cannot resolve the rendezvous endpoint {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error(transparent)]
    Logs(#[from] LogError),
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// What ended a running group besides its workers and signals.
enum Change {
    Membership(Result<RdzvEvent, RdzvError>),
    Gpu(Fault),
}

async fn next_fault(watcher: &mut Option<Watcher>) -> Option<Fault> {
    match watcher {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// Counts of GPU faults by GPU and kind, carried in every fault event (metric-ready).
#[derive(Default)]
struct FaultLog {
    counts: std::collections::BTreeMap<(u32, String), u64>,
}

impl FaultLog {
    /// Counts the fault and emits its event; returns the event's fields.
    fn record(&mut self, cfg: &LaunchConfig, fault: &Fault) -> serde_json::Value {
        let count = self.counts.entry((fault.gpu.index, fault.kind.to_string())).or_insert(0);
        *count += 1;
        let detail = json!({ "gpu": fault.gpu.index, "uuid": fault.gpu.uuid, "pci_bus_id": fault.gpu.pci_bus_id,
                             "fault": fault.kind.to_string(), "xid": fault.kind.xid(), "action": fault.action.as_str(),
                             "count": *count });
        cfg.events().emit("muster.gpu.fault", detail.clone());
        detail
    }
}

/// This node's GPUs, when NVML is there.
struct Gpus {
    nvml: &'static nvml_wrapper::Nvml,
    all: Vec<GpuInfo>,
}

impl Gpus {
    fn open(cfg: &LaunchConfig) -> Option<Gpus> {
        let nvml = match crate::gpu::nvml() {
            Ok(nvml) => nvml,
            Err(e) => {
                tracing::info!("GPU health is off: {e}");
                return None;
            }
        };
        match crate::gpu::inventory(nvml) {
            Ok(all) if !all.is_empty() => {
                tracing::info!(
                    "watching {} GPU(s) ({}); fault policy: {}",
                    all.len(),
                    all.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(", "),
                    cfg.gpu_policy.describe()
                );
                Some(Gpus { nvml, all })
            }
            Ok(_) => {
                tracing::info!("GPU health is off: NVML reports no GPU");
                None
            }
            Err(e) => {
                tracing::warn!("GPU health is off: cannot read the GPU inventory: {e}");
                None
            }
        }
    }
}

/// The exit code of a node drained for a GPU fault ("this node is unhealthy"), for scheduler policies to match
/// (a Volcano `exitCode` policy, a Kubernetes pod failure policy). 75 is sysexits' EX_TEMPFAIL: retry elsewhere.
pub const EXIT_NODE_UNHEALTHY: u8 = 75;

/// How long the `--on-node-fault` hook may run.
const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs the user's `--on-node-fault` command with the fault in its environment (bounded, never fatal).
async fn run_node_fault_hook(cfg: &LaunchConfig, fault: &Fault) {
    let Some(cmd) = &cfg.on_node_fault else { return };
    let mut hook = tokio::process::Command::new("sh");
    hook.arg("-c")
        .arg(cmd)
        .env("MUSTER_FAULT_KIND", fault.kind.to_string())
        .env("MUSTER_FAULT_XID", fault.kind.xid().map(|x| x.to_string()).unwrap_or_default())
        .env("MUSTER_FAULT_ACTION", fault.action.as_str())
        .env("MUSTER_FAULT_GPU_INDEX", fault.gpu.index.to_string())
        .env("MUSTER_FAULT_GPU_UUID", &fault.gpu.uuid)
        .env("MUSTER_FAULT_GPU_PCI_BUS_ID", &fault.gpu.pci_bus_id)
        .env("MUSTER_FAULT_HOSTNAME", crate::host::hostname())
        .env("MUSTER_RUN_ID", &cfg.run_id)
        .kill_on_drop(true);
    match tokio::time::timeout(HOOK_TIMEOUT, hook.status()).await {
        Ok(Ok(status)) if status.success() => tracing::info!("--on-node-fault hook ran"),
        Ok(Ok(status)) => tracing::warn!("--on-node-fault hook failed: {status}"),
        Ok(Err(e)) => tracing::warn!("cannot run the --on-node-fault hook: {e}"),
        Err(_) => tracing::warn!("--on-node-fault hook did not finish within {HOOK_TIMEOUT:?}; killed"),
    }
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
    Drained,
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
            State::Drained => "drained",
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
                | (Rendezvous, Interrupted | Failed | Restarting)
                | (Starting, Running)
                | (Starting, Failed)
                | (Running, Succeeded | Failed | Interrupted | Restarting | Drained)
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

/// The rendezvous store: hosted by this agent when it is the store's host, reached over TCP in any case.
async fn open_rendezvous_store(cfg: &LaunchConfig) -> Result<(Option<Server>, RemoteStore), AgentError> {
    let join_timeout = cfg.conf_duration("join_timeout", 600.0);
    let read_timeout = cfg.conf_duration("read_timeout", 60.0);
    let server_config = ServerConfig {
        keepalive: Some(cfg.conf_duration("keep_alive_interval", 5.0)),
        ..ServerConfig::default()
    };
    let any = |port: u16| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    let (host, port, hosted) = match &cfg.rendezvous {
        Rendezvous::C10d { host, port, is_host } => {
            let hosting = match is_host {
                Some(h) => *h,
                None => is_this_machine(host, &cfg.local_addr).await,
            };
            let hosted = if hosting {
                match Server::bind(any(*port), server_config.clone()).await {
                    Ok(server) => Some(server),
                    // torch's heuristic: several agents on one machine, the first one hosts.
                    Err(e) if is_host.is_none() => {
                        tracing::debug!("not hosting the rendezvous store ({e}); connecting as a client");
                        None
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                None
            };
            (host.clone(), *port, hosted)
        }
        Rendezvous::Static { master_addr, master_port } => {
            let hosted = match cfg.node_rank {
                0 => Some(Server::bind(any(*master_port), server_config).await?),
                _ => None,
            };
            (master_addr.clone(), *master_port, hosted)
        }
    };
    let addr = match &hosted {
        Some(server) => SocketAddr::from(([127, 0, 0, 1], server.port())),
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| AgentError::Resolve(format!("{host}:{port}"), e))?
            .next()
            .ok_or_else(|| AgentError::Resolve(format!("{host}:{port}"), std::io::ErrorKind::NotFound.into()))?,
    };
    let store = RemoteStore::connect(addr, join_timeout, read_timeout).await?;
    Ok((hosted, store))
}

/// torch's `_matches_machine_hostname`: the endpoint names this machine — a loopback address, this host's
/// name or `--local-addr`, or a name or address that resolves to an address this machine can bind.
async fn is_this_machine(host: &str, local_addr: &str) -> bool {
    if host == "localhost" || host == crate::host::hostname() || host == local_addr {
        return true;
    }
    let Ok(addrs) = tokio::net::lookup_host((host, 0)).await else { return false };
    addrs.into_iter().any(|a| a.ip().is_loopback() || std::net::TcpListener::bind((a.ip(), 0)).is_ok())
}

/// The store the workers use through MASTER_ADDR:MASTER_PORT, served by the group-rank-0 agent.
struct WorkerStore {
    /// c10d: bound on first use; static: the rendezvous store itself.
    server: Option<Server>,
    shared_with_rendezvous: bool,
    addr: String,
}

impl WorkerStore {
    /// The endpoint for this round, emptied of what earlier attempts left (pytorch issue #135712).
    async fn prepare(&mut self, hosted: Option<&Server>) -> Result<(String, u16), AgentError> {
        let server = match (self.shared_with_rendezvous, hosted) {
            (true, Some(server)) => server,
            (true, None) => return Err(RdzvError::State("static node rank 0 does not host the store".into()).into()),
            (false, _) => {
                if self.server.is_none() {
                    let any = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
                    self.server = Some(Server::bind(any, ServerConfig::default()).await?);
                }
                self.server.as_ref().ok_or_else(|| RdzvError::State("worker store missing".into()))?
            }
        };
        if self.shared_with_rendezvous {
            server.clear_except("muster/").await;
        } else {
            server.clear().await;
        }
        Ok((self.addr.clone(), server.port()))
    }
}

/// Marks the rendezvous closed (on success or final failure, never on a signal), within `close_timeout`.
async fn close<S: crate::store::Store>(rendezvous: &rdzv::Rendezvous<S>, timeout: std::time::Duration) {
    match tokio::time::timeout(timeout, rendezvous.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("cannot close the rendezvous: {e}"),
        Err(_) => tracing::warn!("cannot close the rendezvous within close_timeout ({timeout:?})"),
    }
}

/// Runs the job on this node until it succeeds, fails for good, or is stopped by a signal.
pub async fn run(cfg: LaunchConfig, guard: Arc<OrphanGuard>) -> Result<Outcome, AgentError> {
    let mut signals = crate::signals::install(&cfg.signals).map_err(AgentError::Signals)?;
    reaper::spawn_adopted_reaper();
    let events = cfg.events();
    let mut machine = Machine { state: State::Init, since: Instant::now(), events, run_id: cfg.run_id.clone() };
    let hostname = crate::host::hostname();
    let logs = RunLogs::create(&cfg.logs, &cfg.run_id)?;

    let (hosted, store) = tokio::select! {
        r = open_rendezvous_store(&cfg) => r?,
        Some(sig) = signals.recv() => return Ok(Outcome::Interrupted(sig)),
    };
    let static_rdzv = matches!(cfg.rendezvous, Rendezvous::Static { .. });
    let settings = Settings {
        run_id: cfg.run_id.clone(),
        min_nodes: cfg.min_nodes,
        max_nodes: cfg.max_nodes,
        join_timeout: cfg.conf_duration("join_timeout", 600.0),
        last_call_timeout: cfg.conf_duration("last_call_timeout", 30.0),
        exit_barrier_timeout: cfg.conf_duration("exit_barrier_timeout", 300.0),
        keep_alive_interval: cfg.conf_duration("keep_alive_interval", 5.0),
        keep_alive_max_attempt: cfg.rdzv_conf.get("keep_alive_max_attempt").and_then(|v| v.parse().ok()).unwrap_or(3),
        heartbeat_timeout: cfg.conf_duration("heartbeat_timeout", 5.0),
        node_rank: (static_rdzv || cfg.node_rank != 0).then_some(cfg.node_rank),
        strict_rank: static_rdzv,
    };
    let me = NodeInfo {
        id: format!("{}_{}_0", cfg.local_addr, std::process::id()),
        addr: cfg.local_addr.clone(),
        nproc: cfg.nproc_per_node,
    };
    let fingerprint = Fingerprint {
        entrypoint: cfg.entrypoint.name.clone(),
        args: cfg.entrypoint.script_args.clone(),
        nproc_spec: cfg.nproc_spec.clone(),
    };
    let mut rendezvous = rdzv::Rendezvous::new(store, settings, me, fingerprint);
    rendezvous.register().await?;
    let mut worker_store = WorkerStore {
        server: None,
        shared_with_rendezvous: static_rdzv,
        addr: match &cfg.rendezvous {
            Rendezvous::Static { master_addr, .. } => master_addr.clone(),
            Rendezvous::C10d { .. } => cfg.local_addr.clone(),
        },
    };

    tracing::info!(
        "muster {}: nnodes={}:{} nproc_per_node={} rdzv_backend={} rdzv_store={}{} run_id={} max_restarts={} \
         log_dir={} entrypoint={}",
        env!("CARGO_PKG_VERSION"),
        cfg.min_nodes,
        cfg.max_nodes,
        cfg.nproc_per_node,
        cfg.rdzv_backend,
        rendezvous.store().addr(),
        if hosted.is_some() { " (hosted here)" } else { "" },
        cfg.run_id,
        cfg.max_restarts,
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

    let gpus = Gpus::open(&cfg);
    let mut watcher = gpus.as_ref().map(|g| Watcher::start(g.nvml, &g.all, &cfg.gpu_policy));
    let mut excluded: BTreeSet<u32> = BTreeSet::new();
    let mut fault_log = FaultLog::default();

    let mut spares = WarmSpares::new(cfg.warm_spares.clone(), guard.clone());
    let mut restart_count = 0u32;
    loop {
        if let Ok(sig) = signals.try_recv() {
            machine.go(State::Interrupted, json!({ "signal": sig.as_str() }));
            return Ok(Outcome::Interrupted(sig));
        }
        let nproc = cfg.nproc_per_node.saturating_sub(excluded.len() as u32);
        rendezvous.set_nproc(nproc);
        machine.go(State::Rendezvous, json!({ "restart_count": restart_count, "nproc": nproc }));
        let round: RoundInfo = tokio::select! {
            r = rendezvous.next_round() => match r {
                Ok(round) => round,
                Err(e) => {
                    machine.go(State::Failed, json!({ "error": e.to_string() }));
                    return Err(e.into());
                }
            },
            Some(sig) = signals.recv() => {
                machine.go(State::Interrupted, json!({ "signal": sig.as_str() }));
                return Ok(Outcome::Interrupted(sig));
            }
        };
        let (master_addr, master_port) = if round.group_rank == 0 {
            let (addr, port) = worker_store.prepare(hosted.as_ref()).await?;
            rendezvous.publish("master", format!("{port} {addr}").as_bytes()).await?;
            (addr, port)
        } else {
            let v = match rendezvous.wait_published("master", cfg.conf_duration("read_timeout", 60.0)).await? {
                Published::Value(v) => v,
                Published::Changed(RdzvEvent::Closed) => {
                    machine.go(State::Failed, json!({ "reason": "closed by another node" }));
                    return Err(RdzvError::Closed(cfg.run_id.clone()).into());
                }
                // Group rank 0 was lost (or the round changed) before it published the workers' store.
                Published::Changed(event) => {
                    tracing::info!(?event, "membership changed before the group started; re-forming (no restart spent)");
                    if event != RdzvEvent::RoundChanged {
                        rendezvous.open_next_round().await?;
                    }
                    machine.go(State::Restarting, json!({ "reason": format!("{event:?}"), "restart_count": restart_count }));
                    continue;
                }
            };
            let v = String::from_utf8_lossy(&v).into_owned();
            let (port, addr) = v.split_once(' ').unwrap_or(("0", ""));
            (addr.to_string(), port.parse().map_err(|_| RdzvError::State(format!("bad master endpoint '{v}'")))?)
        };
        let plan = cfg.placement(nproc, &excluded).map_err(|e| AgentError::Gpu(e.to_string()))?;
        let (extra_env, placements) = match &plan {
            Some(plan) => {
                let env = vec![
                    ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
                    ("CUDA_VISIBLE_DEVICES".to_string(), plan.visible_devices.clone()),
                ];
                let node_mode = cfg.numa_binding.as_deref() == Some("node");
                let placements = plan
                    .ranks
                    .iter()
                    .map(|r| Placement {
                        cpus: r.cpus.clone(),
                        mem_node: if node_mode { Some(r.numa_node.unwrap_or(0)) } else { None },
                        visible_devices: r.visible_devices.clone(),
                    })
                    .collect();
                (env, placements)
            }
            None => (Vec::new(), Vec::new()),
        };
        if let (Some(g), Some(plan)) = (&gpus, &plan) {
            let in_use: Vec<GpuInfo> =
                plan.ranks.iter().filter_map(|r| g.all.iter().find(|gpu| gpu.index == r.gpu_index).cloned()).collect();
            if let Err(e) = health::check_before_spawn(g.nvml, &in_use, cfg.gpu_wait_timeout).await.map_err(|e| e.to_string()) {
                machine.go(State::Failed, json!({ "error": e }));
                return Err(AgentError::Gpu(e));
            }
        }
        let spec = GroupSpec {
            role: cfg.role.clone(),
            local_world_size: nproc,
            group_rank: round.group_rank,
            group_world_size: round.group_world_size,
            base_global_rank: round.base_global_rank,
            world_size: round.world_size,
            base_role_rank: round.base_global_rank,
            role_world_size: round.world_size,
            master_addr,
            master_port,
            restart_count,
            max_restarts: cfg.max_restarts,
            run_id: cfg.run_id.clone(),
            use_agent_store: true,
            virtual_local_rank: cfg.virtual_local_rank,
            signals_to_handle: cfg.signals_text.clone(),
            extra_env,
            placements,
        };
        machine.go(
            State::Starting,
            json!({ "round": round.round, "group_rank": spec.group_rank, "group_world_size": spec.group_world_size,
                    "world_size": spec.world_size }),
        );
        let attempt = logs.attempt(restart_count, nproc)?;
        let started =
            WorkerGroup::start(&spec, &cfg.entrypoint, &attempt, logs.config(), &hostname, guard.clone(), &mut spares);
        let mut group = match started {
            Ok(g) => g,
            Err(e) => {
                machine.go(State::Failed, json!({ "error": e.to_string() }));
                return Err(e.into());
            }
        };
        machine.go(State::Running, json!({ "pids": group.pids(), "log_dir": attempt.dir() }));
        let change = async {
            loop {
                tokio::select! {
                    e = rendezvous.next_event() => return Change::Membership(e),
                    Some(fault) = next_fault(&mut watcher) => {
                        if fault.action != Action::Ignore {
                            return Change::Gpu(fault);
                        }
                        fault_log.record(&cfg, &fault);
                    }
                }
            }
        };
        // A single node with no restarts left never starts its group again; peers can always change.
        spares.set_next_start_possible(restart_count < cfg.max_restarts || cfg.max_nodes > 1);
        let outcome = group.wait(&mut signals, change, cfg.shutdown_timeout, &mut spares).await;
        match outcome {
            GroupOutcome::Succeeded => {
                spares.clear();
                if let Err(e) = rendezvous.exit_barrier().await {
                    tracing::warn!("{e}");
                }
                close(&rendezvous, cfg.conf_duration("close_timeout", 30.0)).await;
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
                rendezvous.open_next_round().await?;
                machine.go(
                    State::Restarting,
                    json!({ "reason": "worker failure", "restart_count": restart_count, "remaining_restarts": remaining }),
                );
            }
            GroupOutcome::Failed(failures) => {
                close(&rendezvous, cfg.conf_duration("close_timeout", 30.0)).await;
                machine.go(State::Failed, json!({ "failures": failures.len() }));
                return Ok(Outcome::Failed { name: cfg.entrypoint.name.clone(), failures });
            }
            GroupOutcome::Changed(Change::Membership(Ok(RdzvEvent::Closed))) => {
                machine.go(State::Failed, json!({ "reason": "closed by another node" }));
                return Err(RdzvError::Closed(cfg.run_id.clone()).into());
            }
            GroupOutcome::Changed(Change::Membership(Ok(event))) => {
                tracing::info!(?event, "membership changed; re-forming the group (no restart spent)");
                // Whoever saw the change opens the next round; the others only follow it.
                if event != RdzvEvent::RoundChanged {
                    rendezvous.open_next_round().await?;
                }
                machine.go(State::Restarting, json!({ "reason": format!("{event:?}"), "restart_count": restart_count }));
            }
            GroupOutcome::Changed(Change::Membership(Err(e))) => {
                machine.go(State::Failed, json!({ "error": e.to_string() }));
                return Err(e.into());
            }
            GroupOutcome::Changed(Change::Gpu(fault)) => {
                let detail = fault_log.record(&cfg, &fault);
                let usable = gpus.as_ref().map(|g| g.all.len()).unwrap_or(0) - excluded.len();
                match fault.action {
                    Action::Restart if restart_count < cfg.max_restarts => {
                        restart_count += 1;
                        rendezvous.open_next_round().await?;
                        machine.go(State::Restarting, json!({ "reason": "gpu fault", "restart_count": restart_count }));
                    }
                    Action::Restart => {
                        close(&rendezvous, cfg.conf_duration("close_timeout", 30.0)).await;
                        machine.go(State::Failed, detail);
                        return Err(AgentError::Gpu(format!(
                            "{} on GPU {} ({}) and no restarts left (--max-restarts {})",
                            fault.kind, fault.gpu.index, fault.gpu.uuid, cfg.max_restarts
                        )));
                    }
                    Action::Exclude if usable > 1 && nproc > 1 => {
                        excluded.insert(fault.gpu.index);
                        tracing::warn!(
                            "excluding GPU {} ({}); continuing with {} worker(s) on this node",
                            fault.gpu.index,
                            fault.gpu.uuid,
                            nproc - 1
                        );
                        rendezvous.open_next_round().await?;
                        machine.go(State::Restarting, json!({ "reason": "gpu excluded", "gpu": fault.gpu.index }));
                    }
                    // Drain, or nothing left to exclude.
                    _ => {
                        if let Err(e) = rendezvous.leave().await {
                            tracing::warn!("cannot leave the rendezvous: {e}");
                        }
                        run_node_fault_hook(&cfg, &fault).await;
                        machine.go(State::Drained, detail);
                        return Ok(Outcome::Drained(fault));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_this_machine;

    #[tokio::test]
    async fn endpoint_hosts_of_this_machine() {
        assert!(is_this_machine("127.0.0.1", "node9").await);
        assert!(is_this_machine("localhost", "node9").await);
        assert!(is_this_machine("node9", "node9").await);
        assert!(is_this_machine(&crate::host::hostname(), "node9").await);
        // TEST-NET-1 (RFC 5737): never an address of this machine.
        assert!(!is_this_machine("192.0.2.1", "node9").await);
    }
}
