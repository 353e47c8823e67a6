//! Processes attached to fake GPUs, found the way CUDA would bind them: a live process whose environment
//! names a GPU as `CUDA_VISIBLE_DEVICES.split(',')[LOCAL_RANK]`.
//!
//! The environment read is the one the process was started with (`/proc/<pid>/environ`), which is what a
//! launcher sets for its workers. Warm spares (`MUSTER_WARM_SPARE=1`) have no CUDA context yet and zombies
//! no longer hold one, so neither is attached. Only descendants of the process that loaded the fake count.

use std::collections::HashMap;
use std::path::Path;

/// The GPU (NVML index) a process with this environment (`/proc/<pid>/environ`: NUL-separated
/// `KEY=VALUE`) would use, given the GPUs' UUIDs in NVML index order.
pub fn gpu_of_environ(environ: &[u8], uuids: &[String]) -> Option<usize> {
    let mut visible = None;
    let mut local_rank = None;
    for var in environ.split(|b| *b == 0) {
        let var = std::str::from_utf8(var).ok()?;
        if let Some(v) = var.strip_prefix("CUDA_VISIBLE_DEVICES=") {
            visible = Some(v);
        } else if let Some(v) = var.strip_prefix("LOCAL_RANK=") {
            local_rank = v.trim().parse::<usize>().ok();
        } else if var == "MUSTER_WARM_SPARE=1" {
            return None;
        }
    }
    let (visible, rank) = (visible?, local_rank?);
    // CUDA's rule: the first entry that names no GPU ends the list (`0,2,-1,1` is 0 and 2).
    let devices: Vec<usize> = visible.split(',').map_while(|e| resolve(e, uuids)).collect();
    devices.get(rank).copied()
}

/// One `CUDA_VISIBLE_DEVICES` entry: an index, a UUID, or a unique UUID prefix (with or without `GPU-`).
fn resolve(entry: &str, uuids: &[String]) -> Option<usize> {
    let entry = entry.trim();
    if entry.is_empty() {
        return None;
    }
    if entry.bytes().all(|b| b.is_ascii_digit()) {
        return entry.parse::<usize>().ok().filter(|i| *i < uuids.len());
    }
    let prefix = if entry.starts_with("GPU-") { entry.to_ascii_lowercase() } else { format!("gpu-{}", entry.to_ascii_lowercase()) };
    let mut matches = uuids.iter().enumerate().filter(|(_, u)| u.to_ascii_lowercase().starts_with(&prefix));
    match (matches.next(), matches.next()) {
        (Some((i, _)), None) => Some(i),
        _ => None,
    }
}

/// (parent pid, state) from `/proc/<pid>/stat`.
fn stat(proc_dir: &Path) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    // The command name is in parentheses and may itself hold ')': the fields follow the last one.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((fields.next()?.parse().ok()?, state))
}

/// Every live process attached to some GPU: (pid, GPU index), by pid.
///
/// Only descendants of this process (the program that loaded the fake, e.g. an agent, whose workers are its
/// children) count: each fake machine sees its own workers, never those of another test running next to it.
pub fn attached(uuids: &[String]) -> Vec<(u32, usize)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let table: HashMap<u32, (u32, char)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, stat(&e.path())?)))
        .collect();
    let me = std::process::id();
    let descends = |mut pid: u32| {
        // Bounded: a parent chain cannot be longer than the table (pid reuse cannot make it loop forever).
        for _ in 0..table.len() {
            match table.get(&pid) {
                Some((parent, _)) if *parent == me => return true,
                Some((parent, _)) if *parent > 1 => pid = *parent,
                _ => return false,
            }
        }
        false
    };
    let mut out: Vec<(u32, usize)> = table
        .iter()
        // Zombies and dead processes hold no CUDA context any more.
        .filter(|(pid, (_, state))| !matches!(state, 'Z' | 'X' | 'x') && descends(**pid))
        .filter_map(|(pid, _)| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            Some((*pid, gpu_of_environ(&environ, uuids)?))
        })
        .collect();
    out.sort_unstable();
    out
}

/// SIGKILLs every process attached to `gpu`; returns their pids.
pub fn kill_attached(uuids: &[String], gpu: usize) -> Vec<u32> {
    let pids: Vec<u32> = attached(uuids).into_iter().filter(|(_, g)| *g == gpu).map(|(p, _)| p).collect();
    for &pid in &pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: kill(2) takes plain integers; a pid that exited meanwhile only yields ESRCH.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        (0..4).map(|i| format!("GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-0000-0000-000000000000")).collect()
    }

    fn env(vars: &[&str]) -> Vec<u8> {
        vars.join("\0").into_bytes()
    }

    #[test]
    fn the_gpu_is_the_local_ranks_entry() {
        let u = uuids();
        let cases: &[(&[&str], Option<usize>)] = &[
            (&["CUDA_VISIBLE_DEVICES=2,3", "LOCAL_RANK=1"], Some(3)),
            (&["LOCAL_RANK=0", "CUDA_VISIBLE_DEVICES=1"], Some(1)),
            (&["CUDA_VISIBLE_DEVICES=GPU-22222222-0000-0000-0000-000000000000,0", "LOCAL_RANK=0"], Some(2)),
            (&["CUDA_VISIBLE_DEVICES=GPU-3333,0", "LOCAL_RANK=0"], Some(3)),
            (&["CUDA_VISIBLE_DEVICES=11111111-0000,0", "LOCAL_RANK=0"], Some(1)),
            // An ambiguous prefix, an index past the GPUs and -1 end the list, as in CUDA.
            (&["CUDA_VISIBLE_DEVICES=GPU-,0", "LOCAL_RANK=0"], None),
            (&["CUDA_VISIBLE_DEVICES=0,9,1", "LOCAL_RANK=1"], None),
            (&["CUDA_VISIBLE_DEVICES=0,2,-1,1", "LOCAL_RANK=3"], None),
            (&["CUDA_VISIBLE_DEVICES=0,2,-1,1", "LOCAL_RANK=1"], Some(2)),
            (&["CUDA_VISIBLE_DEVICES=", "LOCAL_RANK=0"], None),
            (&["CUDA_VISIBLE_DEVICES=0,1"], None),
            (&["LOCAL_RANK=0"], None),
            (&["CUDA_VISIBLE_DEVICES=0,1", "LOCAL_RANK=1", "MUSTER_WARM_SPARE=1"], None),
            (&["CUDA_VISIBLE_DEVICES=0,1", "LOCAL_RANK=1", "MUSTER_WARM_SPARE=0"], Some(1)),
        ];
        for (vars, want) in cases {
            assert_eq!(gpu_of_environ(&env(vars), &u), *want, "{vars:?}");
        }
    }

    #[test]
    fn this_process_is_never_attached() {
        assert!(attached(&uuids()).iter().all(|(p, _)| *p != std::process::id()));
    }
}
