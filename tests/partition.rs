//! Network partitions between real hosts, simulated with network namespaces (tests/common/netns.rs): a host
//! cut off silently (no FIN, no RST) as when it loses power or its switch port dies. What a user sees is
//! asserted from the agents' `--event-log` files and what the workers (tests/fixtures/netns_worker.py)
//! record, against the fencing behaviour of /work/notes/fence-spec.md (I = keep_alive_interval,
//! W = I × keep_alive_max_attempt):
//!
//! - the cut node fences at most W - min(I, W/2) after the cut, stops its workers (a transition to
//!   "stopping" with reason "fenced") before the survivors start their new round, and exits 3 once the store
//!   stays unreachable for read_timeout (c10d) or join_timeout (etcd);
//! - the survivors evict it no earlier than W after its last heartbeat and run again in a newer round
//!   within W + I + 1 s of the cut; no worker of the old round overlaps one of the new (no split brain);
//! - a cut node healed in time comes back as a newcomer, appended after the survivors;
//! - the same for an inbound-only cut (the node still sends) and a link that goes down;
//! - with an external store, never two RANK=0 workers at once; with etcd, the leader's host cut changes
//!   nothing.
//!
//! Every scenario appends one JSON line of measurements to `$MUSTER_PARTITION_REPORT` when it is set (passed
//! or not; `scripts/stress/partition.sh` tabulates them) and prints it on stderr. The tests need root and
//! nftables and fail (never skip) without them; they run one at a time whatever --test-threads says.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use common::cluster::{self, Agent};
use common::netns::Net;
use common::*;

/// The rendezvous port every store listens on (each host has its own port space).
const STORE_PORT: u16 = 29400;
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;

/// The scenarios measure seconds: one at a time, so that two of them never share the two cores.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
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
    read_timeout: u32,
    join_timeout: u32,
    last_call: u32,
}

/// Fast settings: W = 3 s, the fence 2 s after the last acknowledged heartbeat was sent.
const FAST: Timings = Timings { interval: 1, attempts: 3, read_timeout: 10, join_timeout: 30, last_call: 1 };

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

    fn conf(&self) -> String {
        format!(
            "keep_alive_interval={},keep_alive_max_attempt={},read_timeout={},join_timeout={},last_call_timeout={}",
            self.interval, self.attempts, self.read_timeout, self.join_timeout, self.last_call
        )
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

/// One worker start as tests/fixtures/netns_worker.py records it.
#[derive(Debug, Clone)]
struct Start {
    node: String,
    group_rank: Option<u32>,
    world_size: Option<u32>,
    round: Option<i64>,
    pid: i32,
}

fn starts(dir: &Path) -> Vec<Start> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Start {
                node: f.first()?.to_string(),
                group_rank: f.get(2)?.parse().ok(),
                world_size: f.get(3)?.parse().ok(),
                round: f.get(4)?.parse().ok(),
                pid: f.get(5)?.parse().ok()?,
            })
        })
        .collect()
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

// ------------------------------------------------------------------------------------------------ the job

enum Rdzv {
    /// `--rdzv-backend c10d --rdzv-endpoint ADDR:PORT`; the agent on that host hosts the store unless an
    /// external `muster store` runs there.
    C10d(String),
    /// `--rdzv-backend etcd --rdzv-endpoint e1:2379,e2:2379,e3:2379`.
    Etcd(String),
}

/// One agent, on host `host`, named `h<host>` (its MUSTER_TEST_NODE).
struct Node {
    host: usize,
    agent: Agent,
    exit: Option<(f64, Option<i32>)>,
}

impl Node {
    fn name(&self) -> String {
        format!("h{}", self.host)
    }
}

struct Job<'n> {
    net: &'n Net,
    dir: tempfile::TempDir,
    token: String,
    timings: Timings,
    rdzv: Rdzv,
    nnodes: String,
    nodes: Vec<Node>,
    /// Other processes of the job (stores, etcd members), killed on drop.
    services: Vec<Guard>,
    sampler: Sampler,
}

