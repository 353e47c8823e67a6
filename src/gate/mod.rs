//! The health gate: checks of a node that is alive but may be sick, run before every join (the first, each
//! rejoin, after every restart) and by `muster doctor`. Each check runs on a thread of its own, and the gate
//! as a whole is bounded: a check stuck in the kernel (a hung NFS mount, a stuck NVML call) is a failure
//! that says so, and its thread is left to finish on its own while the agent goes on.
//!
//! The checks (`--gate-checks`, default `storage,shm,network`; `all`, or `none` for none):
//! - `storage` (`storage.rs`): the log directory and every `--gate-path` take a probe file (create, write,
//!   fsync, read back, remove) within the limit;
//! - `shm` (`host.rs`): `/dev/shm` holds at least `--gate-shm-min` per local worker (a container's 64 MB
//!   default breaks NCCL and data loaders), and the log directory's file system has room;
//! - `network` (`host.rs`): the interface that carries this node's address is up with a carrier, and every
//!   InfiniBand port the job may use (`NCCL_IB_HCA`, else all) is ACTIVE at the rate of the others;
//! - `gpu` (`gpu.rs`): every GPU answers NVML, with no recovery action asked for, no pending or failed row
//!   remap, no pending page retirement, no volatile double-bit ECC error, no slowing clock reason, all its
//!   NVLinks up, and no other job's compute process; and the node has the GPUs its workers need.
//!
//! A failing gate drains the node before it joins (the agent's side: `agent::ops`); every finding is
//! one line naming the check, what it saw and what would pass.

mod gpu;
mod host;
pub mod link;
mod storage;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One check of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Check {
    Storage,
    Shm,
    Network,
    Gpu,
}

impl Check {
    pub const ALL: [Check; 4] = [Check::Storage, Check::Shm, Check::Network, Check::Gpu];

    pub fn name(self) -> &'static str {
        match self {
            Check::Storage => "storage",
            Check::Shm => "shm",
            Check::Network => "network",
            Check::Gpu => "gpu",
        }
    }

    /// `--gate-checks`: `all`, `none`, or names separated by commas.
    pub fn parse_list(s: &str) -> Result<Vec<Check>, String> {
        let s = s.trim();
        match s {
            "" | "all" => return Ok(Check::ALL.to_vec()),
            "none" => return Ok(Vec::new()),
            _ => {}
        }
        let mut checks = Vec::new();
        for name in s.split(',').map(str::trim) {
            let check = Check::ALL
                .into_iter()
                .find(|c| c.name() == name)
                .ok_or_else(|| format!("unknown check '{name}'; use all, none, or some of storage,shm,network,gpu"))?;
            if !checks.contains(&check) {
                checks.push(check);
            }
        }
        checks.sort();
        Ok(checks)
    }
}

/// What the gate checks and how much it allows.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub checks: Vec<Check>,
    /// The whole gate's bound: past it a check that has not answered fails.
    pub budget: Duration,
    /// The log directory and every `--gate-path`.
    pub paths: Vec<PathBuf>,
    /// `/dev/shm` wanted per local worker.
    pub shm_per_worker: u64,
    /// Free space wanted on the log directory's file system.
    pub min_free: u64,
    /// How many workers this node runs.
    pub workers: u32,
    /// This node's address for the job (`--local-addr`): the interface that carries it is checked.
    pub local_addr: String,
    /// The sysfs tree (`$MUSTER_SYSFS_ROOT`, else /sys): InfiniBand ports and interfaces are read there.
    pub sysfs: PathBuf,
    /// `NCCL_IB_HCA` as the workers will see it.
    pub ib_hca: Option<String>,
    /// GPUs the job excluded (their fault is known): the GPU check skips them.
    pub excluded: BTreeSet<u32>,
    /// How many GPUs the workers are placed on, where they are placed on GPUs.
    pub gpus_needed: Option<u32>,
}

/// `--gate-timeout`'s default, and `muster doctor`'s bound.
pub const DEFAULT_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);
/// `--gate-shm-min`'s default, in MiB per worker.
pub const DEFAULT_SHM_MIB: u32 = 128;
/// Free space the shm check wants on the log directory's file system.
const MIN_FREE: u64 = 100 << 20;

impl GateConfig {
    /// The default gate for `workers` workers at `local_addr`, probing `paths` (the log directory first).
    pub fn new(checks: Vec<Check>, paths: Vec<PathBuf>, workers: u32, local_addr: &str) -> GateConfig {
        GateConfig {
            checks,
            budget: DEFAULT_BUDGET,
            paths,
            shm_per_worker: u64::from(DEFAULT_SHM_MIB) << 20,
            min_free: MIN_FREE,
            workers,
            local_addr: local_addr.to_string(),
            sysfs: crate::gpu::topology::sysfs_root(),
            ib_hca: std::env::var("NCCL_IB_HCA").ok(),
            excluded: BTreeSet::new(),
            gpus_needed: None,
        }
    }
}

