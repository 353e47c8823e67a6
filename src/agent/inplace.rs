//! The agent's side of re-forming in place (`crate::inplace`): which workers a stop keeps, handing each
//! kept worker its new variables, and the bound on their confirmation. A kept worker that does not say it
//! re-formed within `--in-place-timeout` is killed; its death then restarts it as any worker's would (never
//! worse than a cold restart).

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::AgentError;
use crate::config::LaunchConfig;
use crate::inplace::{wire::Reform, Channel};
use crate::supervisor::keep::Kept;
use crate::supervisor::WorkerGroup;

pub(super) struct InPlace {
    channel: Channel,
    timeout: Duration,
    /// The kept workers handed a round and not yet confirmed: (pids, round, deadline).
    confirm: Option<(Vec<i32>, u64, Instant)>,
}

impl InPlace {
    /// The channel when `--in-place on`. Off under hang detection for now: a kept worker's progress goes to
    /// the files of the start that spawned it, which the monitor of the next start does not read.
    pub(super) fn open(cfg: &LaunchConfig) -> Result<Option<InPlace>, AgentError> {
        let Some(in_place) = cfg.in_place else { return Ok(None) };
        if cfg.hang.is_some() {
            tracing::info!("--hang-timeout is set: every re-formation restarts every worker (--in-place needs it unset)");
            return Ok(None);
        }
        let channel = Channel::open()?;
        Ok(Some(InPlace { channel, timeout: in_place.timeout, confirm: None }))
    }

    /// What every worker's environment gets.
    pub(super) fn env(&self) -> Vec<(String, String)> {
        self.channel.worker_env(self.timeout, std::env::var("PYTHONPATH").ok().as_deref())
    }

    /// The running workers of `group` that can be kept: they use the API and are connected.
    pub(super) fn keepable(&self, group: &WorkerGroup) -> HashSet<i32> {
        self.channel.keepable(&group.running_workers())
    }

    /// Hands each kept worker its part of `round`; the confirmation is due within the timeout.
    pub(super) fn hand_over(&mut self, kept: &[Kept], round: u64) {
        for k in kept {
            let reform = Reform { round, env: k.env.iter().cloned().collect(), evicted: Vec::new() };
            if !self.channel.assign(k.pid, &reform) {
                tracing::warn!(pid = k.pid, "worker {} left the in-place channel; it is stopped at the timeout", k.local_rank);
            }
        }
        let pids: Vec<i32> = kept.iter().map(|k| k.pid).collect();
        self.confirm = (!pids.is_empty()).then(|| (pids, round, Instant::now() + self.timeout));
    }

    /// Cancel-safe: the kept workers that did not confirm in time (to be killed); pending while there is
    /// nothing left to confirm.
    pub(super) async fn overdue(&mut self) -> Vec<i32> {
        loop {
            let Some((pids, round, deadline)) = self.confirm.clone() else { return std::future::pending().await };
            let missing = self.channel.unconfirmed(&pids, round, deadline).await;
            self.confirm = None;
            if missing.is_empty() {
                tracing::info!(round, "{} worker(s) re-formed in place", pids.len());
                continue;
            }
            let pids = missing.iter().map(i32::to_string).collect::<Vec<_>>().join(", ");
            tracing::warn!(
                round,
                "worker process(es) {pids} did not re-form in place within --in-place-timeout ({:?}); stopping them (each starts again cold)",
                self.timeout
            );
            return missing;
        }
    }
}