impl<'n> Job<'n> {
    fn new(net: &'n Net, timings: Timings, rdzv: Rdzv, nnodes: &str) -> Job<'n> {
        let token = format!("part{}", net.prefix());
        Job {
            net,
            dir: tempfile::Builder::new().prefix("muster-partition-").tempdir().unwrap(),
            sampler: Sampler::start(&token),
            token,
            timings,
            rdzv,
            nnodes: nnodes.to_string(),
            nodes: Vec::new(),
            services: Vec::new(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn events_path(&self, host: usize) -> PathBuf {
        self.path().join(format!("events-h{host}.jsonl"))
    }

    fn events(&self, host: usize) -> Vec<Tr> {
        transitions(&self.events_path(host))
    }

    fn node(&self, host: usize) -> &Node {
        self.nodes.iter().find(|n| n.host == host).unwrap_or_else(|| panic!("no agent on host {host}"))
    }

    fn node_mut(&mut self, host: usize) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.host == host).unwrap_or_else(|| panic!("no agent on host {host}"))
    }

    /// An agent on `host` running the netns worker, one worker a node.
    fn start_agent(&mut self, host: usize, extra_conf: &str) {
        let h = self.net.host(host);
        let (backend, endpoint) = match &self.rdzv {
            Rdzv::C10d(e) => ("c10d", e.clone()),
            Rdzv::Etcd(e) => ("etcd", e.clone()),
        };
        let mut conf = self.timings.conf();
        if !extra_conf.is_empty() {
            conf = format!("{conf},{extra_conf}");
        }
        let mut cmd = muster();
        h.wrap(&mut cmd);
        cmd.env("MUSTER_TEST_NODE", format!("h{host}"))
            .env("MUSTER_PARTITION_JOB", &self.token)
            .args([
                format!("--nnodes={}", self.nnodes),
                "--nproc-per-node=1".into(),
                format!("--rdzv-backend={backend}"),
                format!("--rdzv-endpoint={endpoint}"),
                format!("--rdzv-id={}", self.token),
                format!("--rdzv-conf={conf}"),
                format!("--local-addr={}", h.addr()),
                format!("--event-log={}", self.events_path(host).display()),
                format!("--log-dir={}", self.path().join(format!("logs-h{host}")).display()),
                "--max-restarts=3".into(),
                "--shutdown-timeout=5".into(),
                fixture("netns_worker.py").display().to_string(),
                self.path().display().to_string(),
            ]);
        self.nodes.push(Node { host, agent: Agent::spawn(&mut cmd), exit: None });
    }

    /// Waits until `to` on `from` accepts TCP connections.
    fn wait_listening(&self, from: usize, to: std::net::SocketAddr, what: &str) {
        let ok = eventually(Duration::from_secs(30), || self.net.host(from).connect(to, Duration::from_millis(500)).is_ok());
        assert!(ok, "{what} at {to} did not listen within 30 s\n{}", self.logs());
    }

    /// c10d with the store hosted by the agent on `hosts[0]`, then the others.
    fn start_c10d(&mut self, hosts: &[usize]) {
        let store = self.net.host(hosts[0]).socket(STORE_PORT);
        self.start_agent(hosts[0], "is_host=1");
        self.wait_listening(hosts[1], store, "the agent-hosted store");
        for &h in &hosts[1..] {
            self.start_agent(h, "is_host=0");
        }
    }

    /// `muster store` on `store_host`, then agents on `hosts` (none hosting).
    fn start_c10d_external(&mut self, store_host: usize, hosts: &[usize]) {
        let h = self.net.host(store_host);
        let mut cmd = muster();
        h.wrap(&mut cmd);
        cmd.args(["store", "--host", &h.addr(), "--port", &STORE_PORT.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.path().join("store.log")).unwrap());
        self.services.push(Guard::spawn(&mut cmd));
        self.wait_listening(hosts[0], h.socket(STORE_PORT), "muster store");
        for &a in hosts {
            self.start_agent(a, "is_host=0");
        }
    }

    /// The last round in which every agent on `hosts` runs, each with a worker of a world of
    /// `hosts.len()` recorded and alive, after `after` (epoch seconds); the test fails after `timeout`.
    fn wait_running(&self, hosts: &[usize], after: f64, timeout: Duration, what: &str) -> i64 {
        let mut round = None;
        let ok = eventually(timeout, || {
            round = self.running_round(hosts, after);
            round.is_some()
        });
        assert!(ok, "{what}: hosts {hosts:?} were not all running one round of {} within {timeout:?}\n{}", hosts.len(), self.logs());
        round.unwrap_or_default()
    }

    fn running_round(&self, hosts: &[usize], after: f64) -> Option<i64> {
        let mut rounds = Vec::new();
        for &h in hosts {
            let last = self.events(h).into_iter().rfind(|t| t.t >= after)?;
            if last.to != "running" {
                return None;
            }
            rounds.push(last.round?);
        }
        rounds.dedup();
        let [round] = rounds[..] else { return None };
        let world = hosts.len() as u32;
        let st = starts(self.path());
        let all = hosts.iter().all(|h| {
            st.iter().any(|s| s.node == format!("h{h}") && s.world_size == Some(world) && alive(s.pid))
        });
        all.then_some(round)
    }

    /// The group rank each node's worker had in the last start recorded with world size `world`.
    fn group_ranks(&self, hosts: &[usize], world: u32) -> HashMap<usize, Option<u32>> {
        let st = starts(self.path());
        hosts
            .iter()
            .map(|&h| {
                let g = st.iter().rfind(|s| s.node == format!("h{h}") && s.world_size == Some(world)).and_then(|s| s.group_rank);
                (h, g)
            })
            .collect()
    }

    /// Waits up to `timeout` for the agent on `host` to exit; remembers when (epoch seconds) and how.
    fn wait_exit(&mut self, host: usize, timeout: Duration) -> Option<(f64, Option<i32>)> {
        let node = self.node_mut(host);
        if node.exit.is_none() {
            if let Some(status) = node.agent.guard.wait_timeout(timeout) {
                node.exit = Some((now(), status.code()));
            }
        }
        node.exit
    }

    fn finish(&self) {
        std::fs::write(self.path().join("finish"), "").unwrap();
    }

    /// Every agent's event log and the tail of its stderr, for a failing test's message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let log = n.agent.log();
            let tail: Vec<&str> = log.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect();
            out.push_str(&format!("--- agent {} ({}):\n{}\n", n.name(), self.net.host(n.host).addr(), tail.join("\n")));
        }
        out.push_str(&format!("--- starts:\n{}", std::fs::read_to_string(self.path().join("starts")).unwrap_or_default()));
        for f in ["store.log", "e1.log", "e2.log", "e3.log"] {
            if let Ok(text) = std::fs::read_to_string(self.path().join(f)) {
                let tail: Vec<&str> = text.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
                out.push_str(&format!("--- {f}:\n{}\n", tail.join("\n")));
            }
        }
        out
    }