/// One check's result: what it saw and, when it failed, what would pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub check: Check,
    pub ok: bool,
    pub saw: String,
    /// What would pass (empty when it passed).
    pub pass: String,
}

impl Finding {
    fn ok(check: Check, saw: impl Into<String>) -> Finding {
        Finding { check, ok: true, saw: saw.into(), pass: String::new() }
    }

    pub fn failed(check: Check, saw: impl Into<String>, pass: impl Into<String>) -> Finding {
        Finding { check, ok: false, saw: saw.into(), pass: pass.into() }
    }

    /// The one line a failed check ends the node with.
    pub fn line(&self) -> String {
        format!("health check '{}' failed: {}; {}", self.check.name(), self.saw, self.pass)
    }
}

/// Every finding of one run of the gate, in check order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub took: Duration,
}

impl Report {
    pub fn failed(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| !f.ok)
    }

    /// `muster doctor`'s table: a line per check.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let state = if f.ok { "ok" } else { "FAILED" };
            let rest = if f.ok { f.saw.clone() } else { format!("{}; {}", f.saw, f.pass) };
            out.push_str(&format!("{:<8}  {:<6}  {rest}\n", f.check.name(), state));
        }
        out
    }
}

/// Runs the configured checks, each on its own thread, within `config.budget` (blocking: call it off the
/// async threads). `nvml`: the GPUs to check, when NVML is there.
pub fn run(config: &GateConfig, nvml: Option<&'static nvml_wrapper::Nvml>) -> Report {
    let start = Instant::now();
    let deadline = start + config.budget;
    let (tx, rx) = mpsc::channel();
    for check in &config.checks {
        let (sender, config, check) = (tx.clone(), config.clone(), *check);
        let spawned = std::thread::Builder::new().name(format!("gate-{}", check.name())).spawn(move || {
            let found = one(check, &config, nvml, deadline);
            let _ = sender.send(found);
        });
        if let Err(e) = spawned {
            let _ = tx.send(Finding::failed(check, format!("cannot start the check: {e}"), "free threads (ulimit -u)"));
        }
    }
    drop(tx);
    let mut findings = Vec::new();
    while findings.len() < config.checks.len() {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(f) => findings.push(f),
            Err(_) => break,
        }
    }
    for check in &config.checks {
        if !findings.iter().any(|f| f.check == *check) {
            findings.push(Finding::failed(
                *check,
                format!("it did not finish within {:?} (a file system or a GPU that does not answer)", config.budget),
                "every check answering within the gate's time",
            ));
        }
    }
    findings.sort_by_key(|f| f.check);
    Report { findings, took: start.elapsed() }
}

fn one(check: Check, config: &GateConfig, nvml: Option<&'static nvml_wrapper::Nvml>, deadline: Instant) -> Finding {
    match check {
        Check::Storage => storage::check(&config.paths, deadline),
        Check::Shm => host::shm(config),
        Check::Network => host::network(config),
        Check::Gpu => gpu::check(nvml, &config.excluded, config.gpus_needed, deadline),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_of_checks_is_all_none_or_names() {
        let table: &[(&str, Result<Vec<Check>, &str>)] = &[
            ("", Ok(Check::ALL.to_vec())),
            ("all", Ok(Check::ALL.to_vec())),
            ("none", Ok(vec![])),
            ("gpu,storage", Ok(vec![Check::Storage, Check::Gpu])),
            (" shm , shm ", Ok(vec![Check::Shm])),
            ("disk", Err("unknown check 'disk'")),
        ];
        for (given, want) in table {
            match (Check::parse_list(given), want) {
                (Ok(got), Ok(want)) => assert_eq!(&got, want, "{given}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{given}: {got}"),
                (got, _) => panic!("{given}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_check_that_does_not_answer_in_time_fails_and_the_gate_returns() {
        // A FIFO where the probe goes: opening it to write blocks until a reader comes, as a write to a file
        // system that stopped answering blocks.
        let dir = tempfile::tempdir().expect("tempdir");
        nix::unistd::mkfifo(&dir.path().join(storage::probe_name()), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let config = GateConfig {
            budget: Duration::from_millis(300),
            ..GateConfig::new(vec![Check::Storage], vec![dir.path().to_path_buf()], 1, "127.0.0.1")
        };
        let report = run(&config, None);
        let failed = report.failed().expect("nothing answers in no time");
        assert!(failed.line().starts_with("health check 'storage' failed: it did not finish within"), "{}", failed.line());
    }
}
