//! Starting the workers: placement (NVML and sysfs, off the async threads, bounded), the pre-spawn GPU
//! check, then the spawn itself on the main thread with no await point after it (so a dropped start never
//! leaves workers behind unknown to the driver).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::ops::Work;
use super::state::Input;
use super::AgentError;
use crate::config::LaunchConfig;
use crate::gpu::health::{self, Fault};
use crate::gpu::placement::PlacementError;
use crate::gpu::topology::Plan;
use crate::gpu::xid::FaultKind;
use crate::gpu::GpuInfo;
use crate::rendezvous::RoundInfo;
use crate::supervisor::logs::AttemptLogs;
use crate::supervisor::{GroupSpec, Placement, WorkerGroup};

/// How long NVML may take to answer the placement's queries. A lost GPU whose calls stall is reported by
/// the watcher meanwhile (and drains the node); this bound only keeps a start from hanging for ever.
const PLACEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// A start up to its spawn: the placement, the GPUs it uses, the workers' variables beyond the contract
/// and the attempt's logs.
pub(super) struct Prepared {
    pub(super) plan: Option<Plan>,
    pub(super) used: Option<BTreeSet<u32>>,
    pub(super) extra_env: Vec<(String, String)>,
    pub(super) placements: Vec<Placement>,
    pub(super) attempt: AttemptLogs,
}

/// Why the workers cannot be placed.
#[derive(Debug)]
pub enum PlaceError {
    /// A GPU the workers need does not answer.
    Lost(u32),
    Other(String),
}

/// The placement for `nproc` workers without the `excluded` GPUs. With `strict` (a GPU job), anything but a
/// plan is an error: a GPU job never silently becomes a job without placement.
async fn place(
    cfg: &Arc<LaunchConfig>,
    nproc: u32,
    excluded: BTreeSet<u32>,
    strict: bool,
) -> Result<Option<Plan>, PlaceError> {
    let cfg = cfg.clone();
    let task = tokio::task::spawn_blocking(move || cfg.placement_strict(nproc, &excluded, strict));
    match tokio::time::timeout(PLACEMENT_TIMEOUT, task).await {
        Ok(Ok(Ok(Some(plan)))) => Ok(Some(plan)),
        Ok(Ok(Ok(None))) => Ok(None),
        Ok(Ok(Err(PlacementError::GpuLost(lost)))) => Err(PlaceError::Lost(lost.index)),
        Ok(Ok(Err(e))) => Err(PlaceError::Other(e.to_string())),
        Ok(Err(e)) => Err(PlaceError::Other(format!("GPU placement task failed: {e}"))),
        Err(_) => Err(PlaceError::Other(format!("NVML did not answer the placement within {PLACEMENT_TIMEOUT:?}"))),
    }
}

/// The workers' `CUDA_*` variables and per-rank placements for a plan.
fn apply_plan(cfg: &LaunchConfig, plan: Option<&Plan>) -> (Vec<(String, String)>, Vec<Placement>) {
    let Some(plan) = plan else { return (Vec::new(), Vec::new()) };
    let env = vec![
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
        ("CUDA_VISIBLE_DEVICES".to_string(), plan.visible_devices.clone()),
    ];
    let node_mode = cfg.numa_binding == Some(crate::gpu::topology::NumaMode::Node);
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

/// torch's NCCL flight recorder, kept with the stacks: its ring buffer on, a dump when a collective times
/// out, into the attempt directory. Only the variables the user did not set (`is_set`).
fn flight_recorder_env(attempt: Option<&std::path::Path>, is_set: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    let dump = attempt.map(|d| d.join("nccl_trace_rank_").display().to_string());
    [
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", Some("2000".to_string())),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", Some("1".to_string())),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", dump),
    ]
    .into_iter()
    .filter(|(k, _)| !is_set(k))
    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
    .collect()
}

