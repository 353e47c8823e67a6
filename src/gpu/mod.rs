//! GPUs through NVML, loaded at run time (`libnvidia-ml.so.1`, or `$MUSTER_NVML_LIBRARY` — how tests load a
//! fake). With no driver, GPU features are off with one info line and CPU-only jobs run as usual.
//!
//! - `mod.rs`: loading NVML once for the process, the inventory;
//! - `xid.rs`: what each fault means (the policy table);
//! - `health.rs`: the watcher thread (NVML events and counters) and the checks before a spawn.

pub mod health;
pub mod topology;
pub mod xid;

use std::ffi::OsString;
use std::sync::OnceLock;

use nvml_wrapper::Nvml;

/// The environment variable that points muster at another NVML library (a fake one in tests).
pub const NVML_LIBRARY_ENV: &str = "MUSTER_NVML_LIBRARY";

#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver found (NVML could not be loaded: {0})")]
    NoDriver(String),
    #[error("NVML call failed: {0}")]
    Nvml(String),
}

impl From<nvml_wrapper::error::NvmlError> for GpuError {
    fn from(e: nvml_wrapper::error::NvmlError) -> GpuError {
        GpuError::Nvml(e.to_string())
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

/// Every GPU on this node, in NVML index order.
pub fn inventory(nvml: &Nvml) -> Result<Vec<GpuInfo>, GpuError> {
    (0..nvml.device_count()?)
        .map(|index| {
            let d = nvml.device_by_index(index)?;
            Ok(GpuInfo {
                index,
                uuid: d.uuid()?,
                pci_bus_id: d.pci_info()?.bus_id,
                name: d.name()?,
                memory_total: d.memory_info()?.total,
            })
        })
        .collect()
}
