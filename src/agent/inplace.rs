//! The agent's side of re-forming in place (`crate::inplace`): which workers a stop keeps, handing each
//! kept worker its new variables, and the bound on their confirmation. A kept worker that does not say it
//! re-formed within `--in-place-timeout` is killed; its death then restarts it as any worker's would (never
//! worse than a cold restart).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::AgentError;
use crate::config::LaunchConfig;
use crate::hang::progress::{Hooks, Progress};
use crate::inplace::{wire::Reform, ApiDir, Channel};
use crate::supervisor::keep::Kept;
use crate::supervisor::WorkerGroup;

pub(super) struct InPlace {
    /// None with `--in-place off` (or under hang detection): the API is importable, nothing is kept.
    channel: Option<Channel>,
    api: ApiDir,
    timeout: Duration,
    /// The kept workers handed a round and not yet confirmed.
    confirm: Option<Confirm>,
    /// The job's mark that its workers re-form in place, written once a worker says hello.
    marking: tokio::task::JoinSet<()>,
    /// Under hang detection: the progress of the start whose workers are kept, which the next start follows.
    kept_progress: Option<Arc<Progress>>,
}

/// What the wait on the kept workers came to.
pub(super) enum Due {
    /// Every kept worker re-formed.
    Reformed,
    /// These did not in time: to be killed.
    Overdue(Vec<i32>),
}

#[derive(Clone)]
struct Confirm {
    pids: Vec<i32>,
    round: u64,
    deadline: Instant,
    /// The deadline was moved once for the workers that took the round up and wait on their peers.
    extended: bool,
}

impl InPlace {
    /// The API's directory, and the channel when `--in-place on`.
    pub(super) fn open(cfg: &LaunchConfig) -> Result<InPlace, AgentError> {
        let api = ApiDir::write()?;
        let timeout = cfg.in_place.map_or(Duration::ZERO, |c| c.timeout);
        let channel = cfg.in_place.map(|_| Channel::open()).transpose()?;
        Ok(InPlace { channel, api, timeout, confirm: None, marking: tokio::task::JoinSet::new(), kept_progress: None })
    }

    /// Under hang detection, a stop or a start before the join that keeps workers: their progress table,
    /// which the next start follows (`follow`).
    pub(super) fn keep_progress(&mut self, progress: Option<Arc<Progress>>) {
        self.kept_progress = progress;
    }

    /// The progress hooks of a start that takes up the kept workers of local ranks `kept`: their marks and
    /// progress files come to the new table (`Progress::succeed`), so that a kept rank that stops is named
    /// as any other. `hooks` unchanged when nothing was kept.
    pub(super) fn follow(&mut self, hooks: &Hooks, kept: &[u32]) -> Hooks {
        match self.kept_progress.take() {
            Some(old) => Hooks { progress: old.succeed(kept, hooks.files.clone()), ..hooks.clone() },
            None => hooks.clone(),
        }
    }

    /// Once one of this node's workers says hello, marks the job as one whose workers re-form in place
    /// (`mark`, bounded): a joiner then starts its workers before it asks to join (`super::prestart`).
    pub(super) fn mark_when_used<F>(&mut self, mark: F, bound: Duration)
    where
        F: std::future::Future<Output = Result<(), crate::rendezvous::RdzvError>> + Send + 'static,
    {
        let Some(channel) = &self.channel else { return };
        let hello = channel.first_hello();
        self.marking.spawn(async move {
            hello.await;
            match tokio::time::timeout(bound, mark).await {
                Ok(Ok(())) => tracing::debug!("the job is marked as re-forming in place"),
                Ok(Err(e)) => tracing::info!("cannot mark the job as re-forming in place ({e}); a joiner's workers start after its join"),
                Err(_) => tracing::info!("cannot mark the job as re-forming in place within {bound:?}; a joiner's workers start after its join"),
            }
        });
    }

    /// `--in-place-timeout`.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What a worker started before its node joined gets on top of `env`.
    pub(super) fn joining_env(&self) -> Vec<(String, String)> {
        vec![(crate::inplace::JOINING_VAR.to_string(), "1".to_string())]
    }

    /// Waits until each of `workers` (local rank, pid) said hello, or `deadline`.
    pub(super) async fn hellos(&self, workers: &[(u32, i32)], deadline: Instant) {
        if let Some(channel) = &self.channel {
            channel.hellos(workers, deadline).await;
        }
    }

    /// Whether workers can be kept.
    pub(super) fn on(&self) -> bool {
        self.channel.is_some()
    }

    /// What every worker's environment gets: the API on PYTHONPATH, and the channel when on.
    pub(super) fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![("PYTHONPATH".to_string(), self.api.python_path(std::env::var("PYTHONPATH").ok().as_deref()))];
        if let Some(channel) = &self.channel {
            env.extend(channel.worker_env(self.timeout));
        }
        env
    }

    /// The running workers of `group` that can be kept: they use the API and are connected.
    pub(super) fn keepable(&self, group: &WorkerGroup) -> HashSet<i32> {
        self.channel.as_ref().map(|c| c.keepable(&group.running_workers())).unwrap_or_default()
    }

    /// Hands each kept worker its part of `round`; the confirmation is due within the timeout.
    pub(super) fn hand_over(&mut self, kept: &[Kept], round: u64) {
        let Some(channel) = &self.channel else { return };
        for k in kept {
            let reform = Reform { round, env: k.env.iter().cloned().collect(), evicted: Vec::new() };
            if !channel.assign(k.pid, &reform) {
                tracing::warn!(pid = k.pid, "worker {} left the in-place channel; it is stopped at the timeout", k.local_rank);
            }
        }
        let pids: Vec<i32> = kept.iter().map(|k| k.pid).collect();
        let deadline = Instant::now() + self.timeout;
        self.confirm = (!pids.is_empty()).then_some(Confirm { pids, round, deadline, extended: false });
    }

    /// Cancel-safe: the end of the re-formation (every kept worker confirmed), or the kept workers that did
    /// not confirm in time (to be killed); pending while there is nothing left to confirm. At the timeout,
    /// a worker that never took its round up is stuck; one that did waits on a peer (the stuck one, maybe,
    /// which the kill replaces) and gets the timeout once more.
    pub(super) async fn overdue(&mut self) -> Due {
        loop {
            let (Some(c), Some(channel)) = (self.confirm.clone(), &self.channel) else { return std::future::pending().await };
            let missing = channel.unconfirmed(&c.pids, c.round, c.deadline).await;
            self.confirm = None;
            if missing.is_empty() {
                tracing::info!(round = c.round, "{} worker(s) re-formed in place", c.pids.len());
                return Due::Reformed;
            }
            let (waiting, stuck): (Vec<i32>, Vec<i32>) = missing.iter().partition(|p| channel.taken(**p, c.round));
            let overdue = if c.extended || waiting.is_empty() {
                missing
            } else {
                self.confirm = Some(Confirm { pids: waiting, deadline: Instant::now() + self.timeout, extended: true, ..c });
                stuck
            };
            if overdue.is_empty() {
                continue;
            }
            let pids = overdue.iter().map(i32::to_string).collect::<Vec<_>>().join(", ");
            tracing::warn!(
                round = c.round,
                "worker process(es) {pids} did not re-form in place within --in-place-timeout ({:?}); stopping them (each starts again cold)",
                self.timeout
            );
            return Due::Overdue(overdue);
        }
    }
}
