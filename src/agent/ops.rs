//! The operations a phase runs (join, watch, stop, re-form, drain, finish; start is `start.rs`), each ending
//! in the `Input` it comes to. Effects only: what they mean is `step`'s.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::inplace::Due;
use super::state::{Grace, Input, Op, StopFor};
use super::stores::WorkerStore;
use super::AgentError;
use crate::config::LaunchConfig;
use crate::gate::Check;
use crate::gpu::health::Fault;
use crate::gpu::GpuInfo;
use crate::observe::record::StopKind;
use crate::rendezvous::{Published, RdzvError, Rendezvous, RoundInfo};
use crate::store::tcp::Server;
use crate::store::RdzvStore;
use crate::supervisor::guard::OrphanGuard;
use crate::supervisor::logs::RunLogs;
use crate::supervisor::spare::WarmSpares;
use crate::supervisor::{Watch, WorkerGroup};

/// How long a restart after a worker failure on a GPU node waits for the GPU fault that may follow the
/// death (the driver reports an XID tens of milliseconds after the process it killed is gone).
const FAULT_SETTLE: Duration = Duration::from_millis(250);

/// How long a worker's death by a stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT), or the store's host's end,
/// waits for the agent's own signal before it counts: `scancel` and container runtimes signal every process
/// at once, and the workers, or the agent hosting the store, may be gone before this agent handles its copy.
const SIGNAL_HOLD: Duration = Duration::from_secs(1);

/// How long the `--on-node-fault` hook may run.
pub(super) const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// What ended a watch of the running group: an input, or a health check that drains the node.
enum Won {
    Input(Input),
    Drain(&'static str, String),
}

/// This node's GPUs, when NVML is there.
pub(super) struct Gpus {
    pub(super) nvml: &'static nvml_wrapper::Nvml,
    pub(super) all: Vec<crate::gpu::GpuInfo>,
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
    /// The links read between gates, while the `network` check is on.
    pub(super) links: Option<super::links::LinkWatch>,
    /// Straggler detection (`--straggler-window`), sampling the running group.
    pub(super) pace: Option<crate::straggler::Monitor>,
    /// Re-forming in place: the API for the workers, the channel with `--in-place on`.
    pub(super) in_place: super::inplace::InPlace,
}

impl Work {
    /// `excluded`: the GPUs the job no longer uses, as the join's health gate needs them.
    pub(super) async fn operate(&mut self, op: Op, restart_count: u32, nproc: u32, excluded: BTreeSet<u32>) -> Input {
        let input = self.run(op, restart_count, nproc, excluded).await;
        if let Input::Failed(AgentError::Rendezvous(RdzvError::StoreHostEnded { .. })) = &input {
            // `scancel` stops the store's host and this agent at once: its own signal, should it come now,
            // is why this node ends (the driver takes it first), not the store's loss.
            tokio::time::sleep(SIGNAL_HOLD).await;
        }
        input
    }

    async fn run(&mut self, op: Op, restart_count: u32, nproc: u32, excluded: BTreeSet<u32>) -> Input {
        match op {
            Op::Join => self.join(nproc, restart_count, excluded).await,
            Op::Start { nproc, excluded } => self.start(nproc, excluded, restart_count).await,
            Op::Watch => self.watch().await,
            Op::Stop { sig, grace, why, open_first, keep } => {
                if open_first {
                    self.open_before_stop().await;
                }
                self.stop(sig, grace, why, keep).await
            }
            Op::Reform { open, record, check } => self.reform(open, record, check).await,
            Op::Drain(fault) => self.drain(&fault).await,
            Op::Finish { barrier, failed } => self.finish(barrier, failed).await,
            Op::None => std::future::pending().await,
        }
    }

