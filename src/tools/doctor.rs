//! `muster doctor`: is this node fit to run a job? Prints the launcher's health gate as a table, the driver
//! and GPU inventory, the health counters,
//! the faults NVML raises while it listens, and the effective fault policy; exits non-zero when the node
//! should not be used (no driver, a GPU lost, a fault the policy would drain or exclude for, uncorrected ECC).

use std::time::Duration;

use clap::Parser;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};

use super::{Threads, ToolError};
use crate::gpu::health::Watcher;
use crate::gpu::xid::{Action, Policy};

/// Check this node's GPUs and exit non-zero when it should not be used.
#[derive(Debug, Parser)]
#[command(name = "muster doctor")]
struct DoctorArgs {
    /// Seconds to listen for GPU fault events.
    #[arg(long, default_value_t = 2)]
    listen: u64,
    /// As for the launcher: what a fault that needs a GPU reset does (exclude or drain).
    #[arg(long = "on-gpu-fault", default_value = "drain", value_parser = ["exclude", "drain"])]
    on_gpu_fault: String,
    /// As for the launcher: per-XID overrides, XID=ACTION,...
    #[arg(long = "xid-policy", default_value = "")]
    xid_policy: String,
    /// As for the launcher: the health gate's checks (`storage,shm,network,gpu`, `all` or `none`).
    #[arg(long = "gate-checks", default_value = "all")]
    gate_checks: String,
    /// As for the launcher: a directory the storage check probes (repeatable); the current directory else.
    #[arg(long = "gate-path")]
    gate_path: Vec<std::path::PathBuf>,
    /// The address the job would use (the launcher's --local-addr): the interface carrying it is checked.
    #[arg(long = "local-addr")]
    local_addr: Option<String>,
}

/// The launcher's health gate (`crate::gate`), as a table; its failures join the problems.
fn health_gate(args: &DoctorArgs, nvml: Option<&'static nvml_wrapper::Nvml>) -> Result<Vec<String>, ToolError> {
    let checks = crate::gate::Check::parse_list(&args.gate_checks).map_err(|e| ToolError::Usage(format!("--gate-checks: {e}")))?;
    let paths = if args.gate_path.is_empty() { vec![std::path::PathBuf::from(".")] } else { args.gate_path.clone() };
    let local_addr = args.local_addr.clone().unwrap_or_else(crate::host::fqdn);
    let gate = crate::gate::GateConfig::new(checks, paths, 1, &local_addr);
    let report = crate::gate::run(&gate, nvml);
    crate::outln!("health gate ({} ms):", report.took.as_millis());
    crate::out!("{}", report.table());
    Ok(report.findings.iter().filter(|f| !f.ok).map(|f| f.line()).collect())
}

/// Entry point of `muster doctor ARGS...`. It logs what the GPU libraries report, at the agent's log level.
pub fn main(args: &[String]) -> Result<u8, ToolError> {
    crate::telemetry::init();
    let args: DoctorArgs = super::parse("doctor", args)?;
    let policy = Policy::parse(&args.on_gpu_fault, &args.xid_policy).map_err(|e| ToolError::Usage(e.to_string()))?;
    let gate_problems = health_gate(&args, crate::gpu::nvml().ok())?;
    let nvml = match crate::gpu::nvml() {
        Ok(n) => n,
        Err(e) => {
            crate::outln!("driver: none ({e})");
            crate::outln!("verdict: UNUSABLE for GPU jobs (no NVIDIA driver)");
            return Ok(crate::exit::FAILED);
        }
    };
    crate::outln!("driver: {}", nvml.sys_driver_version().unwrap_or_else(|e| format!("unknown ({e})")));
    let gpus = match crate::gpu::inventory(nvml) {
        Ok(g) => g,
        Err(e) => {
            crate::outln!("verdict: UNUSABLE (cannot read the GPU inventory: {e})");
            return Ok(crate::exit::FAILED);
        }
    };
    let mut problems = gate_problems;
    problems.extend(print_inventory(nvml, &gpus));
    crate::outln!("policy: {}", policy.describe());
    crate::outln!("listening for GPU faults for {} s ...", args.listen);
    let runtime = super::tool_runtime(Threads::One)?;
    let faults = runtime.block_on(async {
        let mut watcher = Watcher::start(nvml, &gpus, &policy);
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(args.listen);
        while let Ok(Some(f)) = tokio::time::timeout_at(deadline, watcher.next()).await {
            seen.push(f);
        }
        seen
    });
    for f in &faults {
        crate::outln!("fault: GPU {} ({}): {} -> {}", f.gpu.index, f.gpu.uuid, f.kind, f.action.as_str());
        if matches!(f.action, Action::Drain | Action::Exclude) {
            problems.push(format!("GPU {}: {} ({})", f.gpu.index, f.kind, f.action.as_str()));
        }
    }
    if problems.is_empty() {
        crate::outln!("verdict: OK");
        Ok(crate::exit::SUCCESS)
    } else {
        crate::outln!("verdict: UNHEALTHY: {}", problems.join("; "));
        Ok(crate::exit::FAILED)
    }
}

/// The inventory table with each GPU's health counters; returns the problems seen (uncorrected ECC).
fn print_inventory(nvml: &nvml_wrapper::Nvml, gpus: &[crate::gpu::GpuInfo]) -> Vec<String> {
    crate::outln!("gpus: {}", gpus.len());
    crate::outln!("{:<5} {:<42} {:<18} {:<28} {:>9} {:>10} {:>9}", "index", "uuid", "pci", "name", "memory", "ecc_uncorr", "processes");
    let mut problems = Vec::new();
    for g in gpus {
        let device = nvml.device_by_index(g.index);
        let ecc = device
            .as_ref()
            .ok()
            .and_then(|d| d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok());
        let procs = device.as_ref().ok().and_then(|d| d.running_compute_processes().ok()).map(|p| p.len());
        let show = |v: Option<usize>| v.map(|n| n.to_string()).unwrap_or_else(|| "n/a".into());
        crate::outln!(
            "{:<5} {:<42} {:<18} {:<28} {:>8}M {:>10} {:>9}",
            g.index,
            g.uuid,
            g.pci_bus_id,
            g.name,
            g.memory_total >> 20,
            show(ecc.map(|n| n as usize)),
            show(procs)
        );
        if ecc.is_some_and(|n| n > 0) {
            problems.push(format!("GPU {} has {} uncorrected ECC error(s)", g.index, ecc.unwrap_or(0)));
        }
    }
    problems
}
