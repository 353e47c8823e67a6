//! What etcd's lease expiry does, done by the agents: a session object not renewed for its duration is
//! deleted, and the session keys that name it with it (a joiner killed while it waited, a seal lock's
//! holder). The ring's members are evicted by their neighbours as on every store; this is for the rest.
//!
//! No clock is trusted with the verdict. A sweep lists the job's session objects and suspects each whose
//! renewal, by the holder's clock, is older than its duration by this one's; a suspect is then watched from
//! the version read for a whole duration, and only one that changed in none of it is deleted, on the
//! condition that it is still that version (a renewal meanwhile wins). A clock off by minutes delays a
//! reaping, or costs a watch, never deletes a live session.
//!
//! The cost stays flat as the job grows: each handle sweeps at a random time in each period of
//! `ttl x sessions / 2`, so the job makes about two sweeps a TTL whatever its size, each one list.

use std::time::Duration;

use kube::api::{DeleteParams, ListParams, Preconditions, WatchEvent as KubeEvent, WatchParams};
use futures::StreamExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::Server;
use super::names;
use super::object;
use crate::store::StoreError;

/// Whether a renewal at `renewed` (the holder's clock) for `duration` looks over at `now` (this clock).
pub fn suspect(renewed: jiff::Timestamp, duration: Duration, now: jiff::Timestamp) -> bool {
    let Ok(age) = Duration::try_from(now.duration_since(renewed)) else { return false };
    age > duration
}

/// The wait before a handle's next sweep: a random point of a period that grows with the sessions seen,
/// so the job as a whole sweeps about twice a TTL. `unit`: a random number in [0, 1).
pub fn next_sweep(ttl: Duration, sessions: u32, unit: f64) -> Duration {
    let period = ttl.mul_f64((f64::from(sessions) / 2.0).max(1.0));
    period.mul_f64(unit.clamp(0.0, 1.0))
}

pub(super) fn random_unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

/// Sweeps the job's sessions until aborted; `own`: this handle's session object, never suspected.
pub(super) fn start(server: Server, job: String, ttl: Duration, peers: u32, own: String) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut sessions = peers.max(1);
        let mut period_end = Instant::now();
        loop {
            // One sweep in each period, at a random point of it.
            let period = next_sweep(ttl, sessions, 1.0);
            let at = period_end + next_sweep(ttl, sessions, random_unit());
            period_end += period;
            tokio::time::sleep_until(at).await;
            match sweep(&server, &job, &own).await {
                Ok(seen) => sessions = seen.max(1),
                Err(e) => tracing::debug!("cannot sweep the rendezvous sessions: {e}"),
            }
            tokio::time::sleep_until(period_end).await;
        }
    })
}

/// One sweep: the sessions listed, each suspect watched (in the background). Returns how many there are.
async fn sweep(server: &Server, job: &str, own: &str) -> Result<u32, StoreError> {
    let selector = names::sessions_selector(job);
    let found = server.call("list", server.leases.list(&ListParams::default().labels(&selector))).await?;
    let now = jiff::Timestamp::now();
    let count = u32::try_from(found.items.len()).unwrap_or(u32::MAX);
    for lease in found.items {
        let Some(name) = lease.metadata.name.clone() else { continue };
        let Some((renewed, duration)) = object::renewal(&lease) else { continue };
        let Some(version) = lease.metadata.resource_version.clone() else { continue };
        if name != own && suspect(renewed, duration, now) {
            tokio::spawn(confirm(server.clone(), job.to_string(), name, version, duration));
        }
    }
    Ok(count)
}

/// Watches a suspect for a whole `duration` from `version`: unchanged, it is deleted (if still that
/// version), then its session keys.
async fn confirm(server: Server, job: String, name: String, version: String, duration: Duration) {
    if !unchanged_for(&server, &name, &version, duration).await {
        return;
    }
    let preconditions = Preconditions { resource_version: Some(version), uid: None };
    let dp = DeleteParams { preconditions: Some(preconditions), ..DeleteParams::default() };
    match server.request("delete", server.leases.delete(&name, &dp)).await {
        Ok(Ok(_)) => {}
        // Renewed at the last moment (409), or another agent reaped it first (404).
        Ok(Err(_)) => return,
        Err(e) => {
            tracing::debug!("cannot reap the rendezvous session {name}: {e}");
            return;
        }
    }
    let keys = ListParams::default().labels(&names::session_selector(&job, &name));
    match server.call("delete_collection", server.leases.delete_collection(&DeleteParams::default(), &keys)).await {
        Ok(_) => tracing::info!("reaped rendezvous session {name}: not renewed for {duration:?}"),
        Err(e) => tracing::debug!("reaped rendezvous session {name}, but not its keys: {e}"),
    }
}

/// Whether the object stayed at `version` for `duration`, as a watch from that version sees it.
async fn unchanged_for(server: &Server, name: &str, version: &str, duration: Duration) -> bool {
    let deadline = Instant::now() + duration;
    let seconds = u32::try_from(duration.as_secs() + 1).unwrap_or(u32::MAX);
    let params = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(seconds);
    let Ok(Ok(events)) = server.request("watch", server.leases.watch(&params, version)).await else { return false };
    let mut events = std::pin::pin!(events);
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => return true,
            Ok(Some(Ok(KubeEvent::Bookmark(_)))) => {}
            // Renewed, deleted, or the watch cannot say: not this sweep's to reap.
            Ok(Some(_)) => return false,
            Ok(None) => return Instant::now() >= deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_older_than_its_duration_is_suspect_and_no_older_one() {
        let at = |s: i64| jiff::Timestamp::from_second(1_800_000_000 + s).unwrap();
        let d = Duration::from_secs(15);
        let table = [(0, 10, false), (0, 15, false), (0, 16, true), (20, 0, false), (0, 3600, true)];
        for (renewed, now, want) in table {
            assert_eq!(suspect(at(renewed), d, at(now)), want, "renewed {renewed}, now {now}");
        }
    }

    #[test]
    fn the_job_sweeps_about_twice_a_ttl_whatever_its_size() {
        let ttl = Duration::from_secs(10);
        for sessions in [1u32, 2, 64, 1024] {
            let period = next_sweep(ttl, sessions, 1.0);
            let sweeps_per_ttl = f64::from(sessions) * ttl.as_secs_f64() / period.as_secs_f64();
            assert!((1.0..=2.0).contains(&sweeps_per_ttl) || sessions == 1, "{sessions}: {sweeps_per_ttl}");
            assert!(next_sweep(ttl, sessions, 0.5) <= period);
        }
        assert!((0.0..1.0).contains(&random_unit()));
    }
}
