//! A memory of lemon nodes (`--exclude-after K[/WINDOW]`): a host that fails its job again and again is kept
//! out of it. Each incident names its culprit host in the store, under the run's prefix:
//! `culprits/<host>/<round>-<unix ms>-<kind>`, the host as the node's address (`--local-addr`, the FQDN by
//! default), so it outlives the agent that recorded it (with etcd every agent: a requeued job, same run id,
//! keeps it).
//!
//! One incident has one culprit. A crash breaks its peers' collectives, so several nodes may spend a restart
//! for the same round: the earliest record of the round (by the recording hosts' clocks, which differ by far
//! less than a crash takes to reach the peers) names the culprit. A drain (a GPU fault) is its own node's.
//! A host that was the culprit of K incidents within WINDOW is refused at its next join with one line
//! listing them (exit 75) while the job goes on without it; `muster status` lists the hosts kept out, and
//! `muster status --readmit HOST` forgets a repaired host's incidents.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::budget::RestartBudget;
use super::{unix_ms, RdzvError, Rendezvous};
use crate::store::Store;

/// The key (under the run's prefix) the incidents live under.
pub const CULPRITS: &str = "culprits/";

/// The kind a drain is recorded with.
const DRAIN: &str = "drain";

/// The kinds of a restart spent (`StopKind::restart_label`): the round's restarts are one incident. Any
/// other kind (a drain, a failed health check) is its node's own.
const RESTARTS: [&str; 3] = ["worker_failure", "gpu_fault", "hang"];

/// One incident as its key names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incident {
    pub host: String,
    pub round: u64,
    pub at_ms: u64,
    /// `worker_failure`, `gpu_fault`, `hang` (a restart spent), `drain`, or `health_<check>`.
    pub kind: String,
}

impl Incident {
    /// `round 3 worker_failure at 2026-12-03T09:31:02Z`.
    fn text(&self) -> String {
        let at = chrono::DateTime::from_timestamp_millis(self.at_ms as i64)
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|| self.at_ms.to_string());
        format!("round {} {} at {at}", self.round, self.kind)
    }
}

/// A key's parts after `culprits/`: `<host>/<round>-<unix ms>-<kind>`. None: not an incident key.
fn incident(key: &str) -> Option<Incident> {
    let rest = key.split(CULPRITS).nth(1)?;
    let (host, name) = rest.rsplit_once('/')?;
    let mut parts = name.splitn(3, '-');
    let round = parts.next()?.parse().ok()?;
    let at_ms = parts.next()?.parse().ok()?;
    let kind = parts.next().filter(|k| !k.is_empty())?;
    (!host.is_empty()).then(|| Incident { host: host.to_string(), round, at_ms, kind: kind.to_string() })
}

/// The incidents each host is the culprit of, among `keys` (those under `culprits/`), within `window` of
/// `now_ms`: host → its incidents, oldest first. A round's restarts are one incident, its earliest record's.
pub fn culprits(keys: &[String], now_ms: u64, window: Option<Duration>) -> BTreeMap<String, Vec<Incident>> {
    let mut first: BTreeMap<u64, Incident> = BTreeMap::new();
    let mut drains = Vec::new();
    for i in keys.iter().filter_map(|k| incident(k)) {
        if !RESTARTS.contains(&i.kind.as_str()) {
            drains.push(i);
        } else if first.get(&i.round).is_none_or(|f| (i.at_ms, &i.host) < (f.at_ms, &f.host)) {
            first.insert(i.round, i);
        }
    }
    let since = window.map(|w| now_ms.saturating_sub(u64::try_from(w.as_millis()).unwrap_or(u64::MAX)));
    let mut by_host: BTreeMap<String, Vec<Incident>> = BTreeMap::new();
    for i in first.into_values().chain(drains).filter(|i| since.is_none_or(|s| i.at_ms >= s)) {
        by_host.entry(i.host.clone()).or_default().push(i);
    }
    for incidents in by_host.values_mut() {
        incidents.sort_by_key(|i| (i.at_ms, i.round));
    }
    by_host
}

