//! The agent's start-up lines: what it runs with, and the settings that deserve a warning.

use std::time::Duration;

use crate::config::LaunchConfig;
use crate::rendezvous::Rendezvous;
use crate::store::RdzvStore;
use crate::supervisor::logs::RunLogs;

/// A keep-alive window below this is said at start: a few lost packets in a row (TCP's retransmission
/// back-off) could outlast it.
const SHORT_WINDOW: Duration = Duration::from_secs(10);

pub(super) fn banner(cfg: &LaunchConfig, rendezvous: &Rendezvous<RdzvStore>, hosted: bool, logs: &RunLogs) {
    tracing::info!(
        "muster {}: nnodes={}:{} nproc_per_node={} rdzv_backend={} rdzv_store={}{} run_id={} max_restarts={} \
         log_dir={} entrypoint={}",
        env!("CARGO_PKG_VERSION"),
        cfg.min_nodes,
        cfg.max_nodes,
        cfg.nproc_per_node,
        cfg.rdzv_backend,
        rendezvous.store().describe(),
        if hosted { " (hosted here)" } else { "" },
        cfg.run_id,
        cfg.max_restarts,
        logs.run_dir().map(|d| d.display().to_string()).unwrap_or_else(|| "/dev/null".into()),
        cfg.entrypoint.name,
    );
    if let Some(context) = &cfg.context {
        tracing::info!("launch context {context}");
    }
    let window = rendezvous.timing().window;
    if cfg.max_nodes > 1 && window < SHORT_WINDOW {
        tracing::warn!(
            "the keep-alive window (keep_alive_interval x keep_alive_max_attempt = {window:?}) is under \
             {SHORT_WINDOW:?}: TCP retransmits a lost packet after 0.2 s, then 0.4, 0.8, 1.6 s..., so a few losses in a \
             row can get a healthy node evicted (it fences itself first); keep it at 10 s or more outside tests"
        );
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() && cfg.nproc_per_node > 1 {
        tracing::warn!(
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your \
             system being overloaded, please further tune the variable for optimal performance in your \
             application as needed."
        );
    }
}