impl Work {
    /// With hang detection on, the attempt's progress table, pattern and progress files (in the attempt
    /// directory, or a directory of the agent's own when log files are off). Blocking, as creating the
    /// attempt directory is: just before the spawn, on the main thread.
    fn progress_hooks(&self, attempt: AttemptLogs, nproc: u32, restart_count: u32) -> Result<AttemptLogs, AgentError> {
        let Some(hang) = &self.cfg.hang else { return Ok(attempt) };
        let dir = match attempt.dir() {
            Some(d) => d.join("progress"),
            None => std::env::temp_dir().join(format!("muster-progress-{}-{restart_count}", std::process::id())),
        };
        let files = crate::hang::progress::create_files(&dir, nproc)
            .map_err(|source| AgentError::Logs(crate::supervisor::logs::LogError::CreateDir { path: dir.clone(), source }))?;
        let progress = crate::hang::progress::Progress::new(nproc, files.clone());
        Ok(attempt.with_progress(crate::hang::progress::Hooks { progress, pattern: hang.pattern.clone(), files }))
    }

    /// The fault a GPU that stopped answering amounts to.
    pub(super) fn lost_fault(&self, index: u32) -> Fault {
        let known = self.gpus.as_ref().and_then(|g| g.all.iter().find(|gpu| gpu.index == index).cloned());
        let gpu = known.unwrap_or_else(|| GpuInfo {
            index,
            uuid: "unknown".into(),
            pci_bus_id: "unknown".into(),
            name: String::new(),
            memory_total: 0,
        });
        let action = self.cfg.gpu_policy.action(FaultKind::Lost);
        Fault { gpu, kind: FaultKind::Lost, action }
    }

    /// Starts straggler detection on the new group: its ranks, and each local rank's GPU from the plan.
    fn arm_pace(&mut self, targets: &[crate::hang::capture::Target], plan: Option<&Plan>, group_rank: u32) {
        let Some(pace) = self.pace.as_mut() else { return };
        let gpus = plan.map(|p| p.ranks.iter().map(|r| (r.local_rank, r.gpu_index)).collect()).unwrap_or_default();
        pace.arm(crate::straggler::Armed {
            targets: targets.to_vec(),
            gpus,
            nvml: self.gpus.as_ref().map(|g| g.nvml),
            window: pace.window(),
            node: self.hostname.clone(),
            id: self.rendezvous.me().id.clone(),
            group_rank,
        });
    }

    /// Places and checks the workers and opens the attempt's logs: what a start needs before its spawn.
    pub(super) async fn prepare(&mut self, nproc: u32, excluded: BTreeSet<u32>, restart_count: u32) -> Result<Prepared, Input> {
        // Overlaps the kernel's first-move cost with the placement below.
        self.guard.prime_cgroup();
        let plan = match place(&self.cfg, nproc, excluded, self.gpu_job).await {
            Ok(plan) => plan,
            Err(PlaceError::Lost(index)) => return Err(Input::StartLost(self.lost_fault(index))),
            Err(PlaceError::Other(e)) => return Err(Input::Failed(AgentError::Gpu(e))),
        };
        let used: Option<BTreeSet<u32>> = plan.as_ref().map(|p| p.ranks.iter().map(|r| r.gpu_index).collect());
        if let (Some(g), Some(used)) = (&self.gpus, &used) {
            let in_use: Vec<GpuInfo> = g.all.iter().filter(|gpu| used.contains(&gpu.index)).cloned().collect();
            match health::check_before_spawn(g.nvml, &in_use, self.cfg.gpu_wait_timeout).await {
                Ok(()) => {}
                Err(health::SpawnCheckError::GpuLost(lost)) => return Err(Input::StartLost(self.lost_fault(lost.index))),
                Err(e) => return Err(Input::Failed(AgentError::Gpu(e.to_string()))),
            }
        }
        let (mut extra_env, placements) = apply_plan(&self.cfg, plan.as_ref());
        extra_env.extend(self.in_place.env());
        let attempt = self.logs.attempt(restart_count, nproc).map_err(|e| Input::Failed(e.into()))?;
        let attempt = self.progress_hooks(attempt, nproc, restart_count).map_err(Input::Failed)?;
        if self.hang.is_some() && self.gpus.is_some() {
            extra_env.extend(flight_recorder_env(attempt.dir(), &|k| std::env::var_os(k).is_some()));
        }
        Ok(Prepared { plan, used, extra_env, placements, attempt })
    }

