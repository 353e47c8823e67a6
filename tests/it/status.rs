//! `muster status` against a real job: three agents (the binary; c10d on loopback, or a real etcd) with torch
//! workers that stay alive; what it prints, how it follows a kill -9 of an agent, and how it fails.

use crate::common;

use std::time::Duration;

use common::cluster::*;
use common::etcd::EtcdCluster;
use common::*;
use serde_json::Value;

const STATUS_RUN: Duration = Duration::from_secs(30);

/// One job as `muster status` is pointed at it: the agents' backend, endpoint and run id.
struct Job {
    backend: &'static str,
    endpoint: String,
    run_id: String,
    dir: tempfile::TempDir,
}

impl Job {
    fn new(backend: &'static str, endpoint: &str) -> Job {
        let run_id = format!("status{backend}{}", std::process::id());
        Job { backend, endpoint: endpoint.to_string(), run_id, dir: tempfile::tempdir().unwrap() }
    }

    fn agent_args(&self, endpoint: &str, conf: &str) -> Vec<String> {
        AgentArgs::rdzv(self.backend, "2:3", endpoint)
            .nproc(1)
            .run_id(&self.run_id)
            .conf(conf)
            .opt("--shutdown-timeout=5")
            .script(fixture("worker.py"))
            .arg(self.dir.path())
            .arg("sleep")
            .build()
    }

    fn status_of(&self, run_id: &str, extra: &[&str]) -> Output {
        let mut cmd = muster();
        cmd.args(["status", "--rdzv-backend", self.backend, "--rdzv-endpoint", &self.endpoint, "--rdzv-id", run_id]).args(extra);
        run(&mut cmd, STATUS_RUN)
    }

    fn status(&self, extra: &[&str]) -> Output {
        self.status_of(&self.run_id, extra)
    }

    /// The status as JSON once `f` holds of it (polled; the test fails after `LONG`).
    fn status_until(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let mut last = Value::Null;
        let ok = eventually(LONG, || {
            let out = self.status(&["--format", "json"]);
            last = serde_json::from_str(&out.stdout).unwrap_or(Value::String(out.stderr));
            f(&last)
        });
        assert!(ok, "status never showed {what}; last: {last}");
        last
    }
}

fn members(s: &Value) -> Vec<&Value> {
    s["nodes"].as_array().map(|n| n.iter().filter(|r| !r["group_rank"].is_null()).collect()).unwrap_or_default()
}

/// The agent's pid from its node id (`<addr>_<pid>_<n>`).
fn pid_of(row: &Value) -> i32 {
    let id = row["node"].as_str().unwrap_or_default();
    id.rsplit('_').nth(1).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("node id {id}"))
}

fn all_running(s: &Value, n: usize) -> bool {
    s["phase"] == "running" && members(s).len() == n && members(s).iter().all(|m| m["state"] == "running")
}

fn sorted(mut v: Vec<i32>) -> Vec<i32> {
    v.sort();
    v
}

/// Every agent is a member with its group rank, address, workers and state, as JSON and as the table.
fn shows_every_member(job: &Job, agents: &[Agent]) {
    // A member beats from its round's seal on, the first within half an interval.
    let beating = |s: &Value| members(s).iter().all(|m| m["heartbeat_age_ms"].as_u64().is_some());
    let before = job.status_until("three running members, each beating", |s| all_running(s, 3) && beating(s));
    // Polling status is no member's business: the job is still in its first round.
    assert_eq!((before["round"].as_u64(), before["sealed_round"].as_u64()), (Some(0), Some(0)), "{before}");
    let mut ranks: Vec<(i32, u64)> = members(&before).iter().map(|m| (pid_of(m), m["group_rank"].as_u64().unwrap())).collect();
    ranks.sort_by_key(|(_, r)| *r);
    assert_eq!(ranks.iter().map(|(_, r)| *r).collect::<Vec<_>>(), [0, 1, 2], "{before}");
    let pids = agents.iter().map(|a| a.guard.pid()).collect();
    assert_eq!(sorted(ranks.iter().map(|(p, _)| *p).collect()), sorted(pids), "every agent is a member: {before}");
    for m in members(&before) {
        assert!(m["addr"].as_str().is_some_and(|a| !a.is_empty() && m["node"].as_str().unwrap_or_default().starts_with(a)), "{m}");
        assert_eq!((m["nproc"].as_u64(), m["restarts"].as_u64()), (Some(1), Some(0)), "{m}");
        assert!(m["heartbeat_age_ms"].as_u64().is_some_and(|age| age < 60_000), "{m}");
    }

    // The table: a heading, then one row per member with its group rank and state.
    let table = job.status(&[]);
    assert_eq!(table.status.code(), Some(0), "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    let heading = format!("job {} at {}: round 0, running, 3 member(s), world size 3", job.run_id, job.endpoint);
    assert!(lines[0].starts_with(&heading), "{}", table.stdout);
    assert_eq!(lines[1], "job restarts: 0 in all (no --job-max-restarts)", "{}", table.stdout);
    assert!(lines[2].starts_with("GROUP_RANK  NODE"), "{}", table.stdout);
    for (pid, rank) in &ranks {
        let row = lines.iter().find(|l| l.contains(&format!("_{pid}_"))).unwrap_or_else(|| panic!("{pid}: {}", table.stdout));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cells[0], cells[3], cells[4], cells[5]), (rank.to_string().as_str(), "1", "running", "0"), "{row}");
    }
}

