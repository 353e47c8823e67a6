//! Setting the agent up: the stores, the rendezvous registration, the banner, the GPU watcher, and the
//! `Work` the operations run on. A signal meanwhile ends it (`End::Interrupted`), as does any error.

use std::sync::Arc;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::driver::{Agent, Ambient};
use super::gpu::FaultLog;
use super::ops::{Gpus, Work};
use super::state::{End, Job, State};
use super::stores::{open_rendezvous_store, WorkerStore};
use super::transitions::Transitions;
use super::AgentError;
use crate::config::{LaunchConfig, Rendezvous as RdzvMode};
use crate::gpu::health::Watcher;
use crate::observe::Sinks;
use crate::rendezvous::{Fingerprint, NodeInfo, Rendezvous, Settings};
use crate::signals::Delivery;
use crate::supervisor::guard::OrphanGuard;
use crate::supervisor::logs::RunLogs;
use crate::supervisor::reaper;
use crate::supervisor::spare::WarmSpares;

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
        let node_id = me(&cfg).id;
        let (hosted, store) = tokio::select! {
            r = open_rendezvous_store(&cfg, &node_id) => r.map_err(fail)?,
            Some(sig) = next_stop(&mut signals) => return Err(End::Interrupted(sig)),
        };
        let mut rendezvous = Rendezvous::new(store, settings(&cfg), me(&cfg), fingerprint(&cfg));
        let hosting = hosted.is_some();
        tokio::select! {
            r = async { if hosting { rendezvous.announce_host().await?; } rendezvous.register().await } => r.map_err(fail)?,
            Some(sig) = next_stop(&mut signals) => return Err(End::Interrupted(sig)),
        }
        super::banner::banner(&cfg, &rendezvous, hosted.is_some(), &logs);
        if cfg.max_nodes > 1 {
            super::stores::warn_if_loopback(&cfg).await;
        }
        let policy = cfg.gpu_policy.describe();
        let gpus = tokio::task::spawn_blocking(move || open_gpus(&policy))
            .await
            .map_err(|e| fail(AgentError::Internal(format!("GPU inventory task: {e}"))))?;
        let watcher = gpus.as_ref().map(|g| Watcher::start(g.nvml, &g.all, &cfg.gpu_policy));
        let gpu_job = gpu_job && gpus.is_some();
        let mut in_place = super::inplace::InPlace::open(&cfg).map_err(fail)?;
        in_place.mark_when_used(rendezvous.in_place_mark(), rendezvous.timing().request_bound);
        let job = Job {
            run_id: cfg.run_id.clone(),
            nproc_per_node: cfg.nproc_per_node,
            max_restarts: cfg.max_restarts,
            on_hang: cfg.hang.as_ref().map(|h| h.on_hang).unwrap_or(crate::config::OnHang::Restart),
            multi_node: cfg.max_nodes > 1,
            gpus: gpus.as_ref().map(|g| g.all.iter().map(|gpu| gpu.index).collect()).unwrap_or_default(),
            in_place: in_place.on(),
        };
        let worker_store = WorkerStore {
            server: None,
            shared_with_rendezvous: matches!(cfg.rendezvous, RdzvMode::Static { .. }),
            addr: match &cfg.rendezvous {
                RdzvMode::Static { master_addr, .. } => master_addr.clone(),
                RdzvMode::C10d { .. } | RdzvMode::Etcd(_) | RdzvMode::Kube(_) => cfg.local_addr.clone(),
            },
        };
        let pace_note = rendezvous.pace_note();
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
            links: cfg.health.links(&cfg.local_addr).map(|l| super::links::LinkWatch::new(l, cfg.health.on_link_drop)),
            pace: cfg.straggler.map(|s| {
                crate::straggler::Monitor::new(s, cfg.rdzv.keep_alive_interval, pace_note, sinks.events.clone(), sinks.metrics.clone())
            }),
            in_place,
        };
        Ok(Agent {
            work,
            ambient: Ambient { signals, watcher },
            state: State::new(job),
            faults: FaultLog::default(),
            transitions: Transitions::new(&cfg, sinks),
        })
    }
}

/// Opens NVML and reads this node's GPUs (blocking: call off the async threads).
fn open_gpus(policy: &str) -> Option<Gpus> {
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
        // etcd and the API server outlive any node: wait for them as long as a rendezvous may take (training
        // goes on meanwhile).
        store_timeout: match cfg.rendezvous {
            RdzvMode::Etcd(_) | RdzvMode::Kube(_) => r.join_timeout,
            _ => r.read_timeout,
        },
        node_rank: cfg.pref_rank,
        strict_rank: static_rdzv,
        restart_budget: cfg.restart_budget.clone(),
        exclude_after: cfg.exclude_after.clone(),
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
        restart_budget: cfg.restart_budget.as_ref().map(|b| b.spec()).unwrap_or_default(),
        exclude_after: cfg.exclude_after.as_ref().map(|b| b.spec()).unwrap_or_default(),
    }
}
