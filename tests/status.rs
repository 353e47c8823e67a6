//! `muster status` against a real job: three agents (the binary, c10d on loopback) with torch workers that
//! stay alive; what it prints, how it follows a kill -9 of an agent, and how it fails.

mod common;

use std::time::Duration;

use common::cluster::*;
use common::*;
use serde_json::Value;

const STATUS_RUN: Duration = Duration::from_secs(30);

fn agent_args(endpoint: &str, run_id: &str, conf: &str, dir: &std::path::Path) -> Vec<String> {
    vec![
        "--nnodes=2:3".into(),
        "--nproc-per-node=1".into(),
        "--rdzv-backend=c10d".into(),
        format!("--rdzv-endpoint={endpoint}"),
        format!("--rdzv-id={run_id}"),
        format!("--rdzv-conf={conf}"),
        "--shutdown-timeout=5".into(),
        fixture("worker.py").display().to_string(),
        dir.display().to_string(),
        "sleep".into(),
    ]
}

fn status(endpoint: &str, run_id: &str, extra: &[&str]) -> Output {
    let mut cmd = muster();
    cmd.args(["status", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]).args(extra);
    run(&mut cmd, STATUS_RUN)
}

/// The status as JSON once `f` holds of it (polled; the test fails after `LONG`).
fn status_until(endpoint: &str, run_id: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let ok = eventually(LONG, || {
        let out = status(endpoint, run_id, &["--format", "json"]);
        last = serde_json::from_str(&out.stdout).unwrap_or(Value::String(out.stderr));
        f(&last)
    });
    assert!(ok, "status never showed {what}; last: {last}");
    last
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

#[test]
fn status_shows_every_member_follows_a_kill_9_and_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let run_id = format!("status{}", std::process::id());
    let a = Agent::start("a", &agent_args("127.0.0.1:0", &run_id, "is_host=1,last_call_timeout=5", dir.path()));
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let b = Agent::start("b", &agent_args(&endpoint, &run_id, "last_call_timeout=5", dir.path()));
    let c = Agent::start("c", &agent_args(&endpoint, &run_id, "last_call_timeout=5", dir.path()));
    let mut agents = vec![a, b, c];
    let pids: Vec<i32> = agents.iter().map(|a| a.guard.pid()).collect();

    let before = status_until(&endpoint, &run_id, "three running members", |s| all_running(s, 3));
    // Polling status is no member's business: the job is still in its first round.
    assert_eq!((before["round"].as_u64(), before["sealed_round"].as_u64()), (Some(0), Some(0)), "{before}");
    let mut ranks: Vec<(i32, u64)> = members(&before).iter().map(|m| (pid_of(m), m["group_rank"].as_u64().unwrap())).collect();
    ranks.sort_by_key(|(_, r)| *r);
    assert_eq!(ranks.iter().map(|(_, r)| *r).collect::<Vec<_>>(), [0, 1, 2], "{before}");
    let mut seen: Vec<i32> = ranks.iter().map(|(p, _)| *p).collect();
    seen.sort();
    let mut started = pids.clone();
    started.sort();
    assert_eq!(seen, started, "every agent is a member: {before}");
    for m in members(&before) {
        assert!(m["addr"].as_str().is_some_and(|a| !a.is_empty() && m["node"].as_str().unwrap_or_default().starts_with(a)), "{m}");
        assert_eq!((m["nproc"].as_u64(), m["restarts"].as_u64()), (Some(1), Some(0)), "{m}");
        assert!(m["heartbeat_age_ms"].as_u64().is_some_and(|age| age < 60_000), "{m}");
    }

    // The table: a heading, then one row per member with its group rank and state.
    let table = status(&endpoint, &run_id, &[]);
    assert_eq!(table.status.code(), Some(0), "{}", table.stderr);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with(&format!("job {run_id} at {endpoint}: round 0, running, 3 member(s), world size 3")), "{}", table.stdout);
    assert!(lines[1].starts_with("GROUP_RANK  NODE"), "{}", table.stdout);
    for (pid, rank) in &ranks {
        let row = lines.iter().find(|l| l.contains(&format!("_{pid}_"))).unwrap_or_else(|| panic!("{pid}: {}", table.stdout));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cells[0], cells[3], cells[4], cells[5]), (rank.to_string().as_str(), "1", "running", "0"), "{row}");
    }

    // kill -9 of a member that does not host the store: the next round runs without it.
    let victim = agents.remove(2);
    let gone = victim.guard.pid();
    // SAFETY: plain kill(2).
    unsafe { libc::kill(gone, libc::SIGKILL) };
    let after = status_until(&endpoint, &run_id, "a round of two without the killed agent", |s| {
        s["round"].as_u64().is_some_and(|r| r > 0) && all_running(s, 2) && members(s).iter().all(|m| pid_of(m) != gone)
    });
    let mut survivors: Vec<i32> = members(&after).iter().map(|m| pid_of(m)).collect();
    survivors.sort();
    let mut want = vec![pids[0], pids[1]];
    want.sort();
    assert_eq!(survivors, want, "{after}");
    assert_eq!(after["world_size"], 2, "{after}");
    drop(victim);

    // A run id the store does not have, then an endpoint nobody listens on: one line, non-zero.
    let unknown = status(&endpoint, "no-such-job", &[]);
    assert_eq!(unknown.status.code(), Some(1), "{}", unknown.stderr);
    assert_eq!(unknown.stderr.lines().count(), 1, "{}", unknown.stderr);
    assert!(unknown.stderr.contains("no job 'no-such-job'") && unknown.stderr.contains(&endpoint), "{}", unknown.stderr);
    for a in &mut agents {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(a.guard.pid(), libc::SIGTERM) };
        assert_eq!(a.exit_code(LONG), Some(143), "{}", a.log());
    }
    let down = status(&endpoint, &run_id, &["--timeout", "1"]);
    assert_eq!(down.status.code(), Some(3), "{}", down.stderr);
    assert_eq!(down.stderr.lines().count(), 1, "{}", down.stderr);
    assert!(down.stderr.starts_with(&format!("muster status: error: the rendezvous store at {endpoint} is unreachable")), "{}", down.stderr);
    assert!(down.stdout.is_empty(), "{}", down.stdout);
}
