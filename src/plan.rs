//! `muster plan`: shows where each local rank would run (GPU, NUMA node, CPUs) and the `CUDA_VISIBLE_DEVICES`
//! the workers would get, and [`placement_for`], the same computation for the agent before every spawn.
//!
//! The decisions live in [`crate::gpu::topology`]; this module gathers the inputs (NVML, the sysfs tree, the
//! inherited environment, this process's CPU affinity) and presents the result.
//!
//! Exit codes of `muster plan`: 0 planned; 1 no NVIDIA driver / no GPU / the topology could not be read;
//! 2 bad input (one line naming the flag), including more workers than usable GPUs.

use std::collections::BTreeSet;
use std::path::Path;

use clap::{ArgAction, Parser};

use crate::gpu::topology::{
    self, format_cpulist, NumaMode, Plan, PlanInput, Selection, DEFAULT_SYSFS_ROOT,
};
use crate::gpu::GpuInfo;

/// Show the topology-aware placement of this node's workers.
#[derive(Debug, Parser)]
#[command(name = "muster plan")]
struct PlanArgs {
    /// Workers on this node: an integer, gpu or auto (both: every usable GPU). Default: every usable GPU.
    #[arg(long = "nproc-per-node", alias = "nproc_per_node")]
    nproc_per_node: Option<String>,
    /// CPU binding per local rank: node, socket, exclusive or core-complex.
    #[arg(long = "numa-binding", alias = "numa_binding",
          value_parser = ["node", "socket", "exclusive", "core-complex"])]
    numa_binding: Option<String>,
    /// Only these GPUs (NVML indices or UUIDs, comma-separated), within the inherited CUDA_VISIBLE_DEVICES.
    #[arg(long)]
    gpus: Option<String>,
    /// Give each worker only its own GPU in CUDA_VISIBLE_DEVICES.
    #[arg(long = "virtual-local-rank", alias = "virtual_local_rank", action = ArgAction::SetTrue)]
    virtual_local_rank: bool,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    format: String,
}

/// Why no plan was made.
enum Failure {
    /// No driver or no GPU: placement does not apply.
    NoGpu(String),
    /// The user's input cannot be satisfied (exit 2).
    Input(String),
    /// The machine could not be read (exit 1).
    System(String),
}

/// How many workers: a number, or every usable GPU.
#[derive(Debug, Clone, Copy)]
enum Nproc {
    Exactly(u32),
    AllUsable,
}

/// A computed placement with what it was computed from.
struct Planned {
    plan: Plan,
    selection: Selection,
    gpus: Vec<GpuInfo>,
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
/// Returns Ok(None) when NVML cannot be loaded or reports no GPU (run without placement), and Err with one
/// user-facing line (naming the flag) when the placement is impossible, e.g. more workers than usable GPUs.
pub fn placement_for(
    nproc: u32,
    numa: Option<&str>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    virtual_local_rank: bool,
) -> Result<Option<Plan>, String> {
    let numa = numa.map(str::parse::<NumaMode>).transpose()?;
    match compute(Nproc::Exactly(nproc), numa, gpus_flag, excluded, virtual_local_rank) {
        Ok(p) => Ok(Some(p.plan)),
        Err(Failure::NoGpu(_)) => Ok(None),
        Err(Failure::Input(msg) | Failure::System(msg)) => Err(msg),
    }
}

fn compute(
    nproc: Nproc,
    numa: Option<NumaMode>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    virtual_local_rank: bool,
) -> Result<Planned, Failure> {
    let nvml = crate::gpu::nvml().map_err(|e| Failure::NoGpu(e.to_string()))?;
    let gpus = crate::gpu::inventory(nvml).map_err(|e| Failure::System(format!("cannot list the GPUs: {e}")))?;
    if gpus.is_empty() {
        return Err(Failure::NoGpu("NVML reports no GPU on this node".into()));
    }
    let env = |k: &str| std::env::var(k).ok();
    // Opaque MIG UUIDs carry no placement information: ask NVML for the parent GPU.
    let mig_parent = |uuid: &str| -> Option<u32> {
        let device = nvml.device_by_uuid(uuid).ok()?;
        device.mig_parent_device().ok()?.index().ok()
    };
    let selection = topology::select_gpus(&gpus, &env, gpus_flag, excluded, &mig_parent)
        .map_err(|e| Failure::Input(e.to_string()))?;
    let nproc = match nproc {
        Nproc::Exactly(n) => n,
        Nproc::AllUsable if selection.gpus.is_empty() => {
            return Err(Failure::Input(format!("no usable GPU ({})", describe(&selection, excluded))))
        }
        Nproc::AllUsable => u32::try_from(selection.gpus.len()).unwrap_or(u32::MAX),
    };
    let root = topology::sysfs_root();
    let topo = topology::read(nvml, &gpus, &root).map_err(|e| Failure::System(e.to_string()))?;
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
        topology::PlanError::TooManyWorkers { .. } => {
            Failure::Input(format!("'--nproc-per-node {nproc}': {e} ({})", describe(&selection, excluded)))
        }
        other => Failure::Input(other.to_string()),
    })?;
    Ok(Planned { plan, selection, gpus })
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
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let cpus: BTreeSet<u32> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .filter_map(|c| u32::try_from(c).ok())
        .collect();
    // An empty mask cannot be right (this process is running somewhere): do not restrict on it.
    (!cpus.is_empty()).then_some(cpus)
}

