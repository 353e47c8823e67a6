//! Observability as an operator sees it: a real Prometheus (Debian's `prometheus`, which `scripts/test.sh`
//! installs through `ensure_prometheus`) scraping two agents' `--metrics-port` while a worker crashes and a
//! peer is killed; `/healthz` through a GPU drain; the event log of the run; the Grafana dashboard's
//! queries against a live `/metrics`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::cluster::*;
use common::gpus::FakeNode;
use common::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A Prometheus server on loopback with its own data directory, scraping `targets` every 200 ms.
struct Prometheus {
    _guard: Guard,
    addr: String,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[String]) -> Prometheus {
        let config = dir.join("prometheus.yml");
        let list = targets.iter().map(|t| format!("'{t}'")).collect::<Vec<_>>().join(", ");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 200ms\n  scrape_timeout: 150ms\nscrape_configs:\n  - job_name: muster\n    \
                 static_configs:\n      - targets: [{list}]\n"
            ),
        )
        .expect("write the scrape config");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = std::process::Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log file"));
        let guard = Guard::spawn(&mut cmd);
        let ready = eventually(LONG, || http_get(&addr, "/-/ready").is_some_and(|(s, _)| s == 200));
        let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
        assert!(ready, "Prometheus (Debian's prometheus; scripts/lib.sh ensure_prometheus) did not start:\n{log}");
        Prometheus { _guard: guard, addr }
    }

    /// An instant query's result: each series' labels and value.
    fn query(&self, expr: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let Some((200, body)) = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(expr))) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let series = v["data"]["result"].as_array().cloned().unwrap_or_default();
        series
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string())).collect())
                    .unwrap_or_default();
                let value = s["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect()
    }

    /// The one value `expr` has now (None: no series, or several).
    fn value(&self, expr: &str) -> Option<f64> {
        match self.query(expr).as_slice() {
            [(_, v)] => Some(*v),
            _ => None,
        }
    }

    /// Waits until `expr` has the value `expected` (scrapes come every 200 ms).
    fn expect(&self, expr: &str, expected: f64) {
        let mut last = None;
        let ok = eventually(LONG, || {
            last = self.value(expr);
            last == Some(expected)
        });
        assert!(ok, "{expr}: expected {expected}, Prometheus says {last:?}");
    }

    /// The distinct successive values of `series` over the last 10 minutes, oldest first.
    fn history(&self, series: &str) -> Vec<f64> {
        let Some((200, body)) = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(&format!("{series}[10m]"))))
        else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mut out: Vec<f64> = Vec::new();
        for point in v["data"]["result"][0]["values"].as_array().cloned().unwrap_or_default() {
            let x: f64 = point[1].as_str().and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
            if out.last() != Some(&x) {
                out.push(x);
            }
        }
        out
    }
}

/// Percent-encoding for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Job {
    dir: tempfile::TempDir,
    run_id: String,
}

impl Job {
    fn new(tag: &str) -> Job {
        Job { dir: tempfile::tempdir().expect("tempdir"), run_id: format!("{tag}{}", std::process::id()) }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn events(&self, node: &str) -> PathBuf {
        self.path().join(format!("events-{node}.jsonl"))
    }

    /// An agent of the job: `--metrics-port 0`, its event log, two light workers (no torch).
    fn agent(&self, node: &str, nnodes: &str, endpoint: &str, conf: &str, extra: &[&str], env: &[(&str, String)]) -> Agent {
        let args = AgentArgs::c10d(nnodes, endpoint)
            .nproc(2)
            .conf(conf)
            .run_id(&self.run_id)
            .opts(["--max-restarts=3", "--shutdown-timeout=5", "--metrics-port=0"])
            .opt(format!("--event-log={}", self.events(node).display()))
            .opts(extra)
            .script(fixture("incident_worker.py"))
            .arg(self.path())
            .build();
        Agent::start_with_env(node, &args, env)
    }
}

/// The events of one agent's `--event-log`, each line parsed (the test fails on a line that is not JSON).
fn read_events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line in {}: {e}: {l}", path.display())))
        .collect()
}

fn timestamp(e: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    let ts = e["timestamp"].as_str().unwrap_or_else(|| panic!("no timestamp: {e}"));
    chrono::DateTime::parse_from_rfc3339(ts).unwrap_or_else(|err| panic!("bad timestamp {ts}: {err}"))
}

