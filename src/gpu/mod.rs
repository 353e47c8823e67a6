//! GPUs through NVML, loaded at run time (`libnvidia-ml.so.1`, or `$MUSTER_NVML_LIBRARY` — how tests load a
//! fake). With no driver, GPU features are off and CPU-only jobs run as usual.

use std::ffi::OsString;

use nvml_wrapper::Nvml;

/// The environment variable that points muster at another NVML library (a fake one in tests).
pub const NVML_LIBRARY_ENV: &str = "MUSTER_NVML_LIBRARY";

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no NVIDIA driver found (NVML could not be loaded: {0})")]
    NoDriver(String),
    #[error("NVML call failed: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
}

/// Loads NVML, honouring `$MUSTER_NVML_LIBRARY`.
pub fn open() -> Result<Nvml, GpuError> {
    let mut builder = Nvml::builder();
    let path: Option<OsString> = std::env::var_os(NVML_LIBRARY_ENV);
    if let Some(path) = path.as_deref() {
        builder.lib_path(path);
    }
    builder.init().map_err(|e| GpuError::NoDriver(e.to_string()))
}

/// Number of GPUs NVML reports on this node.
pub fn device_count() -> Result<u32, GpuError> {
    Ok(open()?.device_count()?)
}
