//! Which GPUs this agent may use: the inherited environment, `--gpus`, minus the GPUs excluded after faults.

use std::collections::{BTreeMap, BTreeSet};

use crate::gpu::GpuInfo;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("invalid value '{value}' for '--gpus': {reason}")]
    GpusFlag { value: String, reason: String },
}

/// The GPUs this agent may place workers on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// NVML indices, in the order they were selected (planning reorders them).
    pub gpus: Vec<u32>,
    /// The selection named GPUs by UUID, so the planned `CUDA_VISIBLE_DEVICES` uses UUIDs too.
    pub by_uuid: bool,
    /// GPU → the MIG device it was selected as, which stands for it in `CUDA_VISIBLE_DEVICES` (the worker
    /// must keep seeing the MIG slice, not the whole GPU).
    pub mig: BTreeMap<u32, String>,
    /// Where the selection came from, for error messages: `CUDA_VISIBLE_DEVICES=5,2,7,1`, `all GPUs`, ...
    pub source: String,
    /// Entries that were ignored, worded for the user.
    pub warnings: Vec<String>,
}

/// One list entry resolved to a GPU.
struct Resolved {
    index: u32,
    by_uuid: bool,
    mig: Option<String>,
}

/// Resolves one `CUDA_VISIBLE_DEVICES`-style entry: an NVML index, a GPU UUID or unique prefix of one (with
/// or without `GPU-`), or a MIG device (`MIG-GPU-<uuid>/<gi>/<ci>`, or an opaque `MIG-<uuid>` that
/// `mig_parent` maps to its GPU's index).
fn resolve(entry: &str, all: &[GpuInfo], mig_parent: &dyn Fn(&str) -> Option<u32>) -> Result<Resolved, String> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err("an empty entry".into());
    }
    if entry.bytes().all(|b| b.is_ascii_digit()) {
        let index: u32 = entry.parse().map_err(|_| format!("'{entry}' is not a GPU index"))?;
        return match all.iter().find(|g| g.index == index) {
            Some(_) => Ok(Resolved { index, by_uuid: false, mig: None }),
            None => Err(format!("there is no GPU {index} (NVML sees {})", all.len())),
        };
    }
    if let Some(rest) = entry.strip_prefix("MIG-") {
        let parent = if rest.starts_with("GPU-") {
            // Legacy form: the parent's UUID is spelled out.
            let uuid = rest.split('/').next().unwrap_or(rest);
            by_uuid_prefix(uuid, all)?
        } else {
            mig_parent(entry).ok_or_else(|| format!("no MIG device '{entry}' on this node"))?
        };
        return Ok(Resolved { index: parent, by_uuid: true, mig: Some(entry.to_string()) });
    }
    let uuid = if entry.starts_with("GPU-") { entry.to_string() } else { format!("GPU-{entry}") };
    Ok(Resolved { index: by_uuid_prefix(&uuid, all)?, by_uuid: true, mig: None })
}

fn by_uuid_prefix(prefix: &str, all: &[GpuInfo]) -> Result<u32, String> {
    let prefix = prefix.to_ascii_lowercase();
    let matches: Vec<&GpuInfo> = all.iter().filter(|g| g.uuid.to_ascii_lowercase().starts_with(&prefix)).collect();
    match matches.as_slice() {
        [one] => Ok(one.index),
        [] => Err(format!("no GPU has a UUID starting with '{prefix}'")),
        _ => Err(format!("'{prefix}' matches {} GPUs' UUIDs", matches.len())),
    }
}

