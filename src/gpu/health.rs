//! GPU health: the watcher (NVML events as the driver raises them, plus a periodic read of what has no event:
//! volatile uncorrected ECC errors, row-remap failure, the driver's recovery action) and the check before
//! every spawn.
//!
//! One thread per GPU, each with its own NVML event set: a set is not `Sync`, `wait` blocks, and with one
//! shared set an unsupported registration on one device would free the registrations of the others
//! (nvml-wrapper frees the set on any error). Faults go to the agent on a channel, classified by the policy.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use tokio::sync::mpsc;

use super::xid::{Action, FaultKind, Policy};
use super::GpuInfo;

/// How long one `wait` blocks before the thread checks for shutdown and reads counters.
const WAIT_MS: u32 = 200;
/// How often the counters without events (ECC volatile uncorrected) are read.
const COUNTER_PERIOD: Duration = Duration::from_secs(1);

/// A fault on one GPU and what the policy says to do.
#[derive(Debug, Clone)]
pub struct Fault {
    pub gpu: GpuInfo,
    pub kind: FaultKind,
    pub action: Action,
}

/// The running watcher; dropping it stops its threads at their next wake-up.
pub struct Watcher {
    faults: mpsc::UnboundedReceiver<Fault>,
    stop: Arc<AtomicBool>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Watcher {
    /// Starts one watching thread per GPU.
    pub fn start(nvml: &'static Nvml, gpus: &[GpuInfo], policy: &Policy) -> Watcher {
        let (tx, faults) = mpsc::unbounded_channel();
        let stop = Arc::new(AtomicBool::new(false));
        for gpu in gpus {
            let (tx, stop, gpu, policy) = (tx.clone(), stop.clone(), gpu.clone(), policy.clone());
            let spawned = std::thread::Builder::new().name(format!("gpu{}-watch", gpu.index)).spawn(move || {
                watch_one(nvml, gpu, &policy, &tx, &stop);
            });
            if let Err(e) = spawned {
                tracing::warn!("cannot start the GPU watcher thread: {e}");
            }
        }
        Watcher { faults, stop }
    }

    /// The next fault (cancel-safe).
    pub async fn next(&mut self) -> Option<Fault> {
        self.faults.recv().await
    }
}

fn watch_one(nvml: &'static Nvml, gpu: GpuInfo, policy: &Policy, tx: &mpsc::UnboundedSender<Fault>, stop: &AtomicBool) {
    let report = |kind: FaultKind| {
        let action = policy.action(kind);
        tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, pci = %gpu.pci_bus_id, "GPU fault: {kind}; action: {}", action.as_str());
        let _ = tx.send(Fault { gpu: gpu.clone(), kind, action });
    };
    let device = match nvml.device_by_index(gpu.index) {
        Ok(d) => d,
        Err(NvmlError::GpuLost) => return report(FaultKind::Lost),
        Err(e) => return tracing::warn!(gpu = gpu.index, "cannot watch GPU: {e}"),
    };
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mask = device.supported_event_types().map(|s| s & wanted).unwrap_or(EventTypes::empty());
    let set = match nvml.create_event_set() {
        Ok(set) if !mask.is_empty() => match device.register_events(mask, set) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(gpu = gpu.index, "cannot register GPU events ({}); counters only", e.error);
                None
            }
        },
        Ok(_) => {
            tracing::info!(gpu = gpu.index, "this GPU reports no XID or ECC events; counters only");
            None
        }
        Err(e) => {
            tracing::warn!(gpu = gpu.index, "cannot create an NVML event set ({e}); counters only");
            None
        }
    };
    tracing::debug!(gpu = gpu.index, events = ?mask, "watching GPU");
    let mut dbe_seen = uncorrected(&device).unwrap_or(0);
    let (mut remap_failed, mut recovery) = (false, 0u32);
    let mut last_read = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let waited = match &set {
            Some(set) => set.wait(WAIT_MS),
            None => {
                std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                Err(NvmlError::Timeout)
            }
        };
        match waited {
            Ok(event) => {
                if event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    let code = match event.event_data {
                        Some(XidError::Value(x)) => Some(x),
                        _ => None,
                    };
                    report(FaultKind::Xid(code));
                    if code == Some(79) {
                        return;
                    }
                }
                if event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    dbe_seen = uncorrected(&device).unwrap_or(dbe_seen + 1);
                    report(FaultKind::DoubleBitEcc);
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(NvmlError::GpuLost) => return report(FaultKind::Lost),
            Err(e) => {
                tracing::warn!(gpu = gpu.index, "NVML event wait failed: {e}");
                std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
            }
        }
        if last_read.elapsed() >= COUNTER_PERIOD {
            last_read = Instant::now();
            match uncorrected(&device) {
                Ok(n) if n > dbe_seen => {
                    dbe_seen = n;
                    report(FaultKind::DoubleBitEcc);
                }
                Err(NvmlError::GpuLost) => return report(FaultKind::Lost),
                _ => {}
            }
            let (failed, action) = remap_and_recovery(&device);
            if failed && !remap_failed {
                report(FaultKind::RemapFailure);
            }
            if action != recovery && action != 0 {
                report(FaultKind::RecoveryAction(action));
            }
            (remap_failed, recovery) = (failed, action);
        }
    }
}