/// The hosts kept out under `limit`, with their incidents.
pub fn kept_out(keys: &[String], now_ms: u64, limit: &RestartBudget) -> BTreeMap<String, Vec<Incident>> {
    let mut hosts = culprits(keys, now_ms, limit.window);
    hosts.retain(|_, incidents| incidents.len() as u32 >= limit.max);
    hosts
}

/// The line a host kept out ends with.
fn kept_out_line(host: &str, incidents: &[Incident], limit: &RestartBudget, run_id: &str) -> String {
    let listed: Vec<String> = incidents.iter().map(Incident::text).collect();
    format!(
        "this host ({host}) caused {} incidents of the job (--exclude-after {}): {}; it is kept out and the job goes \
         on without it: repair it, then let it back in with `muster status --rdzv-id {run_id} --readmit {host}`",
        incidents.len(),
        limit.spec(),
        listed.join("; ")
    )
}

impl<S: Store> Rendezvous<S> {
    /// The key that names this host the culprit of an incident of `kind` now, in the current round; None
    /// when the job keeps no memory (no `--exclude-after`).
    pub(super) fn culprit_key(&self, kind: &str) -> Result<Option<String>, RdzvError> {
        if self.settings.exclude_after.is_none() {
            return Ok(None);
        }
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        let now = unix_ms().ok_or_else(|| RdzvError::State("this host's clock is before 1970".into()))?;
        Ok(Some(self.key(&format!("{CULPRITS}{}/{round}-{now}-{kind}", self.me.addr))))
    }