/// kill -9 of `agents[victim]`: status shows the next round running without it, the others its members.
fn follows_a_kill_9(job: &Job, agents: &mut Vec<Agent>, victim: usize) {
    let victim = agents.remove(victim);
    let gone = victim.guard.pid();
    // SAFETY: plain kill(2) of a process this test started.
    unsafe { libc::kill(gone, libc::SIGKILL) };
    let after = job.status_until("a round of two without the killed agent", |s| {
        s["round"].as_u64().is_some_and(|r| r > 0) && all_running(s, 2) && members(s).iter().all(|m| pid_of(m) != gone)
    });
    let survivors = agents.iter().map(|a| a.guard.pid()).collect();
    assert_eq!(sorted(members(&after).iter().map(|m| pid_of(m)).collect()), sorted(survivors), "{after}");
    assert_eq!(after["world_size"], 2, "{after}");
    drop(victim);
}

fn stop(agents: &mut [Agent]) {
    // The store's host (the first agent, with c10d) last: the others end by themselves (exit 3) once it is gone.
    for a in agents.iter_mut().rev() {
        // SAFETY: plain kill(2) of a process this test started.
        unsafe { libc::kill(a.guard.pid(), libc::SIGTERM) };
        assert_eq!(a.exit_code(LONG), Some(143), "{}", a.log());
    }
}

/// A run id the store does not have: exit 1, one line naming it and the endpoint.
fn unknown_run_is_one_line(job: &Job) {
    let unknown = job.status_of("no-such-job", &[]);
    assert_eq!(unknown.status.code(), Some(1), "{}", unknown.stderr);
    assert_eq!(unknown.stderr.lines().count(), 1, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("no job 'no-such-job'") && unknown.stderr.contains(&job.endpoint), "{}", unknown.stderr);
}

/// Nothing answers at the endpoint: exit 3, one line naming it, nothing on stdout.
fn down_is_one_line(job: &Job) {
    let down = job.status(&["--timeout", "1"]);
    assert_eq!(down.status.code(), Some(3), "{}", down.stderr);
    assert_eq!(down.stderr.lines().count(), 1, "{}", down.stderr);
    let line = format!("muster status: error: the rendezvous store at {} is unreachable", job.endpoint);
    assert!(down.stderr.starts_with(&line), "{}", down.stderr);
    assert!(down.stdout.is_empty(), "{}", down.stdout);
}

#[test]
fn status_shows_every_member_follows_a_kill_9_and_fails_in_one_line() {
    let mut job = Job::new("c10d", "");
    let a = Agent::start("a", &job.agent_args("127.0.0.1:0", "is_host=1,last_call_timeout=5"));
    job.endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let b = Agent::start("b", &job.agent_args(&job.endpoint, "last_call_timeout=5"));
    let c = Agent::start("c", &job.agent_args(&job.endpoint, "last_call_timeout=5"));
    let mut agents = vec![a, b, c];
    shows_every_member(&job, &agents);
    // A member that does not host the store.
    follows_a_kill_9(&job, &mut agents, 2);
    unknown_run_is_one_line(&job);
    stop(&mut agents);
    down_is_one_line(&job);
}

/// The same with the rendezvous in etcd: every agent is equal, a killed one is gone when its lease ends
/// (keep_alive_interval × keep_alive_max_attempt), and etcd down is one line, exit 3.
#[test]
fn status_of_an_etcd_job_shows_every_member_follows_a_kill_9_and_fails_in_one_line() {
    let etcd = EtcdCluster::start(1, false);
    let job = Job::new("etcd", &etcd.endpoints());
    let conf = "keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=5";
    let mut agents: Vec<Agent> = ["a", "b", "c"].iter().map(|n| Agent::start(n, &job.agent_args(&job.endpoint, conf))).collect();
    shows_every_member(&job, &agents);
    follows_a_kill_9(&job, &mut agents, 0);
    unknown_run_is_one_line(&job);
    stop(&mut agents);
    etcd.stop_all();
    down_is_one_line(&job);
}
