//! Network partitions between real hosts, simulated with network namespaces (tests/it/common/netns.rs): a host
//! cut off silently (no FIN, no RST) as when it loses power or its switch port dies, or one that loses
//! packets. What a user sees is asserted from the agents' `--event-log` files and what the workers
//! (tests/fixtures/netns_worker.py, or examples/train.py through tests/fixtures/partition_train.py) record,
//! against the fencing behaviour of `src/rendezvous/fence.rs` and docs/multi-node.md's "When a node is cut off"
//! (I = keep_alive_interval, W = I × keep_alive_max_attempt):
//!
//! - the cut node fences at most W - min(I, W/2) after the cut, stops its workers (a transition to
//!   "stopping" with reason "fenced") before the survivors start their new round, and exits 3 once the store
//!   stays unreachable for read_timeout (c10d) or join_timeout (etcd);
//! - the survivors evict it no earlier than W after its last heartbeat and run again in a newer round
//!   within W + I + 1 s of the cut; no worker of the old round overlaps one of the new (no split brain);
//! - a cut node healed in time comes back as a newcomer, appended after the survivors;
//! - the same for an inbound-only cut (the node still sends) and a link that goes down;
//! - with an external store, never two RANK=0 workers at once; with etcd, the leader's host cut changes
//!   nothing; with the Kubernetes API server as the store, a cut agent is fenced as with etcd;
//! - 10% packet loss each way at the store's host for minutes, with the default keep-alive, evicts nobody;
//! - a real gloo training job whose workers block in all_reduce when a member is cut re-forms within
//!   membership_grace, spends no restart, and trains on;
//! - in place, the survivors' workers keep their processes and re-form within W + I + 1 s + the bound.
//!
//! This file holds what every scenario shares (the one-at-a-time lock, the settings, the event logs, the
//! /proc sampler, the report); `partition/job.rs` starts and reads a job, `partition/cut.rs` the
//! expectations of a cut, and the other files under `partition/` are the scenario groups.
//!
//! Every scenario appends one JSON line of measurements to `$MUSTER_PARTITION_REPORT` when it is set (passed
//! or not; `scripts/stress/partition.sh` tabulates them) and prints it on stderr. The tests need root and
//! nftables and fail (never skip) without them; they run one at a time whatever --test-threads says.

use crate::common;

mod c10d;
mod cut;
mod etcd;
mod gate;
mod harness;
mod inplace;
mod job;
mod k8s;
mod loss;
mod train;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use common::alive;

/// The rendezvous port every store listens on (each host has its own port space).
const STORE_PORT: u16 = 29400;
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;