    /// A drain (`kind`: `None` for a GPU fault's, else the failed health check): this host is the culprit
    /// (best effort: a node that drains leaves whatever the store says).
    pub async fn record_drain(&self, kind: Option<&str>) {
        let kind = kind.map(|check| format!("health_{check}")).unwrap_or_else(|| DRAIN.to_string());
        match self.culprit_key(&kind) {
            Ok(Some(key)) => {
                if let Err(e) = self.store.set(&key, b"1").await {
                    tracing::warn!("cannot record the drain among this host's incidents: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("cannot record the drain among this host's incidents: {e}"),
        }
    }

    /// Refuses this node when its host is kept out (`--exclude-after`): asked before every join.
    pub(super) async fn refuse_a_lemon(&self) -> Result<(), RdzvError> {
        let Some(limit) = &self.settings.exclude_after else { return Ok(()) };
        let now = unix_ms().ok_or_else(|| RdzvError::State("this host's clock is before 1970".into()))?;
        let keys = self.store.list(&self.key(CULPRITS)).await?;
        match kept_out(&keys, now, limit).get(&self.me.addr) {
            Some(incidents) => Err(RdzvError::KeptOut(kept_out_line(&self.me.addr, incidents, limit, &self.settings.run_id))),
            None => Ok(()),
        }
    }
}

/// A host kept out of the job, as `muster status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptOut {
    pub host: String,
    /// `--exclude-after` as written.
    pub limit: String,
    pub incidents: Vec<Incident>,
}

impl KeptOut {
    /// `kept out: n1 (--exclude-after 2/1h): round 0 worker_failure at …; round 1 …`.
    pub fn line(&self) -> String {
        let listed: Vec<String> = self.incidents.iter().map(Incident::text).collect();
        format!("kept out: {} (--exclude-after {}): {}", self.host, self.limit, listed.join("; "))
    }
}

/// The hosts job `prefix` keeps out under the `--exclude-after` its fingerprint names (`spec`, empty: none).
pub(super) async fn read_kept_out<S: Store>(store: &S, prefix: &str, spec: &str) -> Result<Vec<KeptOut>, RdzvError> {
    if spec.is_empty() {
        return Ok(Vec::new());
    }
    let limit: RestartBudget =
        spec.parse().map_err(|e| RdzvError::State(format!("the job fingerprint's --exclude-after '{spec}': {e}")))?;
    let now = unix_ms().ok_or_else(|| RdzvError::State("this host's clock is before 1970".into()))?;
    let keys = store.list(&format!("{prefix}{CULPRITS}")).await?;
    let hosts = kept_out(&keys, now, &limit);
    Ok(hosts.into_iter().map(|(host, incidents)| KeptOut { host, limit: limit.spec(), incidents }).collect())
}

/// Forgets every incident of `host` in job `run_id` (`muster status --readmit`); how many there were.
pub async fn readmit<S: Store>(store: &S, run_id: &str, host: &str) -> Result<usize, RdzvError> {
    let keys = store.list(&format!("{}{run_id}/{CULPRITS}{host}/", super::KEY_PREFIX)).await?;
    for key in &keys {
        store.delete(key).await?;
    }
    Ok(keys.len())
}

/// `muster status --forget`: job `run_id`'s keys deleted but its hosts' incidents (a requeued job with
/// the same id keeps them), as the job's last agent deletes them at its end. Returns how many went.
pub async fn forget<S: Store>(store: &S, run_id: &str) -> Result<usize, RdzvError> {
    let job = format!("{}{run_id}/", super::KEY_PREFIX);
    let keep = format!("{job}{CULPRITS}");
    let gone = store.list(&job).await?.iter().filter(|k| !k.starts_with(&keep)).count();
    store.forget_job(&keep).await?;
    Ok(gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("muster/job/culprits/{n}")).collect()
    }

    #[test]
    fn a_round_has_one_culprit_and_a_window_forgets() {
        let hour = Some(Duration::from_secs(3600));
        let now = 10_000_000;
        // (keys, window) -> {host: [rounds]}
        type Row = (&'static [&'static str], Option<Duration>, &'static [(&'static str, &'static [u64])]);
        let table: &[Row] = &[
            (&[], None, &[]),
            (&["n1/0-1000-worker_failure", "n1/2-5000-worker_failure"], None, &[("n1", &[0, 2])]),
            // A crash on n1 broke n2's collectives: n2's restart for the same round, 40 ms later, is n1's incident.
            (&["n1/0-1000-worker_failure", "n2/0-1040-worker_failure"], None, &[("n1", &[0])]),
            (&["n2/0-1040-worker_failure", "n1/0-1000-worker_failure"], None, &[("n1", &[0])]),
            // A drain is its own node's, whatever else happened in the round.
            (&["n1/0-1000-worker_failure", "n2/0-1040-drain"], None, &[("n1", &[0]), ("n2", &[0])]),
            // Out of the window: forgotten.
            (&["n1/0-1000-worker_failure", "n1/3-9000000-hang"], hour, &[("n1", &[3])]),
            // Not incident keys: left alone.
            (&["n1/garbage", "/0-1-x", "n1/0-1-"], None, &[]),
        ];
        for (names, window, want) in table {
            let got = culprits(&keys(names), now, *window);
            let got: Vec<(String, Vec<u64>)> = got.into_iter().map(|(h, i)| (h, i.iter().map(|i| i.round).collect())).collect();
            let want: Vec<(String, Vec<u64>)> = want.iter().map(|(h, r)| (h.to_string(), r.to_vec())).collect();
            assert_eq!(got, want, "{names:?}");
        }
    }

    #[test]
    fn a_host_with_k_incidents_is_kept_out_with_each_listed() {
        let limit: RestartBudget = "2/1h".parse().expect("limit");
        let names = keys(&["n1/0-1000-worker_failure", "n1/1-2000-worker_failure", "n2/2-3000-worker_failure"]);
        let out = kept_out(&names, 4000, &limit);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["n1"], "n2 failed once");
        let line = kept_out_line("n1", &out["n1"], &limit, "job");
        assert!(line.contains("caused 2 incidents of the job (--exclude-after 2/1h): round 0 worker_failure at 1970-01-01T00:00:01Z; round 1"), "{line}");
        assert!(line.contains("--readmit n1"), "{line}");
    }
}