    /// The event logs relative to `t0`, one line an agent.
    fn timeline(&self, t0: f64) -> String {
        self.nodes.iter().map(|n| format!("{}: {}", n.name(), show(&self.events(n.host), t0))).collect::<Vec<_>>().join("\n")
    }
}

// ------------------------------------------------------------------------------------------------ etcd

/// Three etcd 3.4 members, member k (e1..e3) on host `hosts[k-1]`, listening on that host's address.
fn start_etcd(job: &mut Job, hosts: &[usize]) -> Vec<std::net::SocketAddr> {
    let bin = common::etcd::Etcd::V34.binary();
    let peer = |h: usize| format!("http://{}:{ETCD_PEER_PORT}", job.net.host(h).addr());
    let cluster: Vec<String> = hosts.iter().enumerate().map(|(k, &h)| format!("e{}={}", k + 1, peer(h))).collect();
    let cluster = cluster.join(",");
    for (k, &h) in hosts.iter().enumerate() {
        let name = format!("e{}", k + 1);
        let host = job.net.host(h);
        let client = format!("http://{}:{ETCD_CLIENT_PORT}", host.addr());
        let mut cmd = host.command(&bin);
        cmd.args(["--name", &name, "--data-dir"])
            .arg(job.path().join(format!("{name}.data")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer(h), "--initial-advertise-peer-urls", &peer(h)])
            .args(["--initial-cluster", &cluster, "--initial-cluster-token", &job.token])
            .args(["--initial-cluster-state", "new", "--log-level", "warn"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(job.path().join(format!("{name}.log"))).unwrap());
        job.services.push(Guard::spawn(&mut cmd));
    }
    let members: Vec<std::net::SocketAddr> = hosts.iter().map(|&h| job.net.host(h).socket(ETCD_CLIENT_PORT)).collect();
    let ok = eventually(Duration::from_secs(30), || {
        hosts.iter().zip(&members).all(|(&h, &m)| etcd_status(job.net, h, m).is_some_and(|(_, leader)| leader != "0"))
    });
    assert!(ok, "the etcd members did not elect a leader within 30 s\n{}", job.logs());
    members
}

/// `(member_id, leader)` from `POST /v3/maintenance/status` on `member`, asked from host `from`.
fn etcd_status(net: &Net, from: usize, member: std::net::SocketAddr) -> Option<(String, String)> {
    let body = net.host(from).http_post(member, "/v3/maintenance/status", "{}", Duration::from_secs(1)).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let text = |v: &Value| v.as_str().map(str::to_string).or_else(|| v.as_u64().map(|n| n.to_string()));
    Some((text(&v["header"]["member_id"])?, text(&v["leader"]).unwrap_or_else(|| "0".into())))
}

/// The index in `hosts` of the member that leads (its status says `leader` == its own `member_id`).
fn etcd_leader(net: &Net, hosts: &[usize], members: &[std::net::SocketAddr]) -> Option<usize> {
    hosts
        .iter()
        .zip(members)
        .position(|(&h, &m)| etcd_status(net, h, m).is_some_and(|(id, leader)| id == leader))
}

// ------------------------------------------------------------------------------------------------ checks

/// What a silent cut of `victim` did, read off the event logs, the exit and the /proc samples.
struct CutOutcome {
    /// The victim's transition to "stopping" after the cut, and the one that ended it.
    fence: Option<Tr>,
    stopped: Option<Tr>,
    /// Each survivor's first transition to "stopping" after the cut, and to "running" in a newer round.
    evicted: Vec<(usize, Option<Tr>)>,
    running: Vec<(usize, Option<Tr>)>,
    exit: Option<(f64, Option<i32>)>,
    split_brain: f64,
    split_pair: Option<(Seen, Seen)>,
}

/// Cuts `victim` once every agent on `hosts` runs one round, waits for the victim to give up and the
/// survivors to re-form, and gathers what happened.
fn cut_and_observe(job: &mut Job, hosts: &[usize], victim: usize, store_timeout: f64) -> (f64, CutOutcome) {
    observe_fault(job, hosts, victim, store_timeout, Net::cut)
}

/// `cut_and_observe` with another fault of the victim's link (`Net::cut_inbound`, `Net::link_down`).
fn observe_fault(
    job: &mut Job,
    hosts: &[usize],
    victim: usize,
    store_timeout: f64,
    fault: fn(&Net, usize) -> SystemTime,
) -> (f64, CutOutcome) {
    let tm = job.timings;
    let r0 = job.wait_running(hosts, 0.0, cluster::LONG, "the first round");
    // A moment in the round, so that heartbeats flow as usual when the cut comes.
    std::thread::sleep(Duration::from_secs(2));
    let t_cut = epoch(fault(job.net, victim));
    let survivors: Vec<usize> = hosts.iter().copied().filter(|h| *h != victim).collect();
    // The victim should be gone at fence + store_timeout; waited for with head-room, then the survivors.
    let exit_bound = tm.fence_after() + store_timeout + 10.0;
    job.wait_exit(victim, Duration::from_secs_f64(exit_bound));
    let reformed = eventually(Duration::from_secs_f64((t_cut + tm.w() + tm.i() + 15.0 - now()).max(1.0)), || {
        job.running_round(&survivors, t_cut).is_some_and(|r| r > r0)
    });
    if !reformed {
        eprintln!("the survivors {survivors:?} did not run a newer round than {r0}");
    }
    let after = |h: usize| job.events(h).into_iter().filter(|t| t.t >= t_cut).collect::<Vec<_>>();
    let v = after(victim);
    let fence_i = v.iter().position(|t| t.to == "stopping");
    let fence = fence_i.map(|i| v[i].clone());
    let stopped = fence_i.and_then(|i| v[i + 1..].iter().find(|t| t.from == "stopping").cloned());
    let evicted = survivors.iter().map(|&h| (h, after(h).into_iter().find(|t| t.to == "stopping"))).collect();
    let running = survivors
        .iter()
        .map(|&h| (h, after(h).into_iter().find(|t| t.to == "running" && t.round.is_some_and(|r| r > r0))))
        .collect();
    let seen = job.sampler.seen();
    let name = format!("h{victim}");
    let old: Vec<&Seen> = seen.iter().filter(|s| s.node == name && s.first < t_cut).collect();
    let new: Vec<&Seen> = seen.iter().filter(|s| s.node != name && s.first > t_cut).collect();
    let (split_brain, split_pair) = max_overlap(&old, &new);
    let exit = job.node(victim).exit;
    (t_cut, CutOutcome { fence, stopped, evicted, running, exit, split_brain, split_pair })
}

/// The spec's expectations of a silent cut (scenarios a, c and d), checked and reported.
fn check_cut(job: &Job, t_cut: f64, o: &CutOutcome, store_timeout: f64, checks: &mut Checks, report: &mut Report) {
    check_cut_with(job, t_cut, o, store_timeout, 0.0, checks, report)
}

/// `check_cut` with `late` more seconds for the survivors' re-form: a fault that lets the victim's
/// heartbeats reach the store for a while after it starts (an inbound-only cut) starts their W later.
fn check_cut_with(job: &Job, t_cut: f64, o: &CutOutcome, store_timeout: f64, late: f64, checks: &mut Checks, report: &mut Report) {
    let tm = job.timings;
    let reform = o.running.iter().map(|(_, t)| t.as_ref().map(|t| t.t - t_cut)).collect::<Option<Vec<f64>>>();
    let reform_max = reform.as_ref().map(|r| r.iter().copied().fold(0.0, f64::max));
    let exit_s = o.exit.map(|(t, _)| t - t_cut);
    report.set("split_brain_s", round3(o.split_brain));
    report.set("reform_s", reform_max.map(round3));
    report.set("cut_exit_s", exit_s.map(round3));
    report.set("cut_exit_code", o.exit.and_then(|(_, c)| c));
    report.set("fence_s", o.fence.as_ref().map(|f| round3(f.t - t_cut)));
    report.set(
        "evict_s",
        o.evicted.iter().filter_map(|(_, t)| t.as_ref().map(|t| round3(t.t - t_cut))).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x)))),
    );

    // The cut node fences: its workers stopped with reason "fenced", no later than W - min(I, W/2) after
    // the cut (its last acknowledged heartbeat was sent before it), and the stop ended.
    match &o.fence {
        None => checks.check(false, || "the cut node never went to \"stopping\" after the cut (no fence)".into()),
        Some(f) => {
            checks.check(f.reason.as_deref() == Some("fenced"), || {
                format!("the cut node's stop has reason {:?}, not \"fenced\"", f.reason)
            });
            let bound = tm.fence_after() + 1.0;
            checks.check(f.t - t_cut <= bound, || {
                format!("the cut node fenced {:.3} s after the cut; expected <= W - min(I, W/2) + 1 = {bound} s", f.t - t_cut)
            });
        }
    }
    // Its stop ended before any survivor started the new round's workers.
    let first_new = o.running.iter().filter_map(|(_, t)| t.as_ref().map(|t| t.t)).fold(f64::INFINITY, f64::min);
    match &o.stopped {
        None => checks.check(false, || "the cut node's stop never ended (no transition from \"stopping\")".into()),
        Some(s) => checks.check(s.t < first_new, || {
            format!(
                "the cut node's workers were stopped at {:+.3} s, not before the survivors' new round ran at {:+.3} s",
                s.t - t_cut,
                first_new - t_cut
            )
        }),
    }
    // The survivors evict it no earlier than W after its last beat (which reached the store at most I
    // before the cut), stop for a membership change, and run a newer round within W + I + 1 s.
    for (h, t) in &o.evicted {
        match t {
            None => checks.check(false, || format!("survivor h{h} never stopped its workers after the cut")),
            Some(t) => {
                let earliest = tm.w() - tm.i() - 0.1;
                checks.check(t.t - t_cut >= earliest, || {
                    format!("survivor h{h} evicted {:.3} s after the cut: earlier than W - I = {} s", t.t - t_cut, tm.w() - tm.i())
                });
                checks.check(t.reason.as_deref() == Some("membership change"), || {
                    format!("survivor h{h} stopped with reason {:?}, not \"membership change\"", t.reason)
                });
            }
        }
    }
    for (h, t) in &o.running {
        let bound = tm.w() + tm.i() + 1.0 + late;
        match t {
            None => checks.check(false, || format!("survivor h{h} never ran a newer round after the cut")),
            Some(t) => checks.check(t.t - t_cut <= bound, || {
                format!("survivor h{h} ran its new round {:.3} s after the cut; expected <= W + I + 1 (+ {late}) = {bound} s", t.t - t_cut)
            }),
        }
    }
    // No worker of the cut node alive together with a new-round worker of the survivors.
    checks.check(o.split_brain == 0.0, || {
        format!("split brain: {:.3} s of the cut node's old worker and a new one alive at once: {:?}", o.split_brain, o.split_pair)
    });
    // The cut node gives up: exit 3 at about fence + the store's timeout.
    match (o.exit, &o.fence) {
        (None, _) => checks.check(false, || {
            format!("the cut node did not exit within W + store timeout ({store_timeout} s) + 10 s of the cut")
        }),
        (Some((t, code)), fence) => {
            checks.check(code == Some(3), || format!("the cut node exited with {code:?}, not 3 (rendezvous incomplete)"));
            let from = fence.as_ref().map(|f| f.t).unwrap_or(t_cut + tm.fence_after());
            let bound = store_timeout + 2.0;
            checks.check(t - from <= bound, || {
                format!("the cut node exited {:.3} s after its fence; expected <= store timeout + 2 = {bound} s", t - from)
            });
        }
    }
}

