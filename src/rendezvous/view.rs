//! A job's rendezvous as the store holds it, read by someone who is not in it (`muster status`): only
//! `get`, `list` and `multi_get`, so the store sees a reader — no write, no session key, no watch.
//!
//! What it reads: the fingerprint (whether the run exists), the round counter and `closed`, the latest
//! sealed round's seal and records, the open round's records (while it is not sealed), the liveness keys,
//! the waiting list, every node's heartbeat and the job's restart records. O(nodes + restarts) bytes, a
//! handful of requests.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use super::budget::{tally, RestartBudget, RESTARTS};
use super::lemons::{read_kept_out, KeptOut};
use super::wire::{parse_round, Closure, Fingerprint, Heartbeat, Record, Seal};
use super::{unix_ms, RdzvError, KEY_PREFIX};
use crate::store::Store;

/// What the store says about one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    pub run_id: String,
    pub fingerprint: Fingerprint,
    /// The round counter: the round being formed or running.
    pub round: u64,
    /// How many nodes a re-formation expects in `round`.
    pub expected: Option<u32>,
    pub closed: bool,
    /// The latest sealed round: `round`, or the one before while `round` is being formed; None before the
    /// first seal (or in a store restarted under the job).
    pub sealed_round: Option<u64>,
    /// The sealed round's members, in group-rank order (the index is the group rank).
    pub members: Vec<NodeView>,
    /// Nodes outside the sealed round: joiners of the open round and spares waiting for the next one.
    pub others: Vec<NodeView>,
    /// The last hang verdict (its line), when hang detection found one.
    pub last_hang: Option<String>,
    pub restarts: JobRestarts,
    /// The hosts `--exclude-after` keeps out (`lemons.rs`).
    pub kept_out: Vec<KeptOut>,
}

/// The job's restarts, counted over every node (`budget.rs`), and its budget.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct JobRestarts {
    /// Restarts of the job recorded (those aged out of a window are deleted).
    pub total: u32,
    /// Those that count against the budget now (all of them without a window).
    pub in_window: u32,
    /// `--job-max-restarts` as written; None: no job-wide budget.
    pub budget: Option<String>,
    /// Restarts the budget still allows now.
    pub left: Option<u32>,
    /// The line the job ended with, when its budget was spent.
    pub over_budget: Option<String>,
}

/// One node as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    /// None for a waiting node whose record is not in the rounds read.
    pub addr: Option<String>,
    pub nproc: Option<u32>,
    /// Restarts spent when it last joined (None from agents that do not publish it).
    pub restarts: Option<u32>,
    /// Rounds it had joined with its workers kept in place, when it last joined (None: not published).
    pub in_place: Option<u32>,
    /// Its liveness key exists (its agent's connection is open and it was not evicted).
    pub alive: bool,
    /// It has a record in the open round (`round`, not sealed yet).
    pub joining: bool,
    /// It waits for the next round (a spare).
    pub waiting: bool,
    pub heartbeat: Option<Heartbeat>,
}

/// The restart records under `prefix`, counted against the budget the job's fingerprint names.
async fn job_restarts<S: Store>(store: &S, prefix: &str, fingerprint: &Fingerprint, closure: Option<&Closure>) -> Result<JobRestarts, RdzvError> {
    let budget = match fingerprint.restart_budget.as_str() {
        "" => None,
        spec => Some(spec.parse::<RestartBudget>().map_err(|e| RdzvError::State(format!("the job fingerprint's restart budget '{spec}': {e}")))?),
    };
    let now = unix_ms().ok_or_else(|| RdzvError::State("this host's clock is before 1970".into()))?;
    let counted = tally(&store.list(prefix).await?, now, budget.as_ref().and_then(|b| b.window));
    let over_budget = match closure {
        Some(Closure::OverBudget(line)) => Some(line.clone()),
        _ => None,
    };
    Ok(JobRestarts {
        total: counted.total,
        in_window: counted.in_window,
        left: budget.as_ref().map(|b| b.max.saturating_sub(counted.in_window)),
        budget: budget.map(|b| b.spec()),
        over_budget,
    })
}

