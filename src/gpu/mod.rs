//! GPUs through NVML, loaded at run time (`libnvidia-ml.so.1`, or `$MUSTER_NVML_LIBRARY` — how tests load a
//! fake). With no driver, GPU features are off with one info line and CPU-only jobs run as usual.
//!
//! - `mod.rs`: loading NVML once for the process, the inventory, a lost GPU as an error, bounded NVML calls;
//! - `xid.rs`: what each fault means (the policy table);
//! - `health.rs`: the watcher thread (NVML events and counters) and the checks before a spawn;
//! - `placement.rs`: the placement of a job's workers (what `muster plan` shows, what the agent applies).

pub mod health;
pub mod placement;
pub mod topology;
pub mod xid;

use std::ffi::OsString;
use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

/// The clock-event reasons that slow a GPU by themselves: hardware slowdown, thermal (software or
/// hardware), the power brake. Not idling, not clocks an administrator set, not a busy GPU's power cap.
pub const SLOWING_CLOCKS: ThrottleReasons = ThrottleReasons::HW_SLOWDOWN
    .union(ThrottleReasons::SW_THERMAL_SLOWDOWN)
    .union(ThrottleReasons::HW_THERMAL_SLOWDOWN)
    .union(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN);

/// The environment variable that points muster at another NVML library (a fake one in tests).
pub const NVML_LIBRARY_ENV: &str = "MUSTER_NVML_LIBRARY";

#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver found (NVML could not be loaded: {0})")]
    NoDriver(String),
    /// A GPU stopped answering: a GPU fault (drain class), not a reason to run without GPUs.
    #[error(transparent)]
    Lost(#[from] LostGpu),
    #[error("NVML call failed: {0}")]
    Nvml(String),
}

impl From<NvmlError> for GpuError {
    fn from(e: NvmlError) -> GpuError {
        GpuError::Nvml(e.to_string())
    }
}

/// A GPU that no longer answers NVML: the agent treats it as XID 79 on that GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU {index}{} {reason}", uuid.as_ref().map(|u| format!(" ({u})")).unwrap_or_default())]
pub struct LostGpu {
    /// NVML index.
    pub index: u32,
    /// None when the GPU was lost before its UUID could be read (map the index through an earlier inventory).
    pub uuid: Option<String>,
    pub reason: LostReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// NVML answered `GPU_IS_LOST`: the GPU fell off the bus.
    FellOffTheBus,
    /// An NVML call on it did not return within this deadline.
    NoAnswer(Duration),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::FellOffTheBus => f.write_str("fell off the bus (NVML: GPU is lost)"),
            LostReason::NoAnswer(d) => write!(f, "did not answer NVML within {d:?}"),
        }
    }
}

impl LostGpu {
    /// `Some` when `e` says the GPU at `index` is lost.
    pub fn from_nvml(e: &NvmlError, index: u32, uuid: Option<&str>) -> Option<LostGpu> {
        matches!(e, NvmlError::GpuLost).then(|| LostGpu {
            index,
            uuid: uuid.map(str::to_string),
            reason: LostReason::FellOffTheBus,
        })
    }
}

/// The longest one batch of NVML calls on one GPU may take before that GPU counts as not answering. A healthy
/// GPU answers in milliseconds; one that fell off the bus can hold a call for many seconds.
pub const NVML_ANSWER_DEADLINE: Duration = Duration::from_secs(5);

/// Runs `work` (blocking NVML calls on `gpu`) off the async threads, bounded by `deadline`.
///
/// On timeout the blocking thread is left behind, still inside the driver: an NVML call cannot be cancelled.
/// It ends when the call returns; the runtime's shutdown does not wait for it longer than its own timeout.
pub async fn answer<T: Send + 'static>(
    gpu: &GpuInfo,
    deadline: Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LostGpu> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(work)).await {
        Ok(Ok(out)) => Ok(out),
        // The work panicked: a bug, not a GPU fault.
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(LostGpu { index: gpu.index, uuid: Some(gpu.uuid.clone()), reason: LostReason::NoAnswer(deadline) }),
    }
}

static NVML: OnceLock<Result<Nvml, GpuError>> = OnceLock::new();

/// NVML, loaded on first use and kept for the process lifetime (event sets borrow it), honouring
/// `$MUSTER_NVML_LIBRARY`.
pub fn nvml() -> Result<&'static Nvml, GpuError> {
    NVML.get_or_init(|| {
        let mut builder = Nvml::builder();
        let path: Option<OsString> = std::env::var_os(NVML_LIBRARY_ENV);
        if let Some(path) = path.as_deref() {
            builder.lib_path(path);
        }
        builder.init().map_err(|e| GpuError::NoDriver(e.to_string()))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Number of GPUs NVML reports on this node.
pub fn device_count() -> Result<u32, GpuError> {
    Ok(nvml()?.device_count()?)
}

/// One GPU as NVML identifies it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub name: String,
    pub memory_total: u64,
}

/// Every GPU on this node, in NVML index order; a lost GPU is [`GpuError::Lost`].
pub fn inventory(nvml: &Nvml) -> Result<Vec<GpuInfo>, GpuError> {
    (0..nvml.device_count()?)
        .map(|index| {
            let lost = |e: NvmlError| LostGpu::from_nvml(&e, index, None).map_or_else(|| e.into(), GpuError::Lost);
            let d = nvml.device_by_index(index).map_err(lost)?;
            Ok(GpuInfo {
                index,
                uuid: d.uuid().map_err(lost)?,
                pci_bus_id: d.pci_info().map_err(lost)?.bus_id,
                name: d.name().map_err(lost)?,
                memory_total: d.memory_info().map_err(lost)?.total,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu() -> GpuInfo {
        GpuInfo { index: 3, uuid: "GPU-3".into(), pci_bus_id: "00000000:5D:00.0".into(), name: "H100".into(), memory_total: 0 }
    }

    #[tokio::test]
    async fn a_batch_that_does_not_answer_is_a_lost_gpu() {
        assert_eq!(answer(&gpu(), Duration::from_secs(30), || 7).await, Ok(7));
        // The stalled thread is left behind and ends on its own.
        let stalled = answer(&gpu(), Duration::from_millis(20), || std::thread::sleep(Duration::from_millis(300))).await;
        let lost = stalled.unwrap_err();
        assert_eq!(lost, LostGpu { index: 3, uuid: Some("GPU-3".into()), reason: LostReason::NoAnswer(Duration::from_millis(20)) });
        assert_eq!(lost.to_string(), "GPU 3 (GPU-3) did not answer NVML within 20ms");
        let bus = LostGpu::from_nvml(&NvmlError::GpuLost, 1, None).unwrap();
        assert_eq!(bus.to_string(), "GPU 1 fell off the bus (NVML: GPU is lost)");
        assert_eq!(LostGpu::from_nvml(&NvmlError::Timeout, 1, None), None);
    }
}