/// The workers' MUSTER_ROUND (a fencing token): set on every worker, the round of a transition of its agent
/// to "running", and never smaller than that of a worker its node started before.
fn check_rounds(job: &Job, checks: &mut Checks) {
    let st = starts(job.path());
    checks.check(st.iter().all(|s| s.round.is_some()), || "a worker has no MUSTER_ROUND in its environment".into());
    for n in &job.nodes {
        let name = n.name();
        let ran: Vec<i64> = job.events(n.host).iter().filter(|t| t.to == "running").filter_map(|t| t.round).collect();
        let mine: Vec<i64> = st.iter().filter(|s| s.node == name).filter_map(|s| s.round).collect();
        for r in &mine {
            checks.check(ran.contains(r), || format!("{name}: a worker's MUSTER_ROUND={r} is no round its agent ran ({ran:?})"));
        }
        checks.check(mine.windows(2).all(|w| w[0] <= w[1]), || format!("{name}: MUSTER_ROUND went back: {mine:?}"));
    }
}

// ------------------------------------------------------------------------------------------------ tests

/// The harness itself: a cut host really cannot reach the others (and they cannot reach it) until healed,
/// an inbound cut lets its packets out only, a link down and loss do what they say, processes started in a
/// host are in its namespace and die with the net, and nothing is left behind.
#[test]
fn harness_a_cut_host_cannot_reach_the_others_until_healed() {
    let _serial = serial();
    let net = Net::new(3);
    let prefix = net.prefix().to_string();
    let listeners: Vec<std::net::TcpListener> = (0..3).map(|i| net.host(i).listen(7000)).collect();
    let to = |i: usize| net.host(i).socket(7000);
    let short = Duration::from_secs(1);
    let reach = |from: usize, to_host: usize| net.host(from).connect(to(to_host), short);
    for (a, b) in [(1, 0), (2, 0), (0, 2), (2, 1)] {
        reach(a, b).unwrap_or_else(|e| panic!("host {a} cannot reach host {b} before any fault: {e}"));
    }
    // Loopback works in every host; no host reaches the root namespace's loopback services by address.
    net.host(2).connect(std::net::SocketAddr::from(([127, 0, 0, 1], 9)), short).expect_err("nothing listens on lo:9");

    let silent = |r: std::io::Result<std::net::TcpStream>, what: &str| match r {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(e) => panic!("{what}: failed loudly ({e}); a silent cut only times out"),
        Ok(_) => panic!("{what}: connected through the fault"),
    };
    net.cut(2);
    let t = Instant::now();
    silent(reach(2, 0), "host 2 -> host 0 while cut");
    assert!(t.elapsed() >= Duration::from_millis(900), "the connect did not wait for its timeout");
    silent(reach(0, 2), "host 0 -> host 2 while cut");
    silent(reach(1, 2), "host 1 -> host 2 while cut");
    reach(1, 0).expect("hosts 1 and 0 still reach each other while host 2 is cut");
    net.heal();
    assert!(eventually(Duration::from_secs(5), || reach(2, 0).is_ok()), "host 2 -> host 0 after heal");
    reach(0, 2).expect("host 0 -> host 2 after heal");

    // Inbound only: host 2's datagrams arrive, the ones to it do not.
    let udp = |i: usize| net.host(i).run(move || std::net::UdpSocket::bind(("0.0.0.0", 7001)).unwrap());
    let (u0, u2) = (udp(0), udp(2));
    for s in [&u0, &u2] {
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    }
    net.cut_inbound(2);
    u2.send_to(b"out", net.host(0).socket(7001)).unwrap();
    let mut buf = [0u8; 16];
    let got = u0.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec());
    assert_eq!(got.ok().as_deref(), Some(&b"out"[..]), "host 2's datagram did not reach host 0 under an inbound cut");
    u0.send_to(b"in", net.host(2).socket(7001)).unwrap();
    assert!(u2.recv_from(&mut buf).is_err(), "a datagram reached host 2 under an inbound cut");
    silent(reach(2, 0), "host 2 -> host 0 under an inbound cut (the SYN-ACK is dropped)");
    net.heal();

    // Loss of 1 in 2 each way: about half of host 2's datagrams arrive, and the counters show the drops.
    net.loss(2, 2);
    u0.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut received = 0;
    // In batches, drained in between, so that the receive buffer never overflows.
    for _ in 0..8 {
        for _ in 0..50 {
            u2.send_to(b"x", net.host(0).socket(7001)).unwrap();
        }
        while u0.recv_from(&mut buf).is_ok() {
            received += 1;
        }
    }
    assert!((100..=300).contains(&received), "{received} of 400 datagrams arrived with 1-in-2 loss\n{}", net.ruleset());
    assert!(net.dropped() >= 100, "the loss rules counted {} drops\n{}", net.dropped(), net.ruleset());
    net.heal();

    // A link down: no carrier, nothing passes; up again after heal.
    net.link_down(2);
    assert!(reach(2, 0).is_err(), "host 2 -> host 0 with its link down");
    net.heal();
    assert!(eventually(Duration::from_secs(5), || reach(2, 0).is_ok()), "host 2 -> host 0 after the link is up");

    // A process started in a host is in that host's network namespace and is killed with the net.
    let mut child = net.host(1).command("sleep").arg("600").spawn().unwrap();
    let pid = child.id() as i32;
    assert!(eventually(Duration::from_secs(5), || net.pids().contains(&pid)), "sleep is not in the net: {:?}", net.pids());
    drop(listeners);
    drop(net);
    assert!(!alive(pid), "a process in a host outlived the net");
    let _ = child.wait();
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| !n.starts_with(&format!("{prefix}-"))), "namespaces left behind: {left:?}");
}