/// Every transition appears once, chained (each leaves the state the previous entered), with the run's
/// identifiers; each recovery's phases add up to its time, which matches the transitions' timestamps.
/// Returns the number of recoveries.
fn check_event_log(path: &Path, run_id: &str, last: Option<&str>) -> usize {
    let events = read_events(path);
    let transitions: Vec<&Value> = events.iter().filter(|e| e["name"] == "muster.agent.transition").collect();
    assert!(!transitions.is_empty(), "no transitions in {}", path.display());
    let mut state = "init";
    for t in &transitions {
        assert_eq!(t["from"], state, "each transition leaves the state the previous one entered: {t}");
        assert_eq!(t["run_id"], run_id, "{t}");
        for key in ["round", "restart_count", "group_rank", "spent_ms"] {
            assert!(t.get(key).is_some(), "{key} missing: {t}");
        }
        timestamp(t);
        state = t["to"].as_str().unwrap_or_default();
    }
    if let Some(last) = last {
        assert_eq!(state, last, "the run's last transition");
    }
    let recoveries: Vec<&Value> = events.iter().filter(|e| e["name"] == "muster.agent.recovery").collect();
    for r in &recoveries {
        let ms = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
        let sum = ms("detect_ms") + ms("stop_ms") + ms("rendezvous_ms") + ms("spawn_ms");
        assert!((sum - ms("recovery_ms")).abs() < 3.0, "phases {sum} ms vs recovery {} ms: {r}", ms("recovery_ms"));
        // On the wall clock: from the stop to the running transition, plus the detection before the stop.
        let at = events.iter().position(|e| std::ptr::eq(e, *r)).unwrap_or(0);
        let running = events[..at].iter().rev().find(|e| e["to"] == "running").expect("a running transition before");
        let stop = events[..at].iter().rev().find(|e| e["from"] == "running").expect("a stop before");
        let wall = (timestamp(running) - timestamp(stop)).num_microseconds().unwrap_or(0) as f64 / 1e3 + ms("detect_ms");
        assert!((wall - ms("recovery_ms")).abs() < 3.0, "timestamps say {wall} ms, recovery {} ms: {r}", ms("recovery_ms"));
    }
    recoveries.len()
}

