//! The GPU check: every GPU answers NVML (each call bounded by the gate), with no recovery action asked
//! for, no failed row remap and no volatile double-bit ECC error (`crate::gpu::health::unfit`).

use super::{Check, Finding};

pub(super) fn check(nvml: Option<&'static nvml_wrapper::Nvml>) -> Finding {
    let Some(nvml) = nvml else { return Finding::ok(Check::Gpu, "no NVML: nothing to check") };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => return Finding::failed(Check::Gpu, format!("NVML cannot count the GPUs: {e}"), "an NVML that answers"),
    };
    for index in 0..count {
        let unfit = match nvml.device_by_index(index) {
            Ok(device) => crate::gpu::health::unfit(&device),
            Err(e) => Some(format!("NVML cannot open it: {e}")),
        };
        if let Some(why) = unfit {
            return Finding::failed(
                Check::Gpu,
                format!("GPU {index}: {why}"),
                "every GPU answering, with no ECC error, failed row remap or recovery action (reset or replace it)",
            );
        }
    }
    Finding::ok(Check::Gpu, format!("{count} GPU(s) answer, no ECC error, row remap failure or recovery action"))
}
