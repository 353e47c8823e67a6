//! A joiner's workers start before it asks to join a job whose workers re-form in place: they run the
//! script up to `muster_inplace.run` (imports, the model, a checkpoint's load) while the others train on,
//! then take their ranks in the same re-formation as the others' kept workers (`start.rs` hands them over
//! alike). Growing the job costs the running ranks one re-formation, not the joiner's cold start.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::ops::Work;
use crate::rendezvous::RoundInfo;
use crate::supervisor::WorkerGroup;

/// What a worker can be told of its place before the join: a world of this node alone.
fn alone(nproc: u32) -> RoundInfo {
    RoundInfo { round: 0, group_rank: 0, group_world_size: 1, base_global_rank: 0, world_size: nproc, neighbours: Vec::new() }
}

impl Work {
    /// Before a join, when this agent runs no workers, keeps workers in place, and the job's workers re-form
    /// in place: starts the group with provisional variables (a world of this node alone, no workers'
    /// store) and `MUSTER_INPLACE_JOINING=1`, and waits, within `--in-place-timeout`, for each worker to
    /// reach the API. Those that do not are stopped (they start cold with the round's variables); whatever
    /// fails here leaves the start to be made after the join, as without it.
    pub(super) async fn prestart(&mut self, nproc: u32, excluded: BTreeSet<u32>, restart_count: u32) {
        if self.group.is_some() || !self.in_place.on() {
            return;
        }
        match self.rendezvous.job_in_place().await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::debug!("cannot tell whether the job re-forms in place ({e}); the workers start after the join");
                return;
            }
        }
        // An error here is met again, and reported, by the start after the join.
        let Ok(prepared) = self.prepare(nproc, excluded, restart_count).await else { return };
        let mut spec = self.spec(&prepared, nproc, &alone(nproc), (String::new(), 0), restart_count);
        spec.extra_env.extend(self.in_place.joining_env());
        let cfg = &self.cfg;
        let started = WorkerGroup::start(
            &spec,
            &cfg.entrypoint,
            &prepared.attempt,
            self.logs.config(),
            &self.hostname,
            self.guard.clone(),
            &mut self.spares,
        );
        let mut group = match started {
            Ok(group) => group,
            Err(e) => {
                tracing::warn!("cannot start the workers before the join ({e}); they start after it");
                return;
            }
        };
        tracing::info!("the job's workers re-form in place: starting {nproc} worker(s) before joining it");
        let deadline = Instant::now() + self.in_place.timeout();
        loop {
            let running = group.running_workers();
            tokio::select! {
                () = self.in_place.hellos(&running, deadline) => break,
                () = group.next_exit() => {}
            }
        }
        let keep = self.in_place.keepable(&group);
        if keep.len() < nproc as usize {
            tracing::info!("{} of {nproc} worker(s) reached muster_inplace.run in time; the others start after the join", keep.len());
        }
        let _ = group.stop(Signal::SIGKILL, self.cfg.shutdown_timeout, "a start before the join", &keep).await;
        if !keep.is_empty() {
            self.in_place.keep_progress(prepared.attempt.progress().map(|hooks| hooks.progress.clone()));
            self.group = Some(group);
        } else if let Err(e) = self.rendezvous.forget_in_place().await {
            tracing::debug!("cannot forget the job's in-place mark: {e}");
        }
    }
}
