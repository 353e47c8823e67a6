//! The driver: sets the agent up, runs the current phase's operation, and feeds everything that happens
//! (the operation's completion, signals, GPU faults) into `step::step`. Effects live here; decisions don't.
//!
//! An operation keeps running while `step` leaves its [`Op`] unchanged (a fault absorbed while joining does
//! not make the node join twice); otherwise it is dropped and the next one starts. Dropping is safe: the store
//! client is cancel-safe, and the phases whose work must not be cut (spawning) have no await point inside.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::gpu::FaultLog;
use super::state::{Cause, Effect, End, Grace, Input, Job, Op, Phase, State};
use super::stores::{open_rendezvous_store, WorkerStore};
use super::AgentError;
use crate::config::{LaunchConfig, Rendezvous as RdzvMode};
use crate::gpu::health::{Fault, Watcher};
use crate::observe::record::PhaseKind;
use crate::observe::{Observer, Sinks, Transition};
use crate::rendezvous::{Fingerprint, NodeInfo, Published, RdzvError, RdzvEvent, Rendezvous, RoundInfo, Settings};
use crate::signals::Delivery;
use crate::store::RdzvStore;
use crate::store::tcp::Server;
use crate::supervisor::logs::RunLogs;
use crate::supervisor::guard::OrphanGuard;
use crate::supervisor::reaper;
use crate::supervisor::spare::WarmSpares;
use crate::supervisor::{Watch, WorkerGroup};

/// How long a restart after a worker failure on a GPU node waits for the GPU fault that may follow the
/// death (the driver reports an XID tens of milliseconds after the process it killed is gone).
const FAULT_SETTLE: Duration = Duration::from_millis(250);

/// How long a worker's death by a stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) waits for the agent's own
/// signal before it counts as a failure: `scancel` and container runtimes signal every process at once,
/// and the workers may die before the agent handles its copy.
const SIGNAL_HOLD: Duration = Duration::from_secs(1);

/// How long the `--on-node-fault` hook may run.
const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Transition events: each with the time spent in the state it leaves. Its observer turns them, with the
/// inputs and faults, into the event log, the metrics and `/healthz` (see `observe`).
pub struct Transitions {
    observer: Observer,
    from: PhaseKind,
    since: Instant,
}

impl Transitions {
    pub fn new(cfg: &LaunchConfig, sinks: &Sinks) -> Transitions {
        Transitions { observer: Observer::new(sinks, &cfg.run_id), from: PhaseKind::Init, since: Instant::now() }
    }

    /// Into `to`; `state` is None when set-up failed, `input_at` when the input that caused it arrived.
    pub fn go(&mut self, state: Option<&State>, to: PhaseKind, detail: Value, input_at: Option<Instant>) {
        let now = Instant::now();
        let t = Transition { from: self.from, to, spent: now.saturating_duration_since(self.since), now, input_at };
        self.observer.transition(t, state.map(State::record).as_ref(), detail);
        self.from = to;
        self.since = now;
    }

    /// The round just joined (before the transition it causes).
    fn joined(&mut self, round: &RoundInfo) {
        self.observer.joined(round, self.since.elapsed());
    }
}

/// What a transition's event says about the state it enters.
pub fn detail(state: &State) -> Value {
    match &state.phase {
        Phase::Joining => json!({ "restart_count": state.restart_count, "nproc": state.nproc() }),
        Phase::Stopping(Cause::Membership(RdzvEvent::PeerLost(peer))) => json!({ "reason": "membership change", "peer": peer }),
        Phase::Stopping(Cause::Membership(RdzvEvent::Fenced { silent })) => {
            json!({ "reason": "fenced", "silent_ms": silent.as_millis() as u64 })
        }
        Phase::Stopping(cause) => json!({ "reason": cause.name() }),
        Phase::Reforming { .. } => {
            json!({ "restart_count": state.restart_count, "remaining_restarts": state.restarts_left() })
        }
        Phase::Draining(f) => fault_detail(f),
        Phase::Done(end) => end_detail(end),
        _ => json!({}),
    }
}

fn fault_detail(f: &Fault) -> Value {
    json!({ "gpu": f.gpu.index, "fault": f.kind.to_string(), "action": f.action.as_str() })
}

/// What the final transition's event says.
pub fn end_detail(end: &End) -> Value {
    match end {
        End::Drained(f) => fault_detail(f),
        End::Error(e) => json!({ "error": e.to_string() }),
        End::Failed(failures) => json!({ "failures": failures.len() }),
        End::Interrupted(sig) => json!({ "signal": sig.as_str() }),
        End::Succeeded => json!({}),
    }
}

