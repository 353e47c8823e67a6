//! `--gate-checks`, `--gate-path`, `--gate-timeout`, `--gate-shm-min`: the health gate's settings
//! (`crate::gate`), checked once.

use std::path::PathBuf;
use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;
use crate::gate::{Check, GateConfig};

/// Free space the shm check wants on the log directory's file system.
const MIN_FREE: u64 = 100 << 20;

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
        for path in &cli.gate_path {
            if !path.is_dir() {
                return Err(bad(format!("--gate-path {}: not a directory; name a directory the job writes to", path.display())));
            }
        }
        Ok(Health {
            checks,
            budget: Duration::from_secs_f64(cli.gate_timeout),
            paths: cli.gate_path.clone(),
            shm_per_worker: u64::from(cli.gate_shm_min) << 20,
            sysfs: crate::gpu::topology::sysfs_root(),
            ib_hca: std::env::var("NCCL_IB_HCA").ok(),
        })
    }

    /// The gate for a node of `workers` workers at `local_addr`, whose logs go to `logs` (if anywhere).
    pub fn gate(&self, logs: Option<PathBuf>, workers: u32, local_addr: &str) -> GateConfig {
        GateConfig {
            checks: self.checks.clone(),
            budget: self.budget,
            paths: logs.into_iter().chain(self.paths.iter().cloned()).collect(),
            shm_per_worker: self.shm_per_worker,
            min_free: MIN_FREE,
            workers,
            local_addr: local_addr.to_string(),
            sysfs: self.sysfs.clone(),
            ib_hca: self.ib_hca.clone(),
        }
    }
}
