//! `--gate-checks`, `--gate-path`, `--gate-timeout`, `--gate-shm-min`, `--on-link-drop`: the health gate's
//! settings (`crate::gate`), checked once.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;
use crate::gate::{Check, GateConfig};

/// The gate as the command line set it, built once: each join's gate is this with the node's own parts.
#[derive(Debug, Clone)]
pub struct Health {
    base: GateConfig,
    pub on_link_drop: OnLinkDrop,
}

/// `--on-link-drop`: what a link that drops while the workers run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLinkDrop {
    /// Said once per drop; training goes on.
    Report,
    /// The node drains as for a failed health check.
    Drain,
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
        let base = GateConfig {
            budget,
            shm_per_worker: u64::from(cli.gate_shm_min) << 20,
            ..GateConfig::new(checks, cli.gate_path.clone(), 0, "")
        };
        let on_link_drop = match cli.on_link_drop.as_str() {
            "report" => OnLinkDrop::Report,
            "drain" => OnLinkDrop::Drain,
            other => return Err(bad(format!("invalid value '{other}' for '--on-link-drop': use report or drain"))),
        };
        Ok(Health { base, on_link_drop })
    }

    /// The links watched between gates (`crate::gate::link`), while the `network` check is on.
    pub fn links(&self, local_addr: &str) -> Option<crate::gate::link::Links> {
        self.base.checks.contains(&Check::Network).then(|| crate::gate::link::Links {
            local_addr: local_addr.to_string(),
            sysfs: self.base.sysfs.clone(),
            ib_hca: self.base.ib_hca.clone(),
        })
    }

    /// Whether any check is asked for.
    pub fn is_off(&self) -> bool {
        self.base.checks.is_empty()
    }

    /// The gate for a node of `workers` workers at `local_addr`, whose logs go to `logs` (if anywhere), probed
    /// before the `--gate-path`s; `excluded`: the GPUs the job no longer uses; `gpus_needed`: where the workers
    /// are placed on GPUs.
    pub fn gate(&self, logs: Option<PathBuf>, workers: u32, local_addr: &str, excluded: BTreeSet<u32>, gpus_needed: Option<u32>) -> GateConfig {
        let paths = logs.into_iter().chain(self.base.paths.iter().cloned()).collect();
        GateConfig { paths, workers, local_addr: local_addr.to_string(), excluded, gpus_needed, ..self.base.clone() }
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
