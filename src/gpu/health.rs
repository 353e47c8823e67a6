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
use super::{answer, GpuInfo, LostGpu, NVML_ANSWER_DEADLINE};

/// How long one `wait` blocks before the thread checks for shutdown and reads counters.
const WAIT_MS: u32 = 200;
/// How often the counters without events (ECC volatile uncorrected) are read.
const COUNTER_PERIOD: Duration = Duration::from_secs(1);

/// A fault on one GPU and what the policy says to do.
#[derive(Debug, Clone, PartialEq)]
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

/// What one GPU's watcher observed in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// An event: its XID code when it is an XID event (`Some(None)`: NVML said "unknown"), and whether it
    /// carries a double-bit ECC error.
    Event { xid: Option<Option<u64>>, dbe: bool },
    /// The periodic read: volatile uncorrected ECC errors (None: the read failed other than GpuLost), row
    /// remapping failed, the driver's recovery action.
    Counters { uncorrected: Option<u64>, remap_failed: bool, recovery: u32 },
    /// NVML said the GPU is lost (any call).
    Lost,
}

/// One GPU's watch state: turns what was seen into the faults to report. Pure, so that what the watcher
/// reports is tested as a table. It reports every fault, whatever the policy will do about it, and stops
/// only when the GPU stops answering (after reporting that once).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Tracker {
    dbe_seen: u64,
    remap_failed: bool,
    recovery: u32,
    lost: bool,
}

impl Tracker {
    fn new(uncorrected: u64) -> Tracker {
        Tracker { dbe_seen: uncorrected, ..Tracker::default() }
    }

    fn stopped(&self) -> bool {
        self.lost
    }

    fn observe(&mut self, seen: Seen) -> Vec<FaultKind> {
        if self.lost {
            return Vec::new();
        }
        let mut out = Vec::new();
        match seen {
            Seen::Event { xid, dbe } => {
                out.extend(xid.map(FaultKind::Xid));
                if dbe {
                    // The counter read that follows must not report this error a second time.
                    self.dbe_seen += 1;
                    out.push(FaultKind::DoubleBitEcc);
                }
            }
            Seen::Counters { uncorrected, remap_failed, recovery } => {
                if let Some(n) = uncorrected {
                    if n > self.dbe_seen {
                        out.push(FaultKind::DoubleBitEcc);
                    }
                    self.dbe_seen = self.dbe_seen.max(n);
                }
                if remap_failed && !self.remap_failed {
                    out.push(FaultKind::RemapFailure);
                }
                if recovery != self.recovery && recovery != 0 {
                    out.push(FaultKind::RecoveryAction(recovery));
                }
                (self.remap_failed, self.recovery) = (remap_failed, recovery);
            }
            Seen::Lost => {
                self.lost = true;
                out.push(FaultKind::Lost);
            }
        }
        out
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
    let set = event_set(nvml, &device, gpu.index);
    let mut tracker = match uncorrected(&device) {
        Ok(n) => Tracker::new(n),
        Err(NvmlError::GpuLost) => return report(FaultKind::Lost),
        Err(_) => Tracker::new(0),
    };
    let mut last_read = Instant::now();
    while !stop.load(Ordering::Relaxed) && !tracker.stopped() {
        let waited = match &set {
            Some(set) => set.wait(WAIT_MS),
            None => {
                std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                Err(NvmlError::Timeout)
            }
        };
        let seen = match waited {
            Ok(event) => Some(Seen::Event {
                xid: event.event_type.contains(EventTypes::CRITICAL_XID_ERROR).then_some(match event.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                }),
                dbe: event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR),
            }),
            Err(NvmlError::Timeout) => None,
            Err(NvmlError::GpuLost) => Some(Seen::Lost),
            Err(e) => {
                tracing::warn!(gpu = gpu.index, "NVML event wait failed: {e}");
                std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                None
            }
        };
        seen.into_iter().flat_map(|s| tracker.observe(s)).for_each(report);
        if last_read.elapsed() >= COUNTER_PERIOD && !tracker.stopped() {
            last_read = Instant::now();
            tracker.observe(counters(&device)).into_iter().for_each(report);
        }
    }
}

