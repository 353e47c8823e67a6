//! The placement of this node's workers: which GPU each local rank gets, its CPU set, and the
//! `CUDA_VISIBLE_DEVICES` they all get. [`placement_for`] is what the agent applies before every spawn;
//! `muster plan` shows the same computation ([`compute`]).
//!
//! The decisions live in [`super::topology`]; this module gathers the inputs (NVML, the sysfs tree, the
//! inherited environment, this process's CPU affinity) and says what failed in a [`PlacementError`].

use std::collections::BTreeSet;
use std::path::Path;

use super::topology::{self, NumaMode, Plan, PlanInput, Selection, DEFAULT_SYSFS_ROOT};
use super::{GpuError, GpuInfo, LostGpu};

/// Why no placement could be made for a job on this node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A GPU stopped answering: a drain-class GPU fault on that GPU (as XID 79), never "run without GPUs".
    #[error(transparent)]
    GpuLost(#[from] LostGpu),
    /// The request cannot be met on these GPUs (one line naming the flag, e.g. more workers than usable
    /// GPUs): bad input.
    #[error("{0}")]
    Input(String),
    /// The machine could not be read (an NVML call or a sysfs file failed).
    #[error("{0}")]
    System(String),
}

impl From<GpuError> for PlacementError {
    fn from(e: GpuError) -> PlacementError {
        match e {
            GpuError::Lost(lost) => PlacementError::GpuLost(lost),
            other => PlacementError::System(format!("cannot list the GPUs: {other}")),
        }
    }
}

/// For callers that report a placement error as one line of text (the launcher's configuration errors).
impl From<PlacementError> for String {
    fn from(e: PlacementError) -> String {
        e.to_string()
    }
}

/// How many workers: a number, or one per usable GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nproc {
    Exactly(u32),
    AllUsable,
}

/// A computed placement with what it was computed from.
#[derive(Debug, Clone)]
pub struct Planned {
    pub plan: Plan,
    pub selection: Selection,
    /// Every GPU of the node (the inventory).
    pub gpus: Vec<GpuInfo>,
}

/// What [`compute`] found.
#[derive(Debug, Clone)]
pub enum Placed {
    Gpus(Planned),
    /// NVML cannot be loaded or reports no GPU (the reason, worded for the user): placement does not apply.
    NoGpu(String),
}

/// The placement of `nproc` local workers, for the agent to apply before every spawn:
/// - export [`Plan::visible_devices`] as `CUDA_VISIBLE_DEVICES` to every worker, with
///   `CUDA_DEVICE_ORDER=PCI_BUS_ID` (indices in it are NVML's, i.e. PCI bus order);
/// - for local rank i, `plan.ranks[i].cpus` (when Some) is the CPU set to `sched_setaffinity` in the child
///   before exec; `plan.ranks[i].numa_node` the node for a memory preference if wanted;
/// - with `virtual_local_rank`, `plan.ranks[i].visible_devices` is that worker's own one-GPU
///   `CUDA_VISIBLE_DEVICES`, overriding the shared one.
///
/// `numa` is the `--numa-binding` mode name (node, socket, exclusive, core-complex; None: no CPU binding),
/// `gpus_flag` a `--gpus` list (NVML indices or UUIDs), `excluded` the NVML indices of GPUs dropped after
/// faults. The inherited `CUDA_VISIBLE_DEVICES` / `SLURM_STEP_GPUS` / `SLURM_JOB_GPUS` /
/// `NVIDIA_VISIBLE_DEVICES` of this process restrict the GPUs (see [`topology::select_gpus`]), the sysfs
/// tree is `$MUSTER_SYSFS_ROOT` (default /sys), and CPU sets are intersected with this process's affinity.
///
/// Returns Ok(None) when NVML cannot be loaded or reports no GPU (run without placement). A GPU that NVML
/// reports lost is [`PlacementError::GpuLost`], whatever the job: the caller treats it as a GPU fault.
/// This makes blocking NVML calls and does not bound them: call it off the async threads, under a deadline
/// (a GPU whose calls stall then counts as lost, [`super::LostReason::NoAnswer`]).
pub fn placement_for(
    nproc: u32,
    numa: Option<NumaMode>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    virtual_local_rank: bool,
) -> Result<Option<Plan>, PlacementError> {
    match compute(Nproc::Exactly(nproc), numa, gpus_flag, excluded, virtual_local_rank)? {
        Placed::Gpus(p) => Ok(Some(p.plan)),
        Placed::NoGpu(_) => Ok(None),
    }
}