#[test]
fn prometheus_sees_a_crash_and_a_peer_kill_as_they_happened() {
    let job = Job::new("obs");
    // A long last call: the first round waits for both nodes, so nothing but the two incidents re-forms it.
    let conf = "last_call_timeout=30";
    let mut a = job.agent("a", "1:2", "127.0.0.1:0", &format!("is_host=1,{conf}"), &[], &[]);
    let port = a.hosted_port();
    let mut b = job.agent("b", "1:2", &format!("127.0.0.1:{port}"), conf, &[], &[]);
    wait_world(job.path(), 4, 4);
    let (a_addr, b_addr) = (metrics_addr(&a), metrics_addr(&b));
    let prom = Prometheus::start(job.path(), &[a_addr.clone(), b_addr.clone()]);
    let on = |addr: &str, metric: &str| format!("{metric}{{instance=\"{addr}\"}}");
    for addr in [&a_addr, &b_addr] {
        prom.expect(&on(addr, "muster_world_size"), 4.0);
        prom.expect(&on(addr, "muster_local_workers"), 2.0);
    }

    // b's local rank 0 exits 1: b spends a restart; a follows the round b opens, spending none.
    std::fs::write(job.path().join("crash-b"), "").expect("crash marker");
    wait_world(job.path(), 4, 8);
    let restarts = |addr: &str, cause: &str| format!("muster_restarts_total{{instance=\"{addr}\",cause=\"{cause}\"}}");
    let changes =
        |addr: &str, cause: &str| format!("muster_membership_changes_total{{instance=\"{addr}\",cause=\"{cause}\"}}");
    let phase_count =
        |addr: &str, phase: &str| format!("muster_recovery_phase_seconds_count{{instance=\"{addr}\",phase=\"{phase}\"}}");
    prom.expect(&restarts(&b_addr, "worker_failure"), 1.0);
    prom.expect(&on(&b_addr, "muster_restarts_remaining"), 2.0);
    prom.expect(&format!("muster_worker_exits_total{{instance=\"{b_addr}\",exit_code=\"1\"}}"), 1.0);
    prom.expect(&restarts(&a_addr, "worker_failure"), 0.0);
    prom.expect(&changes(&a_addr, "round_changed"), 1.0);
    prom.expect(&format!("sum(muster_membership_changes_total{{instance=\"{b_addr}\"}})"), 0.0);
    for phase in ["detect", "stop", "rendezvous", "spawn"] {
        prom.expect(&phase_count(&a_addr, phase), 1.0);
        prom.expect(&phase_count(&b_addr, phase), 1.0);
    }
    prom.expect(&on(&b_addr, "muster_world_size"), 4.0);
    prom.expect(&on(&a_addr, "muster_rendezvous_rounds_total"), 2.0);

    // kill -9 of b: a re-forms alone, world 4 -> 2, no restart spent.
    // SAFETY: plain kill(2) on an agent this test started.
    unsafe { libc::kill(b.guard.pid(), libc::SIGKILL) };
    wait_world(job.path(), 2, 2);
    prom.expect(&on(&a_addr, "muster_world_size"), 2.0);
    prom.expect(&changes(&a_addr, "peer_lost"), 1.0);
    prom.expect(&format!("sum(muster_restarts_total{{instance=\"{a_addr}\"}})"), 0.0);
    prom.expect(&on(&a_addr, "muster_restarts_remaining"), 3.0);
    prom.expect(&phase_count(&a_addr, "spawn"), 2.0);
    prom.expect(&format!("muster_recovery_seconds_count{{instance=\"{a_addr}\",cause=\"membership change\"}}"), 2.0);
    prom.expect(&format!("up{{instance=\"{b_addr}\"}}"), 0.0);
    assert_eq!(prom.history(&on(&a_addr, "muster_world_size")), [4.0, 2.0], "a's world size over time");
    assert_eq!(prom.history(&on(&b_addr, "muster_world_size")), [4.0], "b's world size over time");

    std::fs::write(job.path().join("finish"), "").expect("finish marker");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(check_event_log(&job.events("a"), &job.run_id, Some("succeeded")), 2, "a recovered twice");
    assert_eq!(check_event_log(&job.events("b"), &job.run_id, None), 1, "b recovered once before it was killed");
    let _ = b.exit_code(LONG);
}