/// An event set registered for this GPU's XID and double-bit ECC events (None: counters only).
fn event_set<'n>(nvml: &'n Nvml, device: &Device<'n>, index: u32) -> Option<nvml_wrapper::EventSet<'n>> {
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mask = device.supported_event_types().map(|s| s & wanted).unwrap_or(EventTypes::empty());
    tracing::debug!(gpu = index, events = ?mask, "watching GPU");
    match nvml.create_event_set() {
        Ok(set) if !mask.is_empty() => match device.register_events(mask, set) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(gpu = index, "cannot register GPU events ({}); counters only", e.error);
                None
            }
        },
        Ok(_) => {
            tracing::info!(gpu = index, "this GPU reports no XID or ECC events; counters only");
            None
        }
        Err(e) => {
            tracing::warn!(gpu = index, "cannot create an NVML event set ({e}); counters only");
            None
        }
    }
}

/// The periodic read of what has no event. A GPU that no longer answers is [`Seen::Lost`].
fn counters(device: &Device) -> Seen {
    let uncorrected = match uncorrected(device) {
        Ok(n) => Some(n),
        Err(NvmlError::GpuLost) => return Seen::Lost,
        Err(_) => None,
    };
    let (remap_failed, recovery) = remap_and_recovery(device);
    Seen::Counters { uncorrected, remap_failed, recovery }
}

/// What makes `device` unfit to start workers on, as the health gate says it (None: healthy): it is lost,
/// it has volatile uncorrected ECC errors, row remapping failed, or the driver asks for a recovery action.
pub(crate) fn unfit(device: &Device) -> Option<String> {
    match counters(device) {
        Seen::Lost => Some("it is lost (GPU_IS_LOST)".into()),
        Seen::Counters { uncorrected: Some(n), .. } if n > 0 => Some(format!("{n} volatile uncorrected ECC error(s)")),
        Seen::Counters { remap_failed: true, .. } => Some("row remapping failed".into()),
        Seen::Counters { recovery, .. } if recovery != 0 => Some(format!("the driver asks for recovery action {recovery}")),
        Seen::Counters { .. } | Seen::Event { .. } => None,
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

/// Why workers cannot be started on their GPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnCheckError {
    /// A GPU stopped answering (NVML said lost, or a call did not return in time): a drain-class GPU fault.
    #[error(transparent)]
    GpuLost(#[from] LostGpu),
    /// Another process holds the GPU after the whole wait.
    #[error(
        "GPU {} ({}, {}) is still used by process {pid} after {waited:?}; stop that process or exclude the GPU",
        gpu.index, gpu.uuid, gpu.pci_bus_id
    )]
    Busy { gpu: GpuInfo, pid: u32, waited: Duration },
    /// An NVML call on the GPU failed otherwise.
    #[error("GPU {} ({}) cannot be checked: {reason}", gpu.index, gpu.uuid)]
    Nvml { gpu: GpuInfo, reason: String },
}

