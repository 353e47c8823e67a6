//! `muster plan`: shows where each local rank would run (GPU, NUMA node, CPUs) and the `CUDA_VISIBLE_DEVICES`
//! the workers would get: [`crate::gpu::placement`], the computation the agent applies before every spawn.
//!
//! Exit codes: 0 planned (on a host without NVIDIA GPUs too: the ranks with their inherited CPUs and no
//! GPU); 1 the GPUs or the topology could not be read (a GPU lost included); 2 bad input (one line naming
//! the flag), including more workers than usable GPUs.

use std::collections::BTreeSet;

use clap::{ArgAction, Parser};

use crate::gpu::placement::{self, Nproc, Placed, PlacementError, Planned};
use super::ToolError;
use crate::gpu::topology::{format_cpulist, NumaMode};

/// Show the topology-aware placement of this node's workers.
#[derive(Debug, Parser)]
#[command(name = "muster plan")]
struct PlanArgs {
    /// Workers on this node: an integer, gpu or auto (both: every usable GPU; auto on a host without GPUs: one
    /// per CPU). Default: every usable GPU (1 on a host without GPUs).
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

/// Entry point of `muster plan ARGS...`.
pub fn main(args: &[String]) -> Result<u8, ToolError> {
    let args: PlanArgs = super::parse("plan", args)?;
    let nproc = match args.nproc_per_node.as_deref().map(str::trim) {
        None | Some("gpu" | "auto") => Nproc::AllUsable,
        Some(s) => match s.parse::<u32>() {
            Ok(n) if n > 0 => Nproc::Exactly(n),
            _ => {
                return Err(ToolError::Usage(format!(
                    "invalid value '{s}' for '--nproc-per-node': use an integer > 0, gpu or auto"
                )))
            }
        },
    };
    let numa = args.numa_binding.as_deref().map(str::parse::<NumaMode>).transpose().map_err(usage)?;
    // What the agent would take from the scheduler here (without the flags a launch would add).
    let context = crate::context::detect(&|k| std::env::var(k).ok()).map_err(usage)?.map(|c| c.to_string());
    let context = context.as_deref();
    let planned = match placement::compute(nproc, numa, args.gpus.as_deref(), &BTreeSet::new(), args.virtual_local_rank) {
        Ok(Placed::Gpus(p)) => p,
        Ok(Placed::NoGpu(reason)) => return without_gpus(&args, nproc, &reason, context),
        Err(e @ (PlacementError::GpuLost(_) | PlacementError::System(_))) => {
            return Err(ToolError::Failed(format!("error: {e}")))
        }
        Err(PlacementError::Input(msg)) => return Err(ToolError::Usage(msg)),
    };
    for w in &planned.selection.warnings {
        crate::errln!("muster plan: warning: {w}");
    }
    if args.format == "json" {
        return print_json(&planned.plan, context);
    }
    crate::out!("{}{}", context_line(context), table(&planned));
    Ok(crate::exit::SUCCESS)
}

fn usage(e: impl std::fmt::Display) -> ToolError {
    ToolError::Usage(e.to_string())
}

/// The launch context as the agent's banner says it, on a line of its own (none: nothing).
fn context_line(context: Option<&str>) -> String {
    context.map(|c| format!("launch context {c}\n")).unwrap_or_default()
}

/// The plan as JSON, with `"context"`: the launch context's line, or null.
fn print_json(value: &impl serde::Serialize, context: Option<&str>) -> Result<u8, ToolError> {
    let value = serde_json::to_value(value).map(|mut v| {
        if let serde_json::Value::Object(fields) = &mut v {
            fields.insert("context".into(), context.into());
        }
        v
    });
    let text = value
        .and_then(|v| serde_json::to_string_pretty(&v))
        .map_err(|e| ToolError::Failed(format!("error: cannot encode the plan: {e}")))?;
    crate::outln!("{text}");
    Ok(crate::exit::SUCCESS)
}

/// The plan on a host without NVIDIA GPUs, each rank inheriting this process's CPUs and no GPU. As the
/// launcher counts workers there: `--nproc-per-node N`, `auto` one per CPU this process may use, no flag 1
/// (the launcher's default), and `gpu` is an error.
fn without_gpus(args: &PlanArgs, nproc: Nproc, reason: &str, context: Option<&str>) -> Result<u8, ToolError> {
    if args.numa_binding.is_some() || args.gpus.is_some() {
        return Err(ToolError::Usage(format!(
            "'--numa-binding' and '--gpus' need NVIDIA GPUs, and there are none: {reason}"
        )));
    }
    let cpus = placement::own_cpus();
    let n = match (nproc, args.nproc_per_node.as_deref().map(str::trim)) {
        (Nproc::Exactly(n), _) => n,
        (Nproc::AllUsable, Some("gpu")) => {
            return Err(ToolError::Usage(format!(
                "'--nproc-per-node gpu': no GPU on this node ({reason}); use an integer or auto"
            )));
        }
        (Nproc::AllUsable, Some(_)) => cpus.as_ref().map_or(1, |c| u32::try_from(c.len()).unwrap_or(u32::MAX)),
        (Nproc::AllUsable, None) => 1,
    };
    let cpus: Option<Vec<u32>> = cpus.map(|c| c.into_iter().collect());
    if args.format == "json" {
        let ranks: Vec<serde_json::Value> = (0..n)
            .map(|r| {
                serde_json::json!({
                    "local_rank": r, "gpu_index": null, "uuid": null, "pci_bus_id": null, "numa_node": null,
                    "cpus": cpus, "visible_devices": null, "link_to_previous": null,
                })
            })
            .collect();
        let plan = serde_json::json!({ "numa_binding": null, "ranks": ranks, "visible_devices": null, "no_gpu": reason });
        return print_json(&plan, context);
    }
    let cpus = cpus.as_deref().map_or_else(|| "inherit".to_string(), |c| format!("{} (inherited)", format_cpulist(c)));
    let mut out = context_line(context);
    out.push_str(&format!("no GPU placement: {reason}\nnumber of workers: {n}; CUDA_VISIBLE_DEVICES not set\n"));
    out.push_str(&row(["local_rank", "gpu", "uuid", "pci", "numa", "link_prev", "cpus", "nic"]));
    for r in 0..n {
        out.push_str(&row([&r.to_string(), "-", "-", "-", "-", "-", &cpus, "-"]));
    }
    crate::out!("{out}");
    Ok(crate::exit::SUCCESS)
}

/// One line of the rank table.
fn row(cells: [&str; 8]) -> String {
    let [rank, gpu, uuid, pci, numa, link, cpus, nic] = cells;
    format!("{rank:<10} {gpu:<4} {uuid:<42} {pci:<18} {numa:<5} {link:<9} {cpus:<24} {nic:<4}\n")
}

fn table(p: &Planned) -> String {
    let mut out = format!(
        "{} of {} GPUs usable ({}); numa binding: {}\nCUDA_VISIBLE_DEVICES={} CUDA_DEVICE_ORDER=PCI_BUS_ID\n",
        p.selection.gpus.len(),
        p.gpus.len(),
        p.selection.source,
        p.plan.numa_binding.map_or("none (inherit)", NumaMode::as_str),
        p.plan.visible_devices
    );
    out.push_str(&row(["local_rank", "gpu", "uuid", "pci", "numa", "link_prev", "cpus", "nic"]));
    for r in &p.plan.ranks {
        let cpus = r.cpus.as_deref().map_or_else(|| "inherit".to_string(), format_cpulist);
        let numa = r.numa_node.map_or_else(|| "-".to_string(), |n| n.to_string());
        out.push_str(&row([
            &r.local_rank.to_string(),
            &r.gpu_index.to_string(),
            &r.uuid,
            &r.pci_bus_id,
            &numa,
            r.link_to_previous.as_deref().unwrap_or("-"),
            &cpus,
            // NIC locality is not measured yet (it needs /sys/class/infiniband).
            "n/a",
        ]));
        if let Some(own) = &r.visible_devices {
            out.push_str(&format!("{:<10} own CUDA_VISIBLE_DEVICES={own}\n", ""));
        }
    }
    out
}
