//! The GPU check, on every GPU of the node but those the job excluded: each answers NVML with no recovery
//! action asked for, no failed or pending row remap, no page retirement pending, no volatile double-bit ECC
//! error, no clock-event reason that slows an idle GPU (hardware slowdown, thermal, power brake), as many
//! NVLinks active as its peers, and no compute process of another job; and the node has the GPUs the job
//! needs. Each NVML call is bounded by the gate (`mod.rs`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};

use super::{Check, Finding};

/// NVML field ids: a row remap waiting for the next reset, a page retirement waiting for it.
const FI_REMAP_PENDING: u32 = 144;
const FI_RETIRED_PENDING: u32 = 31;

/// How long a compute process may stay listed after its exit before it counts as another job's.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// The most NVLinks a GPU has (NVML_NVLINK_MAX_LINKS).
const MAX_LINKS: u32 = 18;

const PASS: &str = "every GPU answering, with no ECC error, pending or failed row remap, pending page retirement, \
                    recovery action or slowdown, and all its NVLinks up (reset or replace it)";

/// `excluded`: GPUs the job no longer uses (their fault is known). `needed`: how many GPUs the workers are
/// placed on, where they are.
pub(super) fn check(nvml: Option<&'static Nvml>, excluded: &BTreeSet<u32>, needed: Option<u32>, deadline: Instant) -> Finding {
    let Some(nvml) = nvml else { return Finding::ok(Check::Gpu, "no NVML: nothing to check") };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => return Finding::failed(Check::Gpu, format!("NVML cannot count the GPUs: {e}"), "an NVML that answers"),
    };
    let mut links = Vec::new();
    for index in (0..count).filter(|i| !excluded.contains(i)) {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            Err(e) => return Finding::failed(Check::Gpu, format!("GPU {index}: NVML cannot open it: {e}"), PASS),
        };
        if let Some(why) = crate::gpu::health::unfit(&device).or_else(|| sick(&device)) {
            return Finding::failed(Check::Gpu, format!("GPU {index}: {why}"), PASS);
        }
        if let Some(n) = active_links(&device) {
            links.push((index, n));
        }
    }
    if let Some(why) = foreign_process(nvml, count, excluded, deadline) {
        return Finding::failed(Check::Gpu, why, "GPUs no other job uses (stop that process, or leave the GPU to it with CUDA_VISIBLE_DEVICES)");
    }
    let usable = count - excluded.iter().filter(|i| **i < count).count() as u32;
    if let Some(needed) = needed.filter(|n| *n > usable) {
        let why = format!("{usable} usable GPU(s) ({count} here, {} excluded), the workers need {needed}", count - usable);
        return Finding::failed(Check::Gpu, why, "as many healthy GPUs as workers (or fewer --nproc-per-node)");
    }
    if let Some(why) = fewer_links(&links) {
        return Finding::failed(Check::Gpu, why, PASS);
    }
    let links = links.iter().map(|(_, n)| n).max().map_or(String::new(), |n| format!(", {n} NVLink(s) up each"));
    Finding::ok(Check::Gpu, format!("{usable} GPU(s) answer, none degraded{links}"))
}

/// What the gate asks beyond the watcher's own health (`unfit`): fields a GPU does not support count as
/// healthy.
fn sick(device: &Device) -> Option<String> {
    let fields = device.field_values_for(&[FieldId(FI_REMAP_PENDING), FieldId(FI_RETIRED_PENDING)]).unwrap_or_default();
    let set = |i: usize| {
        fields.get(i).is_some_and(|f| match f.as_ref().map(|s| &s.value) {
            Ok(Ok(SampleValue::U32(v))) => *v != 0,
            Ok(Ok(SampleValue::U64(v))) => *v != 0,
            _ => false,
        })
    };
    if set(0) {
        return Some("a row remap is pending (it takes effect at the next GPU reset)".into());
    }
    if set(1) {
        return Some("a page retirement is pending (it takes effect at the next GPU reset)".into());
    }
    match device.current_throttle_reasons() {
        Ok(reasons) if reasons.intersects(crate::gpu::SLOWING_CLOCKS) => {
            Some(format!("its clocks are slowed while it runs nothing ({:?})", reasons.intersection(crate::gpu::SLOWING_CLOCKS)))
        }
        _ => None,
    }
}

/// A compute process on a GPU the job may use that is not this agent's: another job shares the node. The
/// job's own workers are stopped before every gate, but a driver may list a process for a moment after
/// it exited: one is foreign only if it is still listed after [`RELEASE_WAIT`] (or the gate's end).
fn foreign_process(nvml: &Nvml, count: u32, excluded: &BTreeSet<u32>, deadline: Instant) -> Option<String> {
    let until = (Instant::now() + RELEASE_WAIT).min(deadline);
    let me = std::process::id() as i32;
    loop {
        // /proc is read only when a GPU lists a process (rarely, before a join).
        let mut tree = None;
        let found = (0..count).filter(|i| !excluded.contains(i)).find_map(|index| {
            let procs = nvml.device_by_index(index).ok()?.running_compute_processes().ok()?;
            if procs.is_empty() {
                return None;
            }
            let tree = tree.get_or_insert_with(crate::supervisor::proctree::Tree::scan);
            let p = procs.into_iter().find(|p| !tree.descends(p.pid as i32, me))?;
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => format!("{} MiB", bytes >> 20),
                UsedGpuMemory::Unavailable => "memory unknown".into(),
            };
            Some(format!("GPU {index} is used by process {} ({used}), not this job's", p.pid))
        });
        match found {
            Some(why) if Instant::now() >= until => return Some(why),
            Some(_) => std::thread::sleep(Duration::from_millis(100)),
            None => return None,
        }
    }
}

/// How many of the GPU's NVLinks are up; None for a GPU without NVLink.
fn active_links(device: &Device) -> Option<u32> {
    let mut up = 0;
    for link in 0..MAX_LINKS {
        match device.link_wrapper_for(link).is_active() {
            Ok(true) => up += 1,
            Ok(false) => {}
            Err(NvmlError::NotSupported) if link == 0 => return None,
            Err(_) => break,
        }
    }
    Some(up)
}

/// The GPU with fewer NVLinks up than the best of its peers (on one board every GPU has as many): a link
/// down that the topology expects.
fn fewer_links(links: &[(u32, u32)]) -> Option<String> {
    let best = links.iter().map(|(_, n)| *n).max()?;
    let (index, n) = links.iter().find(|(_, n)| *n < best)?;
    Some(format!("GPU {index} has {n} NVLink(s) up, its peers {best}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_with_fewer_links_up_than_its_peers_is_named() {
        // (each GPU's index and NVLinks up, the finding)
        type Case = (&'static [(u32, u32)], Option<&'static str>);
        let table: &[Case] = &[
            (&[], None),
            (&[(0, 18), (1, 18)], None),
            (&[(0, 18), (1, 17), (2, 18)], Some("GPU 1 has 17 NVLink(s) up, its peers 18")),
            (&[(0, 0), (1, 4)], Some("GPU 0 has 0 NVLink(s) up, its peers 4")),
        ];
        for (links, want) in table {
            assert_eq!(fewer_links(links).as_deref(), *want, "{links:?}");
        }
    }
}