    /// The group's specification for `round`, its workers' store at `master`.
    pub(super) fn spec(&self, p: &Prepared, nproc: u32, round: &RoundInfo, master: (String, u16), restart_count: u32) -> GroupSpec {
        let cfg = &self.cfg;
        GroupSpec {
            role: cfg.role.clone(),
            local_world_size: nproc,
            group_rank: round.group_rank,
            group_world_size: round.group_world_size,
            base_global_rank: round.base_global_rank,
            world_size: round.world_size,
            base_role_rank: round.base_global_rank,
            role_world_size: round.world_size,
            master_addr: master.0,
            master_port: master.1,
            restart_count,
            max_restarts: cfg.max_restarts,
            run_id: cfg.run_id.clone(),
            round: round.round,
            use_agent_store: true,
            virtual_local_rank: cfg.virtual_local_rank,
            signals_to_handle: cfg.signals_text.clone(),
            extra_env: p.extra_env.clone(),
            placements: p.placements.clone(),
        }
    }

    /// Places, checks and spawns the group for the joined round.
    pub(super) async fn start(&mut self, nproc: u32, excluded: BTreeSet<u32>, restart_count: u32) -> Input {
        let Some((round, master_addr, master_port)) = self.round.clone() else {
            return Input::Failed(AgentError::Internal("starting without a round".into()));
        };
        let mut prepared = match self.prepare(nproc, excluded, restart_count).await {
            Ok(p) => p,
            Err(input) => return input,
        };
        if let (Some(group), Some(hooks)) = (&self.group, prepared.attempt.progress()) {
            let kept: Vec<u32> = group.running_workers().iter().map(|(rank, _)| *rank).collect();
            let hooks = self.in_place.follow(hooks, &kept);
            prepared.attempt = prepared.attempt.with_progress(hooks);
        }
        let spec = self.spec(&prepared, nproc, &round, (master_addr, master_port), restart_count);
        let Prepared { plan, used, attempt, .. } = prepared;
        let cfg = &self.cfg;
        tracing::debug!(round = round.round, group_rank = spec.group_rank, world_size = spec.world_size, "starting");
        let started = match self.group.take() {
            // Workers kept in place: the missing ranks start, the kept ones are handed the round.
            Some(mut group) => match group.start_missing(&spec, &cfg.entrypoint, &attempt, self.logs.config(), &self.hostname, &mut self.spares) {
                Ok(kept) => {
                    self.in_place.hand_over(&kept, round.round);
                    Ok((group, kept.len() as u32))
                }
                Err(e) => {
                    // Stopped at the agent's end with what it kept.
                    self.group = Some(group);
                    Err(e)
                }
            },
            None => WorkerGroup::start(
                &spec,
                &cfg.entrypoint,
                &attempt,
                self.logs.config(),
                &self.hostname,
                self.guard.clone(),
                &mut self.spares,
            )
            .map(|group| (group, 0)),
        };
        match started {
            Ok((group, kept)) => {
                tracing::debug!(pids = ?group.pids(), log_dir = ?attempt.dir(), "workers started");
                let targets = group.targets();
                self.stacks.set(targets.clone(), attempt.progress().map(|hooks| hooks.progress.clone()));
                self.arm_pace(&targets, plan.as_ref(), round.group_rank);
                self.attempt_dir = attempt.dir().map(|d| d.to_path_buf());
                if let (Some(monitor), Some(hooks)) = (self.hang.as_mut(), attempt.progress()) {
                    monitor.arm(crate::hang::Armed {
                        progress: hooks.progress.clone(),
                        targets,
                        attempt_dir: self.attempt_dir.clone(),
                        run_dir: self.logs.run_dir().map(|d| d.to_path_buf()),
                        hostname: self.hostname.clone(),
                    });
                }
                self.group = Some(group);
                Input::Started { gpus: used, kept }
            }
            Err(e) => Input::Failed(e.into()),
        }
    }
}