/// (a) c10d, three agents on three hosts, the store hosted by the agent on host 0; host 2 is cut silently.
#[test]
fn c10d_a_silently_cut_node_is_fenced_before_the_survivors_reform_and_exits_3() {
    let _serial = serial();
    let mut report = Report::new("c10d-cut");
    let net = Net::new(3);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d(&[0, 1, 2]);
    let store_timeout = FAST.read_timeout as f64;
    let (t_cut, o) = cut_and_observe(&mut job, &[0, 1, 2], 2, store_timeout);
    let mut checks = Checks::default();
    check_cut(&job, t_cut, &o, store_timeout, &mut checks, &mut report);
    check_rounds(&job, &mut checks);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
    job.finish();
    for h in [0, 1] {
        let code = job.wait_exit(h, cluster::LONG).map(|(_, c)| c);
        assert_eq!(code, Some(Some(0)), "survivor h{h} did not finish: {}", job.node(h).agent.log());
    }
}

/// (b) c10d, the same cut healed once the survivors run without the cut node, before it gives up: it comes
/// back as a newcomer, appended after the survivors, whose group ranks do not change.
#[test]
fn c10d_a_cut_node_healed_in_time_rejoins_as_a_newcomer_with_the_highest_group_rank() {
    let _serial = serial();
    let mut report = Report::new("c10d-cut-heal");
    let net = Net::new(3);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d(&[0, 1, 2]);
    job.wait_running(&[0, 1, 2], 0.0, cluster::LONG, "the first round");
    std::thread::sleep(Duration::from_secs(2));
    let t_cut = epoch(net.cut(2));
    let bound = FAST.w() + FAST.i() + 15.0;
    let r1 = job.wait_running(&[0, 1], t_cut, Duration::from_secs_f64(bound), "the survivors without h2");
    let reform = job.events(0).iter().chain(job.events(1).iter()).filter(|t| t.t >= t_cut && t.to == "running").map(|t| t.t - t_cut).fold(0.0, f64::max);
    report.set("reform_s", round3(reform));
    let ranks1 = job.group_ranks(&[0, 1], 2);
    let t_heal = epoch(net.heal());
    report.set("heal_s", round3(t_heal - t_cut));
    let rejoin_bound = Duration::from_secs_f64(FAST.read_timeout as f64 + FAST.join_timeout as f64);
    let ok = eventually(rejoin_bound, || job.running_round(&[0, 1, 2], t_heal).is_some_and(|r| r > r1));
    let mut checks = Checks::default();
    checks.check(ok, || format!("no round of all three nodes after the heal within {rejoin_bound:?}"));
    let rejoin = job.events(2).iter().find(|t| t.t >= t_heal && t.to == "running").map(|t| t.t - t_heal);
    report.set("rejoin_s", rejoin.map(round3));
    let v = job.events(2);
    let fence = v.iter().find(|t| t.t >= t_cut && t.to == "stopping");
    report.set("fence_s", fence.map(|f| round3(f.t - t_cut)));
    checks.check(fence.is_some_and(|f| f.reason.as_deref() == Some("fenced") && f.t < t_heal), || {
        format!("the cut node was not fenced before the heal: {fence:?}")
    });
    checks.check(alive(job.node(2).agent.guard.pid()), || "the cut node exited although it was healed in time".into());
    if ok {
        let ranks2 = job.group_ranks(&[0, 1, 2], 3);
        for h in [0, 1] {
            checks.check(ranks2[&h] == ranks1[&h], || {
                format!("survivor h{h}'s GROUP_RANK changed when the cut node came back: {:?} -> {:?}", ranks1[&h], ranks2[&h])
            });
        }
        checks.check(ranks2[&2] == Some(2), || format!("the returned node's GROUP_RANK is {:?}, not the highest (2)", ranks2[&2]));
        report.set("returned_group_rank", ranks2[&2]);
    }
    let seen = job.sampler.seen();
    let old: Vec<&Seen> = seen.iter().filter(|s| s.node == "h2" && s.first < t_cut).collect();
    let new: Vec<&Seen> = seen.iter().filter(|s| s.node != "h2" && s.first > t_cut).collect();
    let (split, pair) = max_overlap(&old, &new);
    report.set("split_brain_s", round3(split));
    checks.check(split == 0.0, || format!("split brain: {split:.3} s: {pair:?}"));
    check_rounds(&job, &mut checks);
    checks.assert_all(|| format!("timeline (s from the cut; heal at {:+.3}):\n{}\n{}", t_heal - t_cut, job.timeline(t_cut), job.logs()));
    job.finish();
    for h in [0, 1, 2] {
        let code = job.wait_exit(h, cluster::LONG).map(|(_, c)| c);
        assert_eq!(code, Some(Some(0)), "h{h} did not finish: {}", job.node(h).agent.log());
    }
}