/// The placement and its inputs (see [`placement_for`]).
pub fn compute(
    nproc: Nproc,
    numa: Option<NumaMode>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    virtual_local_rank: bool,
) -> Result<Placed, PlacementError> {
    let nvml = match super::nvml() {
        Ok(n) => n,
        Err(e) => return Ok(Placed::NoGpu(e.to_string())),
    };
    let gpus = super::inventory(nvml)?;
    if gpus.is_empty() {
        return Ok(Placed::NoGpu("NVML reports no GPU on this node".into()));
    }
    let env = |k: &str| std::env::var(k).ok();
    // Opaque MIG UUIDs carry no placement information: ask NVML for the parent GPU.
    let mig_parent = |uuid: &str| -> Option<u32> {
        let device = nvml.device_by_uuid(uuid).ok()?;
        device.mig_parent_device().ok()?.index().ok()
    };
    let selection = topology::select_gpus(&gpus, &env, gpus_flag, excluded, &mig_parent)
        .map_err(|e| PlacementError::Input(e.to_string()))?;
    let nproc = match nproc {
        Nproc::Exactly(n) => n,
        Nproc::AllUsable if selection.gpus.is_empty() => {
            return Err(PlacementError::Input(format!("no usable GPU ({})", describe(&selection, excluded))))
        }
        Nproc::AllUsable => u32::try_from(selection.gpus.len()).unwrap_or(u32::MAX),
    };
    let root = topology::sysfs_root();
    let topo = topology::read(nvml, &gpus, &root).map_err(|e| match e {
        topology::TopologyError::Lost(lost) => PlacementError::GpuLost(lost),
        other => PlacementError::System(other.to_string()),
    })?;
    let input = PlanInput {
        gpus: selection.gpus.clone(),
        nproc,
        numa,
        allowed_cpus: allowed_cpus(&root),
        by_uuid: selection.by_uuid,
        mig: selection.mig.clone(),
        virtual_local_rank,
    };
    let plan = topology::plan(&topo, &input).map_err(|e| match e {
        topology::PlanError::TooManyWorkers { .. } => PlacementError::Input(format!(
            "'--nproc-per-node {nproc}': {e} ({})",
            describe(&selection, excluded)
        )),
        other => PlacementError::Input(other.to_string()),
    })?;
    Ok(Placed::Gpus(Planned { plan, selection, gpus }))
}

/// Where the usable GPUs came from, for error messages: `CUDA_VISIBLE_DEVICES=5,2,7,1, 1 excluded`.
fn describe(selection: &Selection, excluded: &BTreeSet<u32>) -> String {
    if excluded.is_empty() {
        format!("selected by {}", selection.source)
    } else {
        let list: Vec<String> = excluded.iter().map(u32::to_string).collect();
        format!("selected by {}, excluded after faults: {}", selection.source, list.join(","))
    }
}

/// This process's CPUs (its cgroup cpuset), which bound every CPU set. Only meaningful against the real
/// sysfs: a fake tree (tests) describes another machine, whose CPUs this process's mask does not name.
fn allowed_cpus(root: &Path) -> Option<BTreeSet<u32>> {
    if root != Path::new(DEFAULT_SYSFS_ROOT) {
        return None;
    }
    own_cpus()
}

/// The CPUs this process may run on (`sched_getaffinity`); None if unknown.
pub fn own_cpus() -> Option<BTreeSet<u32>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let cpus: BTreeSet<u32> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .filter_map(|c| u32::try_from(c).ok())
        .collect();
    // An empty mask cannot be right (this process is running somewhere): do not restrict on it.
    (!cpus.is_empty()).then_some(cpus)
}