/// Reads job `run_id`; None when the store has no such job (no fingerprint: no agent ever registered).
pub async fn read_view<S: Store>(store: &S, run_id: &str) -> Result<Option<JobView>, RdzvError> {
    let prefix = format!("{KEY_PREFIX}{run_id}/");
    let key = |rest: &str| format!("{prefix}{rest}");
    let Some(fingerprint) = store.get(&key("fingerprint")).await? else { return Ok(None) };
    let fingerprint: Fingerprint = serde_json::from_slice(&fingerprint)
        .map_err(|e| RdzvError::State(format!("unreadable job fingerprint: {e}")))?;
    let (round, expected) = parse_round(&store.get(&key("round")).await?.unwrap_or_default());
    let closure = store.get(&key("closed")).await?.map(|v| Closure::decode(&v));
    let restarts = job_restarts(store, &key(RESTARTS), &fingerprint, closure.as_ref()).await?;
    let kept_out = read_kept_out(store, &prefix, &fingerprint.exclude_after).await?;
    let mut sealed = None;
    for r in [Some(round), round.checked_sub(1)].into_iter().flatten() {
        // The members are written before the seal: a round is sealed once its `sealed` key is there.
        let read = store.multi_get(&[key(&format!("r/{r}/sealed")), key(&format!("r/{r}/members"))]).await?;
        if let [Some(_), Some(seal)] = read.as_slice() {
            sealed = Some((r, Seal::decode(seal)?));
            break;
        }
    }
    let sealed_records = match &sealed {
        Some((r, _)) => records(store, &key(&format!("r/{r}/m/"))).await?,
        None => BTreeMap::new(),
    };
    let open_records = match &sealed {
        Some((r, _)) if *r == round => BTreeMap::new(),
        _ => records(store, &key(&format!("r/{round}/m/"))).await?,
    };
    let alive = ids(store, &key("alive/")).await?;
    let waiting = ids(store, &key("waiting/")).await?;
    let node = |id: &str, record: Option<&Record>| NodeView {
        id: id.to_string(),
        addr: record.map(|r| r.node.addr.clone()),
        nproc: record.map(|r| r.node.nproc),
        restarts: record.and_then(|r| r.restarts),
        in_place: record.and_then(|r| r.in_place),
        alive: alive.contains(id),
        joining: open_records.contains_key(id),
        waiting: waiting.contains(id),
        heartbeat: None,
    };
    let mut members = Vec::new();
    if let Some((_, seal)) = &sealed {
        for m in &seal.members {
            let record = open_records.get(&m.id).or(sealed_records.get(&m.id));
            // The seal has the nproc the member joined with; a record of the open round may differ.
            members.push(NodeView { addr: Some(m.addr.clone()), nproc: Some(m.nproc), ..node(&m.id, record) });
        }
    }
    let in_seal: HashSet<String> = members.iter().map(|m| m.id.clone()).collect();
    let mut others: Vec<NodeView> = open_records
        .iter()
        .filter(|(id, _)| !in_seal.contains(*id))
        .map(|(id, r)| node(id, Some(r)))
        .collect();
    for id in waiting.iter().filter(|id| !in_seal.contains(*id) && !open_records.contains_key(*id)) {
        others.push(node(id, sealed_records.get(id)));
    }
    others.sort_by(|a, b| a.id.cmp(&b.id));
    let mut view = JobView {
        run_id: run_id.to_string(),
        fingerprint,
        round,
        expected,
        closed: closure.is_some(),
        sealed_round: sealed.map(|(r, _)| r),
        members,
        others,
        last_hang: last_hang(store.get(&key(super::board::LAST_KEY)).await?),
        restarts,
        kept_out,
    };
    read_heartbeats(store, &prefix, &mut view).await?;
    Ok(Some(view))
}

/// The line of the last verdict group rank 0 published (see `board.rs`).
fn last_hang(v: Option<Vec<u8>>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&v?).ok()?;
    v["line"].as_str().map(str::to_string)
}

/// The records under `prefix` (one round's `m/`), by node id; a node's latest slot wins, as the sealer's.
async fn records<S: Store>(store: &S, prefix: &str) -> Result<BTreeMap<String, Record>, RdzvError> {
    super::join::latest_records(store.scan(prefix).await?, |_| true)
}

/// The node ids of the keys under `prefix` (`alive/`, `waiting/`).
async fn ids<S: Store>(store: &S, prefix: &str) -> Result<HashSet<String>, RdzvError> {
    Ok(store.list(prefix).await?.into_iter().filter_map(|k| k.strip_prefix(prefix).map(str::to_string)).collect())
}