/// Entry point of `muster plan ARGS...`; returns the exit code.
pub fn plan_main(args: &[String]) -> i32 {
    let args: PlanArgs = match crate::cli::parse_subcommand("plan", args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let nproc = match args.nproc_per_node.as_deref().map(str::trim) {
        None | Some("gpu" | "auto") => Nproc::AllUsable,
        Some(s) => match s.parse::<u32>() {
            Ok(n) if n > 0 => Nproc::Exactly(n),
            _ => {
                eprintln!("muster plan: error: invalid value '{s}' for '--nproc-per-node': use an integer > 0, gpu or auto");
                return 2;
            }
        },
    };
    let numa = match args.numa_binding.as_deref().map(str::parse::<NumaMode>).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("muster plan: error: {e}");
            return 2;
        }
    };
    let planned = match compute(nproc, numa, args.gpus.as_deref(), &BTreeSet::new(), args.virtual_local_rank) {
        Ok(p) => p,
        Err(Failure::NoGpu(msg)) => {
            eprintln!("muster plan: error: no GPU to place workers on: {msg}");
            return 1;
        }
        Err(Failure::System(msg)) => {
            eprintln!("muster plan: error: {msg}");
            return 1;
        }
        Err(Failure::Input(msg)) => {
            eprintln!("muster plan: error: {msg}");
            return 2;
        }
    };
    for w in &planned.selection.warnings {
        eprintln!("muster plan: warning: {w}");
    }
    if args.format == "json" {
        match serde_json::to_string_pretty(&planned.plan) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("muster plan: error: cannot encode the plan: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", table(&planned));
    }
    0
}

fn table(p: &Planned) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} of {} GPUs usable ({}); numa binding: {}",
        p.selection.gpus.len(),
        p.gpus.len(),
        p.selection.source,
        p.plan.numa_binding.map_or("none (inherit)", NumaMode::as_str)
    );
    let _ = writeln!(out, "CUDA_VISIBLE_DEVICES={} CUDA_DEVICE_ORDER=PCI_BUS_ID", p.plan.visible_devices);
    let _ = writeln!(
        out,
        "{:<10} {:<4} {:<42} {:<18} {:<5} {:<9} {:<24} {:<4}",
        "local_rank", "gpu", "uuid", "pci", "numa", "link_prev", "cpus", "nic"
    );
    for r in &p.plan.ranks {
        let cpus = r.cpus.as_deref().map_or_else(|| "inherit".to_string(), format_cpulist);
        let numa = r.numa_node.map_or_else(|| "-".to_string(), |n| n.to_string());
        let _ = writeln!(
            out,
            "{:<10} {:<4} {:<42} {:<18} {:<5} {:<9} {:<24} {:<4}",
            r.local_rank,
            r.gpu_index,
            r.uuid,
            r.pci_bus_id,
            numa,
            r.link_to_previous.as_deref().unwrap_or("-"),
            cpus,
            // NIC locality is not measured yet (it needs /sys/class/infiniband).
            "n/a"
        );
        if let Some(own) = &r.visible_devices {
            let _ = writeln!(out, "{:<10} own CUDA_VISIBLE_DEVICES={own}", "");
        }
    }
    out
}