    /// Joins the next round and learns the workers' store: group rank 0 prepares and publishes it, the
    /// others wait for it (or for a membership change that means it will never come).
    async fn join(&mut self, nproc: u32, restart_count: u32, excluded: BTreeSet<u32>) -> Input {
        if let Err(e) = self.health_gate(nproc, excluded.clone()).await {
            return Input::Failed(e);
        }
        self.rendezvous.set_nproc(nproc);
        self.rendezvous.set_restarts(restart_count);
        self.prestart(nproc, excluded, restart_count).await;
        // Workers kept (or started ahead) take this round in place.
        self.rendezvous.count_join_in_place(self.group.is_some());
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
                    super::peer::log_change(&event, "membership changed before the group started");
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
        let pace_board = self.rendezvous.pace_board();
        let note = self.rendezvous.beat_note();
        let underway = self.hang.as_ref().map(|m| m.underway());
        let on_hang = self.cfg.hang.as_ref().map(|h| h.on_hang);
        let won = {
            let hang = async {
                match self.hang.as_mut() {
                    Some(monitor) => monitor.next(board.as_ref(), &note).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(hang);
            let straggling = async {
                match self.pace.as_mut() {
                    Some(monitor) => monitor.next(pace_board.as_ref()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(straggling);
            let won = loop {
                let overdue = self.in_place.overdue();
                break tokio::select! {
                    outcome = group.watch(&mut self.spares) => match outcome {
                        Watch::Succeeded => Won::Input(Input::Succeeded),
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
                            Won::Input(Input::WorkerFailed { failure, change })
                        }
                    },
                    event = self.rendezvous.next_event() => Won::Input(match event {
                        Ok(event) => {
                            super::peer::log_change(&event, "membership changed");
                            Input::Membership(event)
                        }
                        Err(e) => Input::Failed(e.into()),
                    }),
                    found = &mut hang => return Input::Hung(Box::new(found)),
                    line = super::links::LinkWatch::drained(self.links.as_mut()) => Won::Drain(Check::Network.name(), line),
                    line = &mut straggling => Won::Drain("straggler", line),
                    due = overdue => {
                        match due {
                            Due::Reformed => self.stacks.mark_reformed(),
                            // Killed, each is a worker's death the group's watch then reports.
                            Due::Overdue(pids) => group.kill(&pids),
                        }
                        continue;
                    }
                };
            };
            match (won, on_hang) {
                (Won::Input(input), Some(action))
                    if underway.is_some_and(|u| u.get()) && super::hang::waits_for_verdict(&input) =>
                {
                    tracing::info!("the round moved while a hang is being judged here; waiting for its verdict");
                    let found = tokio::time::timeout(crate::hang::INCIDENT_BOUND, &mut hang).await.ok();
                    Won::Input(super::hang::after_verdict(input, found, action))
                }
                (won, _) => won,
            }
        };
        match won {
            Won::Input(input) => input,
            Won::Drain(kind, line) => Input::Failed(self.drain_unhealthy(kind, line).await),
        }
    }

    /// At the agent's end, stops the workers a re-formation kept in place and no start took up (the agent
    /// ended while joining, say): with the agent's signal when a signal ended it.
    pub(super) async fn stop_kept(&mut self, phase: &super::state::Phase) {
        let Some(mut group) = self.group.take() else { return };
        let sig = match phase {
            super::state::Phase::Done(super::state::End::Interrupted(sig)) => *sig,
            _ => Signal::SIGTERM,
        };
        let _ = group.stop(sig, self.cfg.shutdown_timeout, StopFor::Shutdown.as_str(), &std::collections::HashSet::new()).await;
    }

    /// Moves the round before the workers stop, within one round trip's bound: past it, or on an error, the
    /// stop goes on and the re-formation opens the round as it always does (`open_next_round` is idempotent).
    async fn open_before_stop(&mut self) {
        let bound = self.rendezvous.timing().request_bound;
        match tokio::time::timeout(bound, self.rendezvous.open_next_round()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("could not open the next round before stopping the workers: {e}"),
            Err(_) => tracing::debug!("could not open the next round within {bound:?}; stopping the workers first"),
        }
    }

    /// Stops the group; with `keep`, the workers that can re-form in place go on (the group with them).
    async fn stop(&mut self, sig: Signal, grace: Grace, why: StopFor, keep: bool) -> Input {
        let membership = self.cfg.rdzv.membership_grace;
        let grace = match grace {
            Grace::Shutdown => self.cfg.shutdown_timeout,
            Grace::Membership => membership.min(self.cfg.shutdown_timeout),
            Grace::Fenced => self.rendezvous.timing().fenced_grace(membership).min(self.cfg.shutdown_timeout),
        };
        if let Some(monitor) = self.hang.as_mut() {
            monitor.disarm();
        }
        if let Some(monitor) = self.pace.as_mut() {
            monitor.disarm();
        }
        let kept = match (keep, &self.group) {
            (true, Some(group)) => self.in_place.keepable(group),
            _ => std::collections::HashSet::new(),
        };
        let failures = match self.group.as_mut() {
            Some(group) => group.stop(sig, grace, why.as_str(), &kept).await,
            None => Vec::new(),
        };
        if kept.is_empty() {
            self.group = None;
        } else {
            self.in_place.keep_progress(self.stacks.progress());
        }
        self.stacks.set(Vec::new(), None);
        Input::Stopped(failures)
    }

    /// Records the restart just spent in the job's count (`--job-max-restarts`; over it, the job is closed
    /// and this ends the agent), then opens the next round or follows it.
    async fn reform(&mut self, open: bool, record: Option<StopKind>, check: Option<BTreeSet<u32>>) -> Input {
        if let Some(lost) = self.settle(check).await {
            return Input::Fault(lost);
        }
        if let Some(kind) = record {
            if let Err(e) = self.rendezvous.spend_restart(kind.restart_label()).await {
                return Input::Failed(e.into());
            }
        }
        if open {
            if let Err(e) = self.rendezvous.open_next_round().await {
                return Input::Failed(e.into());
            }
        }
        Input::Reformed
    }

    /// After a worker's death on `gpus`: a moment for the driver's event (the watcher's fault ends this
    /// operation when it comes), then each GPU asked directly; the fault of the first that is lost.
    async fn settle(&mut self, gpus: Option<BTreeSet<u32>>) -> Option<Fault> {
        let (Some(gpus), Some(all)) = (gpus, self.gpus.as_ref()) else { return None };
        tokio::time::sleep(FAULT_SETTLE).await;
        let asked: Vec<GpuInfo> = all.all.iter().filter(|g| gpus.contains(&g.index)).cloned().collect();
        let lost = crate::gpu::health::first_lost(all.nvml, &asked).await?;
        tracing::warn!("GPU {} does not answer after its worker's death ({})", lost.index, lost.reason);
        Some(self.lost_fault(lost.index))
    }

    /// A draining node leaves the rendezvous at once: the others re-form now, not after a heartbeat timeout.
    /// The store's host does not: its store ends with it, and a group re-formed in it meanwhile would start
    /// workers that its end stops at once; the others end with 3 when its port refuses them.
    pub(super) async fn leave_draining(&mut self) {
        if self.hosted.is_some() {
            return;
        }
        if let Err(e) = self.rendezvous.leave().await {
            tracing::warn!("cannot leave the rendezvous: {e}");
        }
    }

    /// Leaves the rendezvous (`leave_draining`), then runs the user's hook (bounded).
    async fn drain(&mut self, fault: &Fault) -> Input {
        self.rendezvous.record_drain(None).await;
        self.leave_draining().await;
        if let Some(cmd) = &self.cfg.on_node_fault {
            let env = super::gpu::hook_env(fault, &self.cfg.run_id);
            // Said in the log whatever it came to; a hook never changes how the node ends.
            let _ = crate::supervisor::hook::run_hook(cmd, &env, HOOK_TIMEOUT, &self.guard).await;
        }
        Input::Drained
    }

    /// Stopped by `sig`: on the store's host, the job is closed with the signal, so that every member ends
    /// with its code (bounded by `close_timeout`; a member stopped alone leaves the others to re-form).
    pub(super) async fn close_stopped(&mut self, sig: Signal) {
        let line = format!("node {} (the store's host) was stopped by {}", self.cfg.local_addr, sig.as_str());
        let timeout = self.cfg.rdzv.close_timeout;
        match tokio::time::timeout(timeout, self.rendezvous.close_stopped(sig, line)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("cannot tell the members the job was stopped: {e}"),
            Err(_) => tracing::debug!("cannot tell the members the job was stopped within close_timeout ({timeout:?})"),
        }
    }

    /// On success, the exit barrier (the node hosting the store outlives the others' use of it); then the
    /// rendezvous is closed (success or final failure, never a signal), within `close_timeout`; a failure
    /// is closed with `failed`, named by this node.
    async fn finish(&mut self, barrier: bool, failed: Option<String>) -> Input {
        self.spares.clear();
        if barrier {
            if let Err(e) = self.rendezvous.exit_barrier().await {
                tracing::warn!("{e}");
            }
        }
        let timeout = self.cfg.rdzv.close_timeout;
        let failed = failed.map(|line| format!("node {}: {line}", self.cfg.local_addr));
        match tokio::time::timeout(timeout, self.rendezvous.close(failed)).await {
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