/// Polls `addr`'s `/healthz` until its answer satisfies `want`; returns the last answer.
fn health_until(addr: &str, want: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let mut last = (0, String::new());
    let deadline = Instant::now() + LONG;
    while Instant::now() < deadline {
        if let Some((status, body)) = http_get(addr, "/healthz") {
            last = (status, body);
            if want(last.0, &last.1) {
                return last;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("/healthz on {addr} never answered as expected; last: {last:?}");
}

#[test]
fn healthz_goes_unhealthy_when_a_node_drains_and_stays_healthy_while_the_other_reforms() {
    let job = Job::new("health");
    let b_gpus = FakeNode::new(job.path(), "b", 2, &[]);
    let release = job.path().join("release-hook");
    // The hook holds b in its drain until the test has seen /healthz there.
    let hook = format!("for i in $(seq 600); do [ -e {} ] && exit 0; sleep 0.1; done", release.display());
    // Two nodes at least: alone, a waits in the rendezvous (re-forming) until c comes.
    let conf = "last_call_timeout=30";
    let mut a = job.agent("a", "2:2", "127.0.0.1:0", &format!("is_host=1,{conf}"), &[], &[]);
    let port = a.hosted_port();
    let endpoint = format!("127.0.0.1:{port}");
    let mut b = job.agent("b", "2:2", &endpoint, conf, &["--on-node-fault", &hook], &b_gpus.env());
    wait_world(job.path(), 4, 4);
    let (a_addr, b_addr) = (metrics_addr(&a), metrics_addr(&b));
    for addr in [&a_addr, &b_addr] {
        let (status, body) = health_until(addr, |_, body| body.contains("running"));
        assert_eq!((status, body.trim()), (200, "ok running"));
    }

    b_gpus.inject(0, "xid 0 79");
    let (status, body) = health_until(&b_addr, |status, _| status != 200);
    assert_eq!(status, 503, "b drains: {body}");
    assert!(body.starts_with("unhealthy"), "{body}");
    let (status, body) = health_until(&a_addr, |_, body| body.contains("rendezvous") || body.contains("restarting"));
    assert_eq!(status, 200, "a re-forming is healthy: {body}");
    std::fs::write(&release, "").expect("release the hook");
    assert_eq!(b.exit_code(LONG), Some(75), "{}", b.log());

    let mut c = job.agent("c", "2:2", &endpoint, conf, &[], &[]);
    let (status, _) = health_until(&a_addr, |_, body| body.contains("running"));
    assert_eq!(status, 200);
    std::fs::write(job.path().join("finish"), "").expect("finish marker");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(c.exit_code(LONG), Some(0), "{}", c.log());
    let b_events = read_events(&job.events("b"));
    assert!(
        b_events.iter().any(|e| e["name"] == "muster.gpu.fault" && e["xid"] == 79 && e["run_id"] == job.run_id.as_str()),
        "b's event log has the fault"
    );
    check_event_log(&job.events("b"), &job.run_id, Some("drained"));
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_muster_serves() {
    let dashboard = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/grafana/muster.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&dashboard).expect("the dashboard")).expect("JSON");
    let mut exprs = Vec::new();
    collect_exprs(&json, &mut exprs);
    assert!(!exprs.is_empty(), "no queries in {}", dashboard.display());
    // A GPU fault that restarts the group gives every family a series (faults, worker exits, restarts).
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = FakeNode::new(dir.path(), "a", 1, &[]);
    let args = ["--metrics-port=0", "--max-restarts=1", "--no-python", "sleep", "1000"].map(String::from);
    let agent = Agent::start_with_env("a", &args, &gpus.env());
    let addr = metrics_addr(&agent);
    gpus.inject(0, "xid 0 13");
    let mut text = String::new();
    let all = eventually(LONG, || {
        text = http_get(&addr, "/metrics").map(|(_, body)| body).unwrap_or_default();
        text.contains("muster_gpu_faults_total{") && text.contains("muster_worker_exits_total{")
    });
    assert!(all, "no fault or worker exit in /metrics after XID 13:\n{text}");
    let served = muster::observe::metrics::names(&text);
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(served.contains(&name), "the dashboard queries {name} ({expr}); /metrics has {served:?}");
        }
    }
}

/// Every `expr` of every panel target.
fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            m.values().for_each(|x| collect_exprs(x, out));
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

/// The `muster_*` names a PromQL expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("muster_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn bad_observability_flags_are_one_line_and_exit_2_with_nothing_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("started");
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let in_use = held.local_addr().expect("addr").port().to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["--metrics-port=70000"], "--metrics-port"),
        (&["--metrics-port=0", "--metrics-host=localhost"], "--metrics-host"),
        (&["--metrics-port", &in_use], &in_use),
        (&["--event-log=/nonexistent/dir/events.jsonl"], "--event-log"),
        (&["--log-format=yaml"], "--log-format"),
    ];
    for (flags, named) in cases {
        let out = run(muster().args(flags).args(["--no-python", "touch"]).arg(&marker), LONG);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", out.stderr);
        let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{flags:?}: one line: {}", out.stderr);
        assert!(lines[0].contains(named), "{flags:?}: {}", lines[0]);
        assert!(!marker.exists(), "{flags:?}: a worker started");
    }
}

#[test]
fn json_logs_carry_the_run_id_round_and_restart() {
    let out = run(
        muster().args(["--log-format=json", "--rdzv-id=jsonlogs", "--max-restarts=1", "--no-python", "false"]),
        LONG,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let logs: Vec<Value> = out.stderr.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let failed: Vec<&Value> =
        logs.iter().filter(|l| l["fields"]["message"].as_str().is_some_and(|m| m.starts_with("failed (exitcode"))).collect();
    assert!(!failed.is_empty(), "no worker failure logged as JSON:\n{}", out.stderr);
    let restarts: Vec<i64> = failed.iter().filter_map(|l| l["span"]["restart"].as_i64()).collect();
    assert_eq!(restarts, [0, 1], "the restart of each failure: {failed:?}");
    assert!(failed.iter().all(|l| l["span"]["run_id"].as_str().is_some() && l["span"]["round"].as_i64().is_some()));
}
