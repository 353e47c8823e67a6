//! `--gate-checks`, `--gate-path`, `--gate-timeout`, `--gate-shm-min`: the health gate's settings
//! (`crate::gate`), checked once.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;
use crate::gate::{Check, GateConfig};

#[derive(Debug, Clone)]
pub struct Health {
    pub checks: Vec<Check>,
    pub budget: Duration,
    pub paths: Vec<PathBuf>,
    pub shm_per_worker: u64,
    pub sysfs: PathBuf,
    /// `NCCL_IB_HCA` as the workers inherit it.
    pub ib_hca: Option<String>,
}

impl Health {
    pub(super) fn from_cli(cli: &Cli) -> Result<Health, ConfigError> {
        let checks = Check::parse_list(&cli.gate_checks)
            .map_err(|e| bad(format!("invalid value '{}' for '--gate-checks': {e}", cli.gate_checks)))?;
        let budget = Duration::from_secs_f64(cli.gate_timeout);
        for path in &cli.gate_path {
            if not_a_directory(path, budget) {
                return Err(bad(format!("--gate-path {}: not a directory; name a directory the job writes to", path.display())));
            }
        }
        Ok(Health {
            checks,
            budget,
            paths: cli.gate_path.clone(),
            shm_per_worker: u64::from(cli.gate_shm_min) << 20,
            sysfs: crate::gpu::topology::sysfs_root(),
            ib_hca: std::env::var("NCCL_IB_HCA").ok(),
        })
    }

    /// The gate for a node of `workers` workers at `local_addr`, whose logs go to `logs` (if anywhere);
    /// `excluded`: the GPUs the job no longer uses; `gpus_needed`: where the workers are placed on GPUs.
    pub fn gate(&self, logs: Option<PathBuf>, workers: u32, local_addr: &str, excluded: BTreeSet<u32>, gpus_needed: Option<u32>) -> GateConfig {
        let paths = logs.into_iter().chain(self.paths.iter().cloned()).collect();
        GateConfig {
            budget: self.budget,
            shm_per_worker: self.shm_per_worker,
            sysfs: self.sysfs.clone(),
            ib_hca: self.ib_hca.clone(),
            excluded,
            gpus_needed,
            ..GateConfig::new(self.checks.clone(), paths, workers, local_addr)
        }
    }
}

/// Whether `path` is surely not a directory. Asked on a thread of its own within `budget`: a stat on a file
/// system that stopped answering (a FUSE daemon stopped, an NFS server cut off) blocks in the kernel, and
/// such a path is a sick node for the gate to report (exit 75), not a wrong flag.
fn not_a_directory(path: &std::path::Path, budget: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let asked = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("gate-path".into()).spawn(move || {
        let _ = tx.send(asked.is_dir());
    });
    match spawned {
        Ok(_) => matches!(rx.recv_timeout(budget), Ok(false)),
        Err(_) => !path.is_dir(),
    }
}