/// (a') c10d, as (a) but only the packets to host 2 are dropped: it still sends (its heartbeats and, when
/// it gives up on a connection, its FIN reach the store), and hears nothing. It must fence before the
/// survivors run without it all the same.
#[test]
fn c10d_an_inbound_only_cut_node_is_fenced_before_the_survivors_reform() {
    let _serial = serial();
    let mut report = Report::new("c10d-cut-inbound");
    let net = Net::new(3);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d(&[0, 1, 2]);
    let store_timeout = FAST.read_timeout as f64;
    let (t_cut, o) = observe_fault(&mut job, &[0, 1, 2], 2, store_timeout, Net::cut_inbound);
    let mut checks = Checks::default();
    // Its beats reach the store until it gives up on its connection, about one heartbeat after the cut.
    check_cut_with(&job, t_cut, &o, store_timeout, FAST.i(), &mut checks, &mut report);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
}

/// (a'') c10d, as (a) with host 2's bridge port down (its link loses carrier) instead of a silent drop.
#[test]
fn c10d_a_node_whose_link_goes_down_is_fenced_before_the_survivors_reform() {
    let _serial = serial();
    let mut report = Report::new("c10d-link-down");
    let net = Net::new(3);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d(&[0, 1, 2]);
    let store_timeout = FAST.read_timeout as f64;
    let (t_cut, o) = observe_fault(&mut job, &[0, 1, 2], 2, store_timeout, Net::link_down);
    let mut checks = Checks::default();
    check_cut(&job, t_cut, &o, store_timeout, &mut checks, &mut report);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
}