/// The scenarios measure seconds: one at a time, so that two of them never share the two cores.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A scenario begins: the lock held, and its report, written when the scenario ends (before the lock goes).
fn scenario(name: &'static str) -> (MutexGuard<'static, ()>, Report) {
    (serial(), Report::new(name))
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn now() -> f64 {
    epoch(SystemTime::now())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// ------------------------------------------------------------------------------------------------ settings

/// The `--rdzv-conf` timings, in seconds.
#[derive(Clone, Copy, Debug)]
struct Timings {
    /// keep_alive_interval (I)
    interval: u32,
    /// keep_alive_max_attempt (M)
    attempts: u32,
    /// Whether I and M are named in --rdzv-conf; when not, they must be muster's defaults (5 s × 3).
    keep_alive: bool,
    /// read_timeout and join_timeout when named (else muster's 60 s and 600 s).
    read_timeout: Option<u32>,
    join_timeout: Option<u32>,
    last_call: u32,
}

/// Fast settings: W = 3 s, the fence 2 s after the last acknowledged heartbeat was sent.
const FAST: Timings =
    Timings { interval: 1, attempts: 3, keep_alive: true, read_timeout: Some(10), join_timeout: Some(30), last_call: 1 };

/// The keep-alive a job gets when it names none (5 s × 3, W = 15 s), with read_timeout at its default.
const DEFAULT_KEEP_ALIVE: Timings =
    Timings { interval: 5, attempts: 3, keep_alive: false, read_timeout: None, join_timeout: Some(30), last_call: 1 };

impl Timings {
    fn i(&self) -> f64 {
        self.interval as f64
    }

    /// The liveness window W = I × M.
    fn w(&self) -> f64 {
        (self.interval * self.attempts) as f64
    }

    /// How long after its last acknowledged heartbeat was sent a node fences: W - min(I, W/2).
    fn fence_after(&self) -> f64 {
        self.w() - self.i().min(self.w() / 2.0)
    }

    /// read_timeout: how long a fenced c10d node waits for the store before it exits 3.
    fn read_s(&self) -> f64 {
        self.read_timeout.unwrap_or(60) as f64
    }

    /// join_timeout: the same for etcd.
    fn join_s(&self) -> f64 {
        self.join_timeout.unwrap_or(600) as f64
    }

    fn conf(&self) -> String {
        let mut keys = Vec::new();
        if self.keep_alive {
            keys.push(format!("keep_alive_interval={}", self.interval));
            keys.push(format!("keep_alive_max_attempt={}", self.attempts));
        }
        keys.extend(self.read_timeout.map(|s| format!("read_timeout={s}")));
        keys.extend(self.join_timeout.map(|s| format!("join_timeout={s}")));
        keys.push(format!("last_call_timeout={}", self.last_call));
        keys.join(",")
    }
}

// ------------------------------------------------------------------------------------------------ events

/// One `muster.agent.transition` of an agent's event log.
#[derive(Debug, Clone)]
struct Tr {
    t: f64,
    from: String,
    to: String,
    round: Option<i64>,
    group_rank: Option<i64>,
    /// Restarts spent on this node so far.
    restart_count: Option<i64>,
    reason: Option<String>,
}

fn transitions(path: &Path) -> Vec<Tr> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["name"] == "muster.agent.transition")
        .filter_map(|e| {
            let ts = e["timestamp"].as_str()?;
            let t = chrono::DateTime::parse_from_rfc3339(ts).ok()?.timestamp_micros() as f64 / 1e6;
            Some(Tr {
                t,
                from: e["from"].as_str().unwrap_or_default().to_string(),
                to: e["to"].as_str().unwrap_or_default().to_string(),
                round: e["round"].as_i64(),
                group_rank: e["group_rank"].as_i64(),
                restart_count: e["restart_count"].as_i64(),
                reason: e["reason"].as_str().map(str::to_string),
            })
        })
        .collect()
}

