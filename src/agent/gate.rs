//! What happens when the health gate fails (`crate::gate`): before a join (the first, each rejoin, after
//! every restart) a node that fails a check drains before it joins. It leaves the rendezvous (the others
//! re-form without it at once, as for a drain), records the incident for `--exclude-after`, runs the
//! `--on-node-fault` hook with the check's name in `MUSTER_FAULT_KIND`, and ends with the check's line
//! (exit 75).

use std::collections::BTreeSet;

use super::ops::Work;
use super::AgentError;
use crate::gate::Check;

impl Work {
    /// Runs the gate for a node of `nproc` workers, the `excluded` GPUs left out; Err when a check failed
    /// (the node has left and the hook has run).
    pub(super) async fn health_gate(&mut self, nproc: u32, excluded: BTreeSet<u32>) -> Result<(), AgentError> {
        if self.cfg.health.is_off() {
            return Ok(());
        }
        self.links_since().await?;
        let logs = self.logs.run_dir().map(|d| d.to_path_buf());
        let needed = self.gpu_job.then_some(nproc);
        let gate = self.cfg.health.gate(logs, nproc, &self.cfg.local_addr, excluded, needed);
        let nvml = self.gpus.as_ref().map(|g| g.nvml);
        let report = tokio::task::spawn_blocking(move || crate::gate::run(&gate, nvml))
            .await
            .map_err(|e| AgentError::Internal(format!("health gate task: {e}")))?;
        let Some(failed) = report.failed() else {
            tracing::debug!(ms = report.took.as_millis() as u64, "health gate passed");
            return Ok(());
        };
        Err(self.drain_unhealthy(failed.check.name(), failed.line()).await)
    }

    /// A node found sick (its gate; a link that dropped under `--on-link-drop drain`; a straggler under
    /// `--on-straggler drain`) leaves the rendezvous (`leave_draining`), records the incident, runs the hook
    /// with `kind` (the check's name, or `straggler`); the error it ends with.
    pub(super) async fn drain_unhealthy(&mut self, kind: &str, line: String) -> AgentError {
        self.rendezvous.record_drain(Some(kind)).await;
        self.leave_draining().await;
        if let Some(cmd) = &self.cfg.on_node_fault {
            let env: Vec<(String, String)> = [
                ("MUSTER_FAULT_KIND", kind.to_string()),
                ("MUSTER_FAULT_DETAIL", line.clone()),
                ("MUSTER_FAULT_HOSTNAME", crate::host::hostname()),
                ("MUSTER_RUN_ID", self.cfg.run_id.clone()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            let _ = crate::supervisor::hook::run_hook(cmd, &env, super::ops::HOOK_TIMEOUT, &self.guard).await;
        }
        AgentError::Unhealthy(line)
    }

    /// At a gate: what dropped since the last look (`agent/links.rs`), said; Err when it drains the node.
    async fn links_since(&mut self) -> Result<(), AgentError> {
        let Some(watch) = self.links.as_mut() else { return Ok(()) };
        let found = watch.look().await;
        match watch.judge(found, "since the workers last ran") {
            Some(line) => Err(self.drain_unhealthy(Check::Network.name(), line).await),
            None => Ok(()),
        }
    }
}