/// The inputs that can come in every phase: handled signals and GPU faults.
struct Ambient {
    signals: mpsc::UnboundedReceiver<Delivery>,
    watcher: Option<Watcher>,
}

impl Ambient {
    /// The next signal or fault (cancel-safe: both are channel receives).
    async fn next(&mut self) -> Input {
        let fault = async {
            match &mut self.watcher {
                Some(w) => w.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(delivery) = self.signals.recv() => match delivery {
                Delivery::Stop(sig) => Input::Signal(sig),
                Delivery::Notice(sig) => Input::Notice(sig),
            },
            Some(fault) = fault => Input::Fault(fault),
            // Both sources gone (every watcher thread ended, signal intake closed): nothing more will come.
            else => std::future::pending().await,
        }
    }
}

/// This node's GPUs, when NVML is there.
pub(super) struct Gpus {
    pub(super) nvml: &'static nvml_wrapper::Nvml,
    pub(super) all: Vec<crate::gpu::GpuInfo>,
}

impl Gpus {
    /// Opens NVML and reads the inventory (blocking: call off the async threads).
    fn open(policy: &str) -> Option<Gpus> {
        let nvml = match crate::gpu::nvml() {
            Ok(nvml) => nvml,
            Err(e) => {
                tracing::info!("GPU health is off: {e}");
                return None;
            }
        };
        match crate::gpu::inventory(nvml) {
            Ok(all) if !all.is_empty() => {
                let uuids: Vec<&str> = all.iter().map(|g| g.uuid.as_str()).collect();
                tracing::info!("watching {} GPU(s) ({}); fault policy: {policy}", all.len(), uuids.join(", "));
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

/// What the operations work on.
pub(super) struct Work {
    pub(super) cfg: Arc<LaunchConfig>,
    pub(super) guard: Arc<OrphanGuard>,
    pub(super) hostname: String,
    pub(super) logs: RunLogs,
    pub(super) hosted: Option<Server>,
    pub(super) rendezvous: Rendezvous<RdzvStore>,
    pub(super) worker_store: WorkerStore,
    pub(super) spares: WarmSpares,
    pub(super) gpus: Option<Gpus>,
    /// The first placement put workers on GPUs: from then on a placement error is a GPU error.
    pub(super) gpu_job: bool,
    pub(super) group: Option<WorkerGroup>,
    /// The round joined and its workers' store endpoint.
    pub(super) round: Option<(RoundInfo, String, u16)>,
    /// Hang detection (`--hang-timeout`), watching the running group.
    pub(super) hang: Option<crate::hang::Monitor>,
    /// The running workers, for `GET /stacks`.
    pub(super) stacks: Arc<crate::hang::Registry>,
    /// The running group's attempt directory.
    pub(super) attempt_dir: Option<std::path::PathBuf>,
}

pub struct Agent {
    work: Work,
    ambient: Ambient,
    state: State,
    faults: FaultLog,
    transitions: Transitions,
}

/// The next stop signal during set-up; a notice now has no worker to go to.
async fn next_stop(signals: &mut mpsc::UnboundedReceiver<Delivery>) -> Option<Signal> {
    while let Some(delivery) = signals.recv().await {
        match delivery {
            Delivery::Stop(sig) => return Some(sig),
            Delivery::Notice(sig) => tracing::info!("received {} before the workers started; nothing to forward", sig.as_str()),
        }
    }
    None
}

fn fail(e: impl Into<AgentError>) -> End {
    End::Error(e.into())
}

impl Agent {
    /// Opens the stores, registers with the rendezvous and starts the GPU watcher. A signal meanwhile ends
    /// it (`End::Interrupted`), as does any error.
    pub async fn set_up(
        cfg: Arc<LaunchConfig>,
        guard: Arc<OrphanGuard>,
        gpu_job: bool,
        sinks: &Sinks,
    ) -> Result<Agent, End> {
        let mut signals = crate::signals::install(&cfg.signals).map_err(|e| fail(AgentError::Signals(e)))?;
        reaper::spawn_adopted_reaper(guard.clone());
        // A launch's first spawn follows within milliseconds: start paying the cgroup's first-move cost now.
        guard.prime_cgroup();
        let logs = RunLogs::create(&cfg.logs, &cfg.run_id).map_err(fail)?;
        let (hosted, store) = tokio::select! {
            r = open_rendezvous_store(&cfg) => r.map_err(fail)?,
            Some(sig) = next_stop(&mut signals) => return Err(End::Interrupted(sig)),
        };
        let mut rendezvous = Rendezvous::new(store, settings(&cfg), me(&cfg), fingerprint(&cfg));
        tokio::select! {
            r = rendezvous.register() => r.map_err(fail)?,
            Some(sig) = next_stop(&mut signals) => return Err(End::Interrupted(sig)),
        }
        super::banner::banner(&cfg, &rendezvous, hosted.is_some(), &logs);
        if cfg.max_nodes > 1 {
            super::stores::warn_if_loopback(&cfg).await;
        }
        let policy = cfg.gpu_policy.describe();
        let gpus = tokio::task::spawn_blocking(move || Gpus::open(&policy))
            .await
            .map_err(|e| fail(AgentError::Internal(format!("GPU inventory task: {e}"))))?;
        let watcher = gpus.as_ref().map(|g| Watcher::start(g.nvml, &g.all, &cfg.gpu_policy));
        let gpu_job = gpu_job && gpus.is_some();
        let job = Job {
            run_id: cfg.run_id.clone(),
            nproc_per_node: cfg.nproc_per_node,
            max_restarts: cfg.max_restarts,
            on_hang: cfg.hang.as_ref().map(|h| h.on_hang).unwrap_or(crate::config::OnHang::Restart),
            multi_node: cfg.max_nodes > 1,
            gpus: gpus.as_ref().map(|g| g.all.iter().map(|gpu| gpu.index).collect()).unwrap_or_default(),
        };
        let worker_store = WorkerStore {
            server: None,
            shared_with_rendezvous: matches!(cfg.rendezvous, RdzvMode::Static { .. }),
            addr: match &cfg.rendezvous {
                RdzvMode::Static { master_addr, .. } => master_addr.clone(),
                RdzvMode::C10d { .. } | RdzvMode::Etcd(_) => cfg.local_addr.clone(),
            },
        };
        let work = Work {
            spares: WarmSpares::new(cfg.warm_spares.clone(), guard.clone()),
            hostname: crate::host::hostname(),
            cfg: cfg.clone(),
            guard,
            logs,
            hosted,
            rendezvous,
            worker_store,
            gpus,
            gpu_job,
            group: None,
            round: None,
            hang: cfg.hang.clone().map(crate::hang::Monitor::new),
            stacks: sinks.stacks.clone(),
            attempt_dir: None,
        };
        Ok(Agent {
            work,
            ambient: Ambient { signals, watcher },
            state: State::new(job),
            faults: FaultLog::default(),
            transitions: Transitions::new(&cfg, sinks),
        })
    }

    /// Runs phases until the agent is done; emits every transition, the final one exactly once.
    pub async fn drive(mut self) -> End {
        let Agent { work, ambient, state, faults, transitions } = &mut self;
        transitions.go(Some(state), state.phase.kind(), detail(state), None);
        while !state.is_done() {
            let op = state.op();
            if matches!(op, Op::Start { .. }) {
                work.spares.set_next_start_possible(state.another_start_possible());
            }
            let (completion, forward) = {
                let run = work.operate(op.clone(), state.restart_count, state.nproc());
                tokio::pin!(run);
                loop {
                    let input = tokio::select! {
                        biased;
                        input = ambient.next() => input,
                        input = &mut run => break (Some(input), None),
                    };
                    let forward = apply(state, input, faults, transitions);
                    // A forward needs the group the operation holds: the watch is cancel-safe, so it is
                    // dropped, the signal sent, and the same operation started again.
                    if state.op() != op || forward.is_some() {
                        break (None, forward);
                    }
                }
            };
            if let (Some(sig), Some(group)) = (forward, work.group.as_ref()) {
                group.notify(sig);
            }
            // The operation is over (dropped or done), so its round can be read.
            if let Some(input) = completion {
                if let (Input::Joined { .. }, Some((round, _, _))) = (&input, &work.round) {
                    transitions.joined(round);
                }
                if let (Some(sig), Some(group)) = (apply(state, input, faults, transitions), work.group.as_ref()) {
                    group.notify(sig);
                }
            }
        }
        match std::mem::replace(&mut state.phase, Phase::Done(End::Succeeded)) {
            Phase::Done(end) => end,
            _ => End::Error(AgentError::Internal("the driver stopped before the end".into())),
        }
    }
}

/// One step: the decision, its effects, and the transition event when the phase changed. Returns the
/// notice signal to forward to the workers, if any (the caller holds the group).
fn apply(state: &mut State, input: Input, faults: &mut FaultLog, transitions: &mut Transitions) -> Option<Signal> {
    let before = state.phase_name();
    tracing::trace!(input = input.name(), phase = before, "input");
    if let (Input::Signal(sig), Phase::Running | Phase::Stopping(_)) = (&input, &state.phase) {
        tracing::warn!("received {} death signal, shutting down workers", sig.as_str());
    }
    let seen = transitions.observer.before(input.record(state), &state.record());
    let mut forward = None;
    for effect in super::step::step(state, input) {
        match effect {
            Effect::Fault(fault, verdict) => {
                let count = faults.record(&fault, verdict);
                transitions.observer.fault(&fault, verdict.as_str(), count);
            }
            Effect::Forward(sig) => forward = Some(sig),
        }
    }
    transitions.observer.after(&seen, &state.record());
    let after = state.phase_name();
    if after != before || state.is_done() {
        transitions.go(Some(state), state.phase.kind(), detail(state), Some(seen.at()));
    }
    forward
}

impl Work {
    async fn operate(&mut self, op: Op, restart_count: u32, nproc: u32) -> Input {
        match op {
            Op::Join => self.join(nproc, restart_count).await,
            Op::Start { nproc, excluded, settle } => {
                if settle {
                    tokio::time::sleep(FAULT_SETTLE).await;
                }
                self.start(nproc, excluded, restart_count).await
            }
            Op::Watch => self.watch().await,
            Op::Stop(sig, grace) => self.stop(sig, grace).await,
            Op::Reform { open } => self.reform(open).await,
            Op::Drain(fault) => self.drain(&fault).await,
            Op::Finish { barrier } => self.finish(barrier).await,
            Op::None => std::future::pending().await,
        }
    }

    /// Joins the next round and learns the workers' store: group rank 0 prepares and publishes it, the
    /// others wait for it (or for a membership change that means it will never come).
    async fn join(&mut self, nproc: u32, restart_count: u32) -> Input {
        self.rendezvous.set_nproc(nproc);
        self.rendezvous.set_restarts(restart_count);
        let round = match self.rendezvous.next_round().await {
            Ok(round) => round,
            Err(e) => return Input::Failed(e.into()),
        };
        let endpoint = if round.group_rank == 0 {
            match self.worker_store.prepare(&self.cfg, self.hosted.as_ref(), round.group_world_size).await {
                Ok((addr, port)) => match self.rendezvous.publish("master", format!("{port} {addr}").as_bytes()).await {
                    Ok(()) => (addr, port),
                    Err(e) => return Input::Failed(e.into()),
                },
                Err(e) => return Input::Failed(e),
            }
        } else {
            match self.rendezvous.wait_published("master", self.cfg.rdzv.read_timeout).await {
                Ok(Published::Value(v)) => match parse_master(&v) {
                    Ok(endpoint) => endpoint,
                    Err(e) => return Input::Failed(e.into()),
                },
                Ok(Published::Changed(event)) => {
                    tracing::info!(?event, "membership changed before the group started; re-forming (no restart spent)");
                    return Input::JoinChanged(event);
                }
                Err(e) => return Input::Failed(e.into()),
            }
        };
        self.round = Some((round, endpoint.0, endpoint.1));
        Input::Joined { nproc }
    }

    async fn watch(&mut self) -> Input {
        let Some(group) = self.group.as_mut() else {
            return Input::Failed(AgentError::Internal("no worker group to watch".into()));
        };
        let board = self.rendezvous.hang_board();
        let note = self.rendezvous.beat_note();
        let hang = async {
            match self.hang.as_mut() {
                Some(monitor) => monitor.next(board.as_ref(), &note).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            outcome = group.watch(&mut self.spares) => match outcome {
                Watch::Succeeded => Input::Succeeded,
                Watch::Failed(failure) => {
                    if failure.stop_signal() {
                        // Dropped here when the agent's own signal comes first (see `SIGNAL_HOLD`).
                        tokio::time::sleep(SIGNAL_HOLD).await;
                    }
                    let survivors = self.cfg.stacks_on_failure.then(|| group.targets());
                    let (change, ()) = tokio::join!(
                        self.rendezvous.change_behind_failure(),
                        crate::hang::capture_survivors(survivors, self.attempt_dir.as_deref()),
                    );
                    Input::WorkerFailed { failure, change }
                }
            },
            event = self.rendezvous.next_event() => match event {
                Ok(event) => {
                    tracing::info!(?event, "membership changed; re-forming the group (no restart spent)");
                    Input::Membership(event)
                }
                Err(e) => Input::Failed(e.into()),
            },
            found = hang => Input::Hung(Box::new(found)),
        }
    }

    async fn stop(&mut self, sig: Signal, grace: Grace) -> Input {
        let membership = self.cfg.rdzv.membership_grace;
        let grace = match grace {
            Grace::Shutdown => self.cfg.shutdown_timeout,
            Grace::Membership => membership.min(self.cfg.shutdown_timeout),
            Grace::Fenced => self.rendezvous.timing().fenced_grace(membership).min(self.cfg.shutdown_timeout),
        };
        if let Some(monitor) = self.hang.as_mut() {
            monitor.disarm();
        }
        let failures = match self.group.as_mut() {
            Some(group) => group.stop(sig, grace).await,
            None => Vec::new(),
        };
        self.group = None;
        self.stacks.set(Vec::new());
        Input::Stopped(failures)
    }

    async fn reform(&mut self, open: bool) -> Input {
        if open {
            if let Err(e) = self.rendezvous.open_next_round().await {
                return Input::Failed(e.into());
            }
        }
        Input::Reformed
    }

    /// Leaves the rendezvous at once (the others re-form now, not after a heartbeat timeout), then runs the
    /// user's hook (bounded).
    async fn drain(&mut self, fault: &Fault) -> Input {
        if let Err(e) = self.rendezvous.leave().await {
            tracing::warn!("cannot leave the rendezvous: {e}");
        }
        if let Some(cmd) = &self.cfg.on_node_fault {
            let env = super::gpu::hook_env(fault, &self.cfg.run_id);
            // Said in the log whatever it came to; a hook never changes how the node ends.
            let _ = crate::supervisor::hook::run_hook(cmd, &env, HOOK_TIMEOUT, &self.guard).await;
        }
        Input::Drained
    }

    /// On success, the exit barrier (the node hosting the store outlives the others' use of it); then the
    /// rendezvous is closed (success or final failure, never a signal), within `close_timeout`.
    async fn finish(&mut self, barrier: bool) -> Input {
        self.spares.clear();
        if barrier {
            if let Err(e) = self.rendezvous.exit_barrier().await {
                tracing::warn!("{e}");
            }
        }
        let timeout = self.cfg.rdzv.close_timeout;
        match tokio::time::timeout(timeout, self.rendezvous.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("cannot close the rendezvous: {e}"),
            Err(_) => tracing::warn!("cannot close the rendezvous within close_timeout ({timeout:?})"),
        }
        if barrier {
            // Bounded like `close`: a store already gone must not hold the exit.
            match tokio::time::timeout(timeout, self.rendezvous.leave_store(self.hosted.is_some())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!("could not say this node is done with the store: {e}"),
                Err(_) => tracing::debug!("could not say this node is done with the store within close_timeout"),
            }
        }
        Input::Finished
    }
}

/// `"<port> <addr>"` as group rank 0 publishes it.
fn parse_master(v: &[u8]) -> Result<(String, u16), RdzvError> {
    let text = String::from_utf8_lossy(v);
    let bad = || RdzvError::State(format!("group rank 0 published a malformed workers' store endpoint '{text}'"));
    let (port, addr) = text.split_once(' ').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if addr.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((addr.to_string(), port))
}

fn settings(cfg: &LaunchConfig) -> Settings {
    let static_rdzv = matches!(cfg.rendezvous, RdzvMode::Static { .. });
    let r = &cfg.rdzv;
    Settings {
        run_id: cfg.run_id.clone(),
        min_nodes: cfg.min_nodes,
        max_nodes: cfg.max_nodes,
        join_timeout: r.join_timeout,
        last_call_timeout: r.last_call_timeout,
        exit_barrier_timeout: r.exit_barrier_timeout,
        keep_alive_interval: r.keep_alive_interval,
        keep_alive_max_attempt: r.keep_alive_max_attempt,
        heartbeat_timeout: r.heartbeat_timeout,
        // etcd outlives any node: wait for it as long as a rendezvous may take (training goes on meanwhile).
        store_timeout: match cfg.rendezvous {
            RdzvMode::Etcd(_) => r.join_timeout,
            _ => r.read_timeout,
        },
        node_rank: cfg.pref_rank,
        strict_rank: static_rdzv,
    }
}

fn me(cfg: &LaunchConfig) -> NodeInfo {
    NodeInfo {
        id: format!("{}_{}_0", cfg.local_addr, std::process::id()),
        addr: cfg.local_addr.clone(),
        nproc: cfg.nproc_per_node,
    }
}

fn fingerprint(cfg: &LaunchConfig) -> Fingerprint {
    Fingerprint {
        entrypoint: cfg.entrypoint.name.clone(),
        args: cfg.entrypoint.script_args.clone(),
        nproc_spec: cfg.nproc_spec.clone(),
        nnodes: format!("{}:{}", cfg.min_nodes, cfg.max_nodes),
    }
}