/// Which GPUs may be used, from the inherited environment (`env` looks a variable up), the `--gpus` flag and
/// the GPUs excluded after faults (NVML indices).
///
/// The inherited selection is the first of: `CUDA_VISIBLE_DEVICES` (set and empty means none),
/// `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS` (Slurm's global GPU ids, i.e. NVML indices), `NVIDIA_VISIBLE_DEVICES`
/// (`all`, `none`/`void`, or a list); otherwise every GPU. Environment lists follow CUDA's rules: the first
/// entry that does not resolve ends the list (`0,2,-1,1` is 0 and 2) and a warning says so. `--gpus` names
/// NVML indices or UUIDs, must be a subset of the inherited selection, and any bad entry is an error.
pub fn select_gpus(
    all: &[GpuInfo],
    env: &dyn Fn(&str) -> Option<String>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    mig_parent: &dyn Fn(&str) -> Option<u32>,
) -> Result<Selection, SelectError> {
    let mut sel = Selection::default();
    let inherited = ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|var| env(var).map(|v| (var, v)));
    let all_indices = || all.iter().map(|g| g.index).collect::<Vec<u32>>();
    match inherited {
        None => {
            sel.gpus = all_indices();
            sel.source = "all GPUs".into();
        }
        Some((var, value)) => {
            sel.source = format!("{var}={value}");
            let trimmed = value.trim();
            let container_all = var == "NVIDIA_VISIBLE_DEVICES" && trimmed.eq_ignore_ascii_case("all");
            let container_none = var == "NVIDIA_VISIBLE_DEVICES"
                && (trimmed.eq_ignore_ascii_case("none") || trimmed.eq_ignore_ascii_case("void"));
            let entries: Vec<&str> = if trimmed.is_empty() { Vec::new() } else { trimmed.split(',').collect() };
            if container_all {
                sel.gpus = all_indices();
            } else if container_none {
            } else if var == "NVIDIA_VISIBLE_DEVICES"
                && entries.len() == all.len()
                && entries.iter().all(|e| e.trim().bytes().all(|b| b.is_ascii_digit()))
            {
                // The container runtime already exposed exactly these GPUs, and NVML numbers them from 0
                // inside the container: the host indices in the variable mean nothing here.
                sel.gpus = all_indices();
            } else {
                for entry in entries {
                    match resolve(entry, all, mig_parent) {
                        Ok(r) => {
                            sel.by_uuid |= r.by_uuid;
                            if !sel.gpus.contains(&r.index) {
                                sel.gpus.push(r.index);
                                if let Some(mig) = r.mig {
                                    sel.mig.insert(r.index, mig);
                                }
                            }
                        }
                        Err(reason) => {
                            sel.warnings.push(format!(
                                "{var} entry '{}' ignored with every entry after it, as CUDA does: {reason}",
                                entry.trim()
                            ));
                            break;
                        }
                    }
                }
            }
        }
    }
    if let Some(flag) = gpus_flag {
        let bad = |reason: String| SelectError::GpusFlag { value: flag.to_string(), reason };
        let mut chosen = Vec::new();
        let mut by_uuid = false;
        let mut mig = BTreeMap::new();
        for entry in flag.split(',') {
            let r = resolve(entry, all, mig_parent).map_err(bad)?;
            if !sel.gpus.contains(&r.index) {
                return Err(bad(format!("GPU {} is not in the inherited selection ({})", r.index, sel.source)));
            }
            by_uuid |= r.by_uuid;
            if !chosen.contains(&r.index) {
                chosen.push(r.index);
                if let Some(m) = r.mig.or_else(|| sel.mig.get(&r.index).cloned()) {
                    mig.insert(r.index, m);
                }
            }
        }
        sel.gpus = chosen;
        sel.by_uuid |= by_uuid;
        sel.mig = mig;
        sel.source = format!("--gpus {flag} of {}", sel.source);
    }
    sel.gpus.retain(|g| !excluded.contains(g));
    sel.mig.retain(|g, _| !excluded.contains(g));
    Ok(sel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::topology::fixtures::inventory;

    fn select(vars: &[(&str, &str)], flag: Option<&str>, excluded: &[u32]) -> Result<Selection, SelectError> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mig = |m: &str| (m == "MIG-opaque-1").then_some(6);
        select_gpus(&inventory(), &|k| vars.get(k).cloned(), flag, &excluded.iter().copied().collect(), &mig)
    }

    #[test]
    fn selection_from_the_environment() {
        let all = select(&[], None, &[]).unwrap();
        assert_eq!((all.gpus, all.by_uuid), ((0..8).collect(), false));

        let s = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1"), ("SLURM_STEP_GPUS", "0")], None, &[]).unwrap();
        assert_eq!(s.gpus, [5, 2, 7, 1]);
        assert_eq!(s.source, "CUDA_VISIBLE_DEVICES=5,2,7,1");

        // CUDA's rule: an invalid entry ends the list.
        let s = select(&[("CUDA_VISIBLE_DEVICES", "0,2,-1,1")], None, &[]).unwrap();
        assert_eq!(s.gpus, [0, 2]);
        assert_eq!(s.warnings.len(), 1);
        assert!(select(&[("CUDA_VISIBLE_DEVICES", "")], None, &[]).unwrap().gpus.is_empty());

        // UUIDs, unique prefixes (with or without GPU-), MIG devices → their parent GPU.
        let s = select(&[("CUDA_VISIBLE_DEVICES", "GPU-33333333-0000,44444444-0000,MIG-GPU-77777777-0000/1/0,MIG-opaque-1")], None, &[])
            .unwrap();
        assert_eq!(s.gpus, [3, 4, 7, 6]);
        assert!(s.by_uuid);
        assert_eq!(s.mig.get(&7).map(String::as_str), Some("MIG-GPU-77777777-0000/1/0"));
        // An ambiguous prefix resolves nothing.
        assert!(select(&[("CUDA_VISIBLE_DEVICES", "GPU-")], None, &[]).unwrap().gpus.is_empty());

        assert_eq!(select(&[("SLURM_JOB_GPUS", "1,3")], None, &[]).unwrap().gpus, [1, 3]);
        assert_eq!(select(&[("SLURM_STEP_GPUS", "2"), ("SLURM_JOB_GPUS", "1,3")], None, &[]).unwrap().gpus, [2]);
        assert_eq!(select(&[("NVIDIA_VISIBLE_DEVICES", "all")], None, &[]).unwrap().gpus.len(), 8);
        assert!(select(&[("NVIDIA_VISIBLE_DEVICES", "none")], None, &[]).unwrap().gpus.is_empty());
        assert_eq!(select(&[("NVIDIA_VISIBLE_DEVICES", "2,3")], None, &[]).unwrap().gpus, [2, 3]);
        // As many host indices as GPUs in the container: the runtime already did the selecting.
        assert_eq!(
            select(&[("NVIDIA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")], None, &[]).unwrap().gpus,
            (0..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn selection_flag_and_exclusions() {
        let s = select(&[], Some("0,2,4"), &[2]).unwrap();
        assert_eq!(s.gpus, [0, 4]);
        let s = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1")], Some("GPU-22222222"), &[]).unwrap();
        assert_eq!((s.gpus, s.by_uuid), (vec![2], true));
        let e = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1")], Some("0"), &[]).unwrap_err();
        assert!(e.to_string().contains("'--gpus'") && e.to_string().contains("CUDA_VISIBLE_DEVICES=5,2,7,1"), "{e}");
        assert!(select(&[], Some("9"), &[]).unwrap_err().to_string().contains("there is no GPU 9"));
        assert!(select(&[], Some("0,,1"), &[]).is_err());
    }
}