/// Before a spawn: every GPU the workers will use answers, and holds no compute process (the previous
/// attempt's may take a moment to release their memory; anyone else's after `wait` is [`SpawnCheckError::Busy`]).
/// Each GPU's NVML calls are bounded by [`NVML_ANSWER_DEADLINE`], so a stalled GPU cannot hang the agent.
pub async fn check_before_spawn(nvml: &'static Nvml, gpus: &[GpuInfo], wait: Duration) -> Result<(), SpawnCheckError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut busy = None;
        for gpu in gpus {
            let g = gpu.clone();
            if let Some(pid) = answer(gpu, NVML_ANSWER_DEADLINE, move || compute_process(nvml, &g)).await?? {
                busy = Some((gpu, pid));
                break;
            }
        }
        let Some((gpu, pid)) = busy else { return Ok(()) };
        if tokio::time::Instant::now() >= deadline {
            return Err(SpawnCheckError::Busy { gpu: gpu.clone(), pid, waited: wait });
        }
        tracing::info!(gpu = gpu.index, pid, "GPU still holds a compute process; waiting before starting workers");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The first of `gpus` that no longer answers (GPU_IS_LOST, or nothing within [`NVML_ANSWER_DEADLINE`]), asked
/// directly: a GPU whose worker just died may be lost before the driver's event for it arrives.
pub async fn first_lost(nvml: &'static Nvml, gpus: &[GpuInfo]) -> Option<LostGpu> {
    for gpu in gpus {
        let g = gpu.clone();
        match answer(gpu, NVML_ANSWER_DEADLINE, move || compute_process(nvml, &g)).await {
            Err(lost) | Ok(Err(SpawnCheckError::GpuLost(lost))) => return Some(lost),
            // A process still there, or another error, is no sign of a lost GPU; the start's checks meet it.
            Ok(_) => {}
        }
    }
    None
}

/// One compute process on `gpu` (None: none, or NVML cannot list them); an error when the GPU does not answer.
fn compute_process(nvml: &Nvml, gpu: &GpuInfo) -> Result<Option<u32>, SpawnCheckError> {
    let failed = |e: NvmlError| match LostGpu::from_nvml(&e, gpu.index, Some(&gpu.uuid)) {
        Some(lost) => SpawnCheckError::GpuLost(lost),
        None => SpawnCheckError::Nvml { gpu: gpu.clone(), reason: e.to_string() },
    };
    let device = nvml.device_by_index(gpu.index).map_err(failed)?;
    device.uuid().map_err(failed)?;
    match device.running_compute_processes() {
        Ok(procs) => Ok(procs.first().map(|p| p.pid)),
        Err(NvmlError::NotSupported) | Err(NvmlError::FailedToLoadSymbol(_)) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Seen = Seen::Counters { uncorrected: Some(0), remap_failed: false, recovery: 0 };

    fn xid(code: u64) -> Seen {
        Seen::Event { xid: Some(Some(code)), dbe: false }
    }

    /// What was reported after one step, and whether the watcher still watches.
    type Step<'a> = (&'a [FaultKind], bool);

    /// Feeds `seen` in order; each step's [`Step`].
    fn run(seen: &[Seen]) -> Vec<(Vec<FaultKind>, bool)> {
        let mut t = Tracker::new(0);
        seen.iter().map(|s| (t.observe(*s), !t.stopped())).collect()
    }

    #[test]
    fn the_watcher_reports_every_fault_and_stops_only_when_the_gpu_is_lost() {
        use FaultKind::*;
        let dbe = Seen::Event { xid: None, dbe: true };
        let counters = |n: u64| Seen::Counters { uncorrected: Some(n), remap_failed: false, recovery: 0 };
        let cases: &[(&str, &[Seen], &[Step])] = &[
            (
                "XID 79 keeps the watch (the policy may ignore it); GpuLost ends it, reported once",
                &[xid(79), QUIET, xid(13), Seen::Lost, Seen::Lost, xid(48)],
                &[(&[Xid(Some(79))], true), (&[], true), (&[Xid(Some(13))], true), (&[Lost], false), (&[], false), (&[], false)],
            ),
            (
                "a DBE event and the counter that counts it are one fault; a later rise is another",
                &[dbe, counters(1), counters(1), counters(3)],
                &[(&[DoubleBitEcc], true), (&[], true), (&[], true), (&[DoubleBitEcc], true)],
            ),
            (
                "an XID and a DBE in one event are both reported",
                &[Seen::Event { xid: Some(None), dbe: true }],
                &[(&[Xid(None), DoubleBitEcc], true)],
            ),
            (
                "remap failure once while it lasts; a recovery action each time it changes to non-zero",
                &[
                    Seen::Counters { uncorrected: None, remap_failed: true, recovery: 2 },
                    Seen::Counters { uncorrected: None, remap_failed: true, recovery: 2 },
                    Seen::Counters { uncorrected: None, remap_failed: false, recovery: 0 },
                    Seen::Counters { uncorrected: None, remap_failed: true, recovery: 4 },
                ],
                &[(&[RemapFailure, RecoveryAction(2)], true), (&[], true), (&[], true), (&[RemapFailure, RecoveryAction(4)], true)],
            ),
        ];
        for (name, seen, want) in cases {
            let got = run(seen);
            let want: Vec<(Vec<FaultKind>, bool)> = want.iter().map(|(f, w)| (f.to_vec(), *w)).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn check_errors_say_what_to_do() {
        let gpu = GpuInfo { index: 1, uuid: "GPU-1".into(), pci_bus_id: "00000000:2A:00.0".into(), name: "H100".into(), memory_total: 0 };
        let busy = SpawnCheckError::Busy { gpu: gpu.clone(), pid: 77, waited: Duration::from_secs(5) };
        assert_eq!(
            busy.to_string(),
            "GPU 1 (GPU-1, 00000000:2A:00.0) is still used by process 77 after 5s; stop that process or exclude the GPU"
        );
        let lost = LostGpu { index: 1, uuid: Some("GPU-1".into()), reason: super::super::LostReason::NoAnswer(NVML_ANSWER_DEADLINE) };
        assert_eq!(SpawnCheckError::from(lost).to_string(), "GPU 1 (GPU-1) did not answer NVML within 5s");
    }
}