/// Every node's heartbeat: one `scan` of the `hb/` keys.
async fn read_heartbeats<S: Store>(store: &S, prefix: &str, view: &mut JobView) -> Result<(), RdzvError> {
    let hb = format!("{prefix}hb/");
    let beats: HashMap<String, Vec<u8>> =
        store.scan(&hb).await?.into_iter().filter_map(|(k, v)| Some((k.strip_prefix(&hb)?.to_string(), v))).collect();
    for node in view.members.iter_mut().chain(view.others.iter_mut()) {
        if let Some(beat) = beats.get(&node.id) {
            node.heartbeat = Heartbeat::decode(beat);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rendezvous::tests::shared::{join_all, settings};
    use crate::rendezvous::{NodeInfo, Rendezvous};
    use crate::store::memory::{MemoryHandle, MemoryStore};

    async fn agent(store: &MemoryStore, id: &str, restarts: u32) -> Rendezvous<MemoryHandle> {
        let s = settings(1, 3);
        let fingerprint = Fingerprint { entrypoint: "train.py".into(), args: vec![], nproc_spec: "2".into(), nnodes: "1:3".into(), restart_budget: String::new(), exclude_after: String::new() };
        let me = NodeInfo { id: id.into(), addr: format!("10.0.0.{}", id.len()), nproc: 2 };
        let mut r = Rendezvous::new(store.handle(), s, me, fingerprint);
        r.set_restarts(restarts);
        r.register().await.expect("register");
        r
    }

    async fn view(store: &MemoryStore) -> JobView {
        read_view(&store.handle(), "suite").await.expect("read").expect("the job is there")
    }

    /// The view once `f` holds of it (the agents' tasks run meanwhile).
    async fn until(store: &MemoryStore, f: impl Fn(&JobView) -> bool) -> JobView {
        let seen = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let v = view(store).await;
                if f(&v) {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        seen.await.expect("the store shows it within 10 s")
    }

    #[test]
    fn heartbeats_carry_their_time_and_older_ones_decode_without_it() {
        let hb = Heartbeat { beat: 7, at_ms: Some(1_700_000_000_123), interval_ms: Some(5000), progress: Vec::new(), pace: None };
        assert_eq!(Heartbeat::decode(&hb.encode()), Some(hb.clone()));
        let with = Heartbeat { progress: vec![(2, 1_700_000_000_001), (3, 1_699_999_999_999)], ..hb };
        assert_eq!(with.encode(), b"7 1700000000123 5000 progress=2:1700000000001,3:1699999999999");
        assert_eq!(Heartbeat::decode(&with.encode()), Some(with.clone()));
        let paced = Heartbeat { pace: Some(r#"{"frame":"train.py:4 step a"}"#.into()), ..with };
        assert!(paced.encode().ends_with(br#"progress=2:1700000000001,3:1699999999999 pace={"frame":"train.py:4 step a"}"#));
        assert_eq!(Heartbeat::decode(&paced.encode()), Some(paced));
        assert_eq!(Heartbeat::decode(b"12"), Some(Heartbeat { beat: 12, at_ms: None, interval_ms: None, progress: Vec::new(), pace: None }));
        assert_eq!(Heartbeat::decode(b"x 1 2"), None);
        assert_eq!(Heartbeat::decode(b"\xff"), None);
    }

    #[tokio::test]
    async fn an_unknown_run_reads_as_none() {
        let store = MemoryStore::new();
        let _a = agent(&store, "a", 0).await;
        assert_eq!(read_view(&store.handle(), "other").await.expect("read"), None);
    }

    #[tokio::test]
    async fn members_joiners_spares_and_the_lost_are_told_apart() {
        let store = MemoryStore::new();
        let agents = vec![agent(&store, "a", 0).await, agent(&store, "bb", 2).await, agent(&store, "ccc", 0).await];
        let mut joined = join_all(agents).await;
        joined.sort_by_key(|(_, i)| i.group_rank);
        let v = view(&store).await;
        assert_eq!((v.round, v.sealed_round, v.closed, v.fingerprint.nnodes.as_str()), (0, Some(0), false, "1:3"));
        let order: Vec<&str> = joined.iter().map(|(a, _)| a.me().id.as_str()).collect();
        assert_eq!(v.members.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), order);
        let bb = v.members.iter().find(|m| m.id == "bb").expect("bb");
        assert_eq!((bb.addr.as_deref(), bb.nproc, bb.restarts), (Some("10.0.0.2"), Some(2), Some(2)));
        assert!(v.members.iter().all(|m| m.alive && !m.joining && !m.waiting));
        assert!(v.others.is_empty());
        // A member's first beat of the round comes within a beat's period of the seal.
        until(&store, |v| v.members.iter().all(|m| m.heartbeat.as_ref().is_some_and(|h| h.at_ms.is_some()))).await;

        // A fourth node finds the group full: a spare.
        let mut spare = agent(&store, "dddd", 0).await;
        let waiting = tokio::spawn(async move { spare.next_round().await.map(|_| spare) });
        let v = until(&store, |v| v.others.iter().any(|n| n.id == "dddd" && n.waiting && n.alive)).await;
        assert_eq!(v.others[0].addr.as_deref(), Some("10.0.0.4"));

        // The last member dies; the first opens the next round: the old round shows who is lost.
        let (dead, _) = joined.pop().expect("three");
        drop(dead);
        until(&store, |v| v.members.last().is_some_and(|m| !m.alive)).await;
        joined[0].0.open_next_round().await.expect("open");
        let v = view(&store).await;
        assert_eq!((v.round, v.sealed_round), (1, Some(0)));
        waiting.abort();
    }
}
