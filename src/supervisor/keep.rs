//! In place: a group that outlives a re-formation. A stop that keeps workers (`WorkerGroup::stop` with a
//! `keep` set) ends only the others and closes the incident; the next start fills the local ranks no kept
//! worker holds, into the same group, and returns what each kept worker must be told (its new variables),
//! which the agent hands over on the in-place channel (`crate::inplace`). Kept workers keep their output
//! files, their file timer and their progress files from the start that spawned them.

use std::collections::HashSet;

use super::env::{self, GroupSpec, PER_START};
use super::logs::AttemptLogs;
use super::spare::WarmSpares;
use super::{StartContext, SupervisorError, WorkerGroup};
use crate::config::Entrypoint;

/// A worker kept in place, with the variables of the start it now belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub local_rank: u32,
    pub pid: i32,
    /// Every contract variable that changes from one start to the next ([`PER_START`]).
    pub env: Vec<(String, String)>,
}

impl WorkerGroup {
    /// The running workers: (local rank, pid).
    pub fn running_workers(&self) -> Vec<(u32, i32)> {
        self.workers.iter().filter(|w| w.running).map(|w| (w.local_rank, w.pid)).collect()
    }

    /// A partial stop is over: its failures were returned, the group goes on as if just started.
    pub(super) fn close_incident(&mut self) {
        self.failed.clear();
        self.reported = 0;
        self.stopping_for = None;
        self.stop_deadline = None;
    }

    /// Starts, into this group, each local rank of `spec` that no running worker holds (from a warm spare
    /// where one fits); the running workers take their new global ranks and error files. Returns what
    /// each running worker must be handed. Main thread only, as `start`.
    pub fn start_missing(
        &mut self,
        spec: &GroupSpec,
        entry: &Entrypoint,
        attempt: &AttemptLogs,
        log_config: &crate::config::LogConfig,
        hostname: &str,
        spares: &mut WarmSpares,
    ) -> Result<Vec<Kept>, SupervisorError> {
        // Deaths since the stop count now: their ranks start again below, their failures are reported.
        while let Ok(exit) = self.exits.try_recv() {
            self.record(Some(exit));
        }
        let parent_env = |k: &str| std::env::var(k).ok();
        let mut kept = Vec::new();
        for w in self.workers.iter_mut().filter(|w| w.running) {
            let error_file = attempt.error_file(w.local_rank);
            let full = env::worker_env(spec, w.local_rank, error_file.as_deref(), &parent_env).map_err(SupervisorError::Env)?;
            let env = full.into_iter().filter(|(k, _)| PER_START.contains(&k.as_str())).collect();
            w.global_rank = spec.global_rank(w.local_rank);
            w.error_file = error_file;
            kept.push(Kept { local_rank: w.local_rank, pid: w.pid, env });
        }
        let held: HashSet<u32> = kept.iter().map(|k| k.local_rank).collect();
        let tx = self.exit_tx.clone();
        let ctx = StartContext { spec, entry, attempt, log_config, hostname, timer_file: None, exits: &tx };
        let mut warm = 0;
        for local_rank in (0..spec.local_world_size).filter(|r| !held.contains(r)) {
            warm += usize::from(self.start_worker(&ctx, local_rank, spares)?);
        }
        spares.clear();
        self.spares_due = spares.delay().map(|d| tokio::time::Instant::now() + d);
        let started = spec.local_world_size as usize - kept.len();
        tracing::info!(kept = kept.len(), started, warm, "re-forming in place: {} worker(s) kept, {started} started", kept.len());
        Ok(kept)
    }

    /// Cancel-safe: waits for the next worker's exit and records it (a worker started before its node
    /// joined, gone before it reached the API).
    pub async fn next_exit(&mut self) {
        let exit = self.exits.recv().await;
        self.record(exit);
    }

    /// Kills the running workers among `pids` (kept in place, they did not re-form in time); their deaths
    /// come through `watch` as any worker's.
    pub fn kill(&self, pids: &[i32]) {
        for w in self.workers.iter().filter(|w| w.running && pids.contains(&w.pid)) {
            tracing::info!("sending process {} SIGKILL (local_rank {})", w.pid, w.local_rank);
            let _ = super::children::signal_group(w.pid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// The commands of the running workers, for their warm spares.
    pub(super) fn live_commands(&self) -> Vec<super::spare::WorkerCommand> {
        self.workers.iter().zip(&self.commands).filter(|(w, _)| w.running).map(|(_, c)| c.clone()).collect()
    }
}