/// (c) c10d with an external `muster store` on host 0 and agents on hosts 1-3; the host of the agent with
/// GROUP_RANK 0 is cut: never two RANK=0 workers alive at once, and the cut as in (a).
#[test]
fn c10d_external_store_the_group_rank_0_host_cut_never_two_rank_0_workers() {
    let _serial = serial();
    let mut report = Report::new("c10d-external-store-cut-rank0");
    let net = Net::new(4);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d_external(0, &[1, 2, 3]);
    job.wait_running(&[1, 2, 3], 0.0, cluster::LONG, "the first round");
    let ranks = job.group_ranks(&[1, 2, 3], 3);
    let victim = *ranks.iter().find(|(_, g)| **g == Some(0)).unwrap_or_else(|| panic!("no GROUP_RANK 0: {ranks:?}")).0;
    report.set("cut_host", victim);
    let store_timeout = FAST.read_timeout as f64;
    let (t_cut, o) = cut_and_observe(&mut job, &[1, 2, 3], victim, store_timeout);
    let mut checks = Checks::default();
    check_cut(&job, t_cut, &o, store_timeout, &mut checks, &mut report);
    let seen = job.sampler.seen();
    let rank0: Vec<&Seen> = seen.iter().filter(|s| s.rank == "0").collect();
    let (twice, pair) = max_overlap(&rank0, &rank0);
    report.set("rank0_overlap_s", round3(twice));
    report.set("split_brain_s", round3(twice.max(o.split_brain)));
    checks.check(twice == 0.0, || format!("two RANK=0 workers alive at once for {twice:.3} s: {pair:?}"));
    checks.check(rank0.len() >= 2, || format!("expected a RANK=0 worker in each round, saw {rank0:?}"));
    check_rounds(&job, &mut checks);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
    job.finish();
    for h in [1, 2, 3].into_iter().filter(|h| *h != victim) {
        let code = job.wait_exit(h, cluster::LONG).map(|(_, c)| c);
        assert_eq!(code, Some(Some(0)), "survivor h{h} did not finish: {}", job.node(h).agent.log());
    }
}