/// NVML field ids: row-remap failure, and the driver's recovery action (read where supported).
const FI_REMAP_FAILURE: u32 = 145;
const FI_RECOVERY_ACTION: u32 = 230;

/// (row remapping failed, recovery action); fields a GPU does not support count as healthy.
fn remap_and_recovery(device: &Device) -> (bool, u32) {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let Ok(values) = device.field_values_for(&[FieldId(FI_REMAP_FAILURE), FieldId(FI_RECOVERY_ACTION)]) else {
        return (false, 0);
    };
    let as_u64 = |v: &Result<nvml_wrapper::struct_wrappers::device::FieldValueSample, NvmlError>| match v {
        Ok(s) => match s.value {
            Ok(SampleValue::U32(x)) => u64::from(x),
            Ok(SampleValue::U64(x)) => x,
            Ok(SampleValue::I64(x)) => x.max(0) as u64,
            _ => 0,
        },
        Err(_) => 0,
    };
    let failed = values.first().map(as_u64).unwrap_or(0) != 0;
    let action = values.get(1).map(as_u64).unwrap_or(0);
    (failed, u32::try_from(action).unwrap_or(u32::MAX))
}

/// Volatile uncorrected ECC errors (NotSupported on GPUs without ECC: treated as none).
fn uncorrected(device: &Device) -> Result<u64, NvmlError> {
    match device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
        Err(NvmlError::NotSupported) => Ok(0),
        other => other,
    }
}

/// Before a spawn: every GPU the workers will use answers, and holds no compute process (the previous
/// attempt's may take a moment to release their memory; anyone else's is an error naming it).
pub async fn check_before_spawn(nvml: &'static Nvml, gpus: &[GpuInfo], wait: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + wait;
    let gpus = gpus.to_vec();
    loop {
        let gpus = gpus.clone();
        let busy = tokio::task::spawn_blocking(move || busy_gpus(nvml, &gpus))
            .await
            .map_err(|e| format!("GPU check failed: {e}"))??;
        let Some((gpu, pid)) = busy.into_iter().next() else { return Ok(()) };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "GPU {} ({}, {}) is still used by process {pid} after {wait:?}; stop that process or exclude the GPU",
                gpu.index, gpu.uuid, gpu.pci_bus_id
            ));
        }
        tracing::info!(gpu = gpu.index, pid, "GPU still holds a compute process; waiting before starting workers");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// GPUs that hold a compute process, with one of its PIDs; an error for a GPU that does not answer.
fn busy_gpus(nvml: &Nvml, gpus: &[GpuInfo]) -> Result<Vec<(GpuInfo, u32)>, String> {
    let mut busy = Vec::new();
    for gpu in gpus {
        let lost = |e: NvmlError| format!("GPU {} ({}) does not answer: {e}", gpu.index, gpu.uuid);
        let device = nvml.device_by_index(gpu.index).map_err(lost)?;
        device.uuid().map_err(lost)?;
        match device.running_compute_processes() {
            Ok(procs) => {
                if let Some(p) = procs.first() {
                    busy.push((gpu.clone(), p.pid));
                }
            }
            Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => {}
            Err(e) => return Err(lost(e)),
        }
    }
    Ok(busy)
}