/// A short form of a transition list for messages: `t+1.234 running->stopping(fenced) r3 g1`.
fn show(trs: &[Tr], t0: f64) -> String {
    trs.iter()
        .map(|t| {
            let reason = t.reason.as_deref().map(|r| format!("({r})")).unwrap_or_default();
            format!(
                "{:+.3} {}->{}{} r{} g{}",
                t.t - t0,
                t.from,
                t.to,
                reason,
                t.round.map(|r| r.to_string()).unwrap_or("-".into()),
                t.group_rank.map(|r| r.to_string()).unwrap_or("-".into())
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

// ------------------------------------------------------------------------------------------------ workers

/// One worker start as tests/fixtures/netns_worker.py (and partition_train.py) records it.
#[derive(Debug, Clone)]
struct Start {
    node: String,
    group_rank: Option<u32>,
    world_size: Option<u32>,
    round: Option<i64>,
    pid: i32,
    /// TORCHELASTIC_RESTART_COUNT (partition_train.py only).
    restart_count: Option<u32>,
}

/// The lines of the workers' record `name` in `dir`, each split into its fields and read by `parse` (a line
/// it cannot read, a worker's half-written last one say, is left out).
fn records<T>(dir: &Path, name: &str, parse: impl Fn(&[&str]) -> Option<T>) -> Vec<T> {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    text.lines().filter_map(|l| parse(&l.split_whitespace().collect::<Vec<_>>())).collect()
}

fn starts(dir: &Path) -> Vec<Start> {
    records(dir, "starts", |f| {
        Some(Start {
            node: f.first()?.to_string(),
            group_rank: f.get(2)?.parse().ok(),
            world_size: f.get(3)?.parse().ok(),
            round: f.get(4)?.parse().ok(),
            pid: f.get(5)?.parse().ok()?,
            restart_count: f.get(6).and_then(|c| c.parse().ok()),
        })
    })
}

/// A worker process of the job as the /proc sampler saw it: alive from `first` to `last` (epoch seconds,
/// 10 ms resolution; the true interval contains this one, so overlaps computed from it are never invented).
#[derive(Debug, Clone)]
struct Seen {
    pid: i32,
    node: String,
    rank: String,
    first: f64,
    last: f64,
    gone: bool,
}

/// Samples /proc every ~10 ms for the job's workers: processes whose environment has the job's token
/// (`MUSTER_PARTITION_JOB`, which the agents pass on), `MUSTER_TEST_NODE` and `RANK`. The PID namespace is
/// shared by every host. A process with the token but no RANK yet (an agent, or a worker between fork and
/// exec) is looked at again on every sample.
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn environ(pid: i32) -> Option<HashMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter_map(|kv| {
                let s = String::from_utf8_lossy(kv);
                let (k, v) = s.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect(),
    )
}

impl Sampler {
    fn start(token: &str) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let (stop2, seen2, token) = (stop.clone(), seen.clone(), token.to_string());
        let thread = std::thread::spawn(move || {
            let mut ignored = std::collections::HashSet::<i32>::new();
            // pid -> index in `seen` of the workers alive at the last sample.
            let mut live = HashMap::<i32, usize>::new();
            while !stop2.load(Ordering::Relaxed) {
                let t = now();
                let pids: std::collections::HashSet<i32> = std::fs::read_dir("/proc")
                    .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect())
                    .unwrap_or_default();
                ignored.retain(|p| pids.contains(p));
                let mut seen = seen2.lock().unwrap_or_else(|e| e.into_inner());
                live.retain(|pid, i| {
                    let up = pids.contains(pid) && alive(*pid);
                    match up {
                        true => seen[*i].last = t,
                        false => seen[*i].gone = true,
                    }
                    up
                });
                for pid in pids {
                    if ignored.contains(&pid) || live.contains_key(&pid) {
                        continue;
                    }
                    let Some(env) = environ(pid) else { continue };
                    // A process in the middle of execve (a worker starting) can read as having no
                    // environment at all: look again next time rather than ignore it for good.
                    if env.is_empty() {
                        continue;
                    }
                    if env.get("MUSTER_PARTITION_JOB") != Some(&token) {
                        ignored.insert(pid);
                        continue;
                    }
                    let (Some(node), Some(rank)) = (env.get("MUSTER_TEST_NODE"), env.get("RANK")) else { continue };
                    if !alive(pid) {
                        continue;
                    }
                    live.insert(pid, seen.len());
                    seen.push(Seen {
                        pid,
                        node: node.clone(),
                        rank: rank.clone(),
                        first: t,
                        last: t,
                        gone: false,
                    });
                }
                drop(seen);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Sampler { stop, seen, thread: Some(thread) }
    }

    fn seen(&self) -> Vec<Seen> {
        let mut v: Vec<Seen> = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        v.sort_by(|a, b| a.first.total_cmp(&b.first));
        v
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn overlap(a: &Seen, b: &Seen) -> f64 {
    (a.last.min(b.last) - a.first.max(b.first)).max(0.0)
}

/// The longest time any process of `old` was alive together with one of `new`.
fn max_overlap(old: &[&Seen], new: &[&Seen]) -> (f64, Option<(Seen, Seen)>) {
    let mut best = (0.0, None);
    for a in old {
        for b in new {
            if a.pid != b.pid && overlap(a, b) > best.0 {
                best = (overlap(a, b), Some(((*a).clone(), (*b).clone())));
            }
        }
    }
    best
}

// ------------------------------------------------------------------------------------------------ report

/// One scenario's measurements: a JSON line appended to `$MUSTER_PARTITION_REPORT` when the test ends,
/// with `passed` false if it panicked, and shown on stderr.
struct Report {
    scenario: &'static str,
    fields: serde_json::Map<String, Value>,
}

impl Report {
    fn new(scenario: &'static str) -> Report {
        let mut fields = serde_json::Map::new();
        for k in ["split_brain_s", "reform_s", "cut_exit_s"] {
            fields.insert(k.into(), Value::Null);
        }
        Report { scenario, fields }
    }

    fn set(&mut self, key: &str, v: impl Into<Value>) {
        self.fields.insert(key.into(), v.into());
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        let mut line = json!({ "scenario": self.scenario, "passed": !std::thread::panicking() });
        if let Value::Object(o) = &mut line {
            o.extend(std::mem::take(&mut self.fields));
        }
        eprintln!("PARTITION {line}");
        if let Some(path) = std::env::var_os("MUSTER_PARTITION_REPORT") {
            use std::io::Write;
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
            match file.and_then(|mut f| writeln!(f, "{line}")) {
                Ok(()) => {}
                Err(e) => eprintln!("cannot append to MUSTER_PARTITION_REPORT={}: {e}", Path::new(&path).display()),
            }
        }
    }
}

/// Failed expectations, gathered so that one run says everything that is wrong.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    fn assert_all(self, context: impl FnOnce() -> String) {
        assert!(self.0.is_empty(), "{} expectation(s) failed:\n- {}\n{}", self.0.len(), self.0.join("\n- "), context());
    }
}