/// (d) etcd, three members on hosts 0-2, three agents on hosts 3-5; agent host 5 is cut: as in (a), and it
/// exits 3 at fence + join_timeout.
#[test]
fn etcd_a_silently_cut_agent_host_is_fenced_before_the_survivors_reform_and_exits_3() {
    let _serial = serial();
    let mut report = Report::new("etcd-cut");
    let net = Net::new(6);
    let endpoints = (0..3).map(|h| net.host(h).socket(ETCD_CLIENT_PORT).to_string()).collect::<Vec<_>>().join(",");
    let mut job = Job::new(&net, FAST, Rdzv::Etcd(endpoints), "2:3");
    start_etcd(&mut job, &[0, 1, 2]);
    for h in [3, 4, 5] {
        job.start_agent(h, "");
    }
    let store_timeout = FAST.join_timeout as f64;
    let (t_cut, o) = cut_and_observe(&mut job, &[3, 4, 5], 5, store_timeout);
    let mut checks = Checks::default();
    check_cut(&job, t_cut, &o, store_timeout, &mut checks, &mut report);
    check_rounds(&job, &mut checks);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
    job.finish();
    for h in [3, 4] {
        let code = job.wait_exit(h, cluster::LONG).map(|(_, c)| c);
        assert_eq!(code, Some(Some(0)), "survivor h{h} did not finish: {}", job.node(h).agent.log());
    }
}

/// (d) etcd, the leader's host cut: the two other members elect a new leader, requests fail over, and no
/// agent re-forms (no transition to "stopping" anywhere); the workers run on and the job finishes. The
/// leader's endpoint comes first in --rdzv-endpoint, so the member the agents talk to is the one cut (the
/// hard case: each agent's request to it waits out its attempt bound before failing over, during the
/// election).
#[test]
fn etcd_the_leader_host_cut_nothing_reforms_and_training_goes_on() {
    let _serial = serial();
    let mut report = Report::new("etcd-leader-cut");
    let net = Net::new(6);
    let timings = FAST;
    let mut job = Job::new(&net, timings, Rdzv::Etcd(String::new()), "2:3");
    let members = start_etcd(&mut job, &[0, 1, 2]);
    let first = etcd_leader(&net, &[0, 1, 2], &members).unwrap_or_else(|| panic!("no etcd leader\n{}", job.logs()));
    let mut order: Vec<usize> = vec![first];
    order.extend((0..3).filter(|h| *h != first));
    job.rdzv = Rdzv::Etcd(order.iter().map(|&h| members[h].to_string()).collect::<Vec<_>>().join(","));
    for h in [3, 4, 5] {
        job.start_agent(h, "");
    }
    job.wait_running(&[3, 4, 5], 0.0, cluster::LONG, "the first round");
    std::thread::sleep(Duration::from_secs(2));
    let leader = etcd_leader(&net, &[0, 1, 2], &members).unwrap_or_else(|| panic!("no etcd leader\n{}", job.logs()));
    report.set("cut_host", leader);
    report.set("leader_was_first_endpoint", leader == first);
    let workers_before: Vec<Seen> = job.sampler.seen().into_iter().filter(|s| !s.gone).collect();
    let starts_before = starts(job.path()).len();
    let t_cut = epoch(net.cut(leader));
    // Long enough for an eviction (W + I), an election and a fence to have shown: 3 W.
    std::thread::sleep(Duration::from_secs_f64(3.0 * timings.w()));
    let others: Vec<usize> = (0..3).filter(|h| *h != leader).collect();
    let new_leader = etcd_leader(&net, &others, &others.iter().map(|&h| members[h]).collect::<Vec<_>>());
    let mut checks = Checks::default();
    checks.check(new_leader.is_some(), || "the two members left did not elect a leader".into());
    for h in [3, 4, 5] {
        let stops: Vec<Tr> = job.events(h).into_iter().filter(|t| t.t >= t_cut && t.to == "stopping").collect();
        checks.check(stops.is_empty(), || format!("agent h{h} stopped its workers after the leader's cut: {}", show(&stops, t_cut)));
    }
    let still: Vec<Seen> = job.sampler.seen().into_iter().filter(|s| !s.gone).collect();
    checks.check(workers_before.iter().all(|w| still.iter().any(|s| s.pid == w.pid)), || {
        format!("workers ended after the leader's cut: before {workers_before:?}, now {still:?}")
    });
    checks.check(starts(job.path()).len() == starts_before, || "a worker was started after the leader's cut".into());
    report.set("split_brain_s", 0.0);
    checks.assert_all(|| format!("timeline (s from the cut):\n{}\n{}", job.timeline(t_cut), job.logs()));
    job.finish();
    for h in [3, 4, 5] {
        let code = job.wait_exit(h, cluster::LONG).map(|(_, c)| c);
        assert_eq!(code, Some(Some(0)), "h{h} did not finish: {}", job.node(h).agent.log());
    }
}
