//! A memory of lemon hosts (`--exclude-after K[/WINDOW]`): a host that keeps failing the job is refused at
//! its next join (exit 75, one line listing its incidents) while the job goes on without it; `muster status`
//! lists it; `muster status --readmit HOST` lets it back in. Each agent has a host of its own on loopback
//! (`--local-addr 127.0.0.N`: the host is the node's address).

use crate::common;

use std::path::Path;

use common::cluster::*;
use common::*;

fn agent(name: &str, host: &str, endpoint: &str, run_id: &str, dir: &Path) -> Agent {
    let conf = if endpoint.ends_with(":0") { "is_host=1,last_call_timeout=1" } else { "last_call_timeout=1" };
    let args = AgentArgs::c10d("2:3", endpoint)
        .nproc(1)
        .conf(conf)
        .run_id(run_id)
        .opts(["--max-restarts=3", "--exclude-after=2/1h", "--shutdown-timeout=5", "--local-addr", host])
        .script(fixture("incident_worker.py"))
        .arg(dir)
        .build();
    Agent::start(name, &args)
}

fn status(endpoint: &str, run_id: &str, extra: &[&str]) -> String {
    let out = run(muster().args(["status", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]).args(extra), LONG);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    out.stdout
}

/// Waits for the `n`th world of three (each re-formation starts a new one).
fn crash_and_reform(dir: &Path, node: &str, worlds: usize) {
    std::fs::write(dir.join(format!("crash-{node}")), "").expect("crash");
    wait_world(dir, 3, 3 * worlds);
}

#[test]
fn a_host_whose_worker_fails_twice_is_kept_out_and_one_that_failed_once_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_id = format!("lemon{}", std::process::id());
    let a = agent("a", "127.0.0.1", "127.0.0.1:0", &run_id, dir.path());
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let b = agent("b", "127.0.0.2", &endpoint, &run_id, dir.path());
    let c = agent("c", "127.0.0.3", &endpoint, &run_id, dir.path());
    let mut agents = vec![a, b, c];
    wait_world(dir.path(), 3, 3);
    crash_and_reform(dir.path(), "c", 2);
    crash_and_reform(dir.path(), "b", 3);
    std::fs::write(dir.path().join("crash-b"), "").expect("crash");
    let b = &mut agents[1];
    assert_eq!(b.exit_code(LONG), Some(75), "the lemon is refused as unhealthy: {}", b.log());
    let log = b.log();
    let line = log.lines().find(|l| l.contains("this host (127.0.0.2) caused 2 incidents")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("(--exclude-after 2/1h): round 1 worker_failure at ") && line.contains("; round 2 worker_failure at "), "{line}");
    assert!(line.contains("--readmit 127.0.0.2"), "{line}");
    let without = wait_world(dir.path(), 2, 2);
    assert!(without.iter().all(|s| s.node != "b"), "{without:?}");
    let shown = status(&endpoint, &run_id, &[]);
    assert!(shown.contains("kept out: 127.0.0.2 (--exclude-after 2/1h): round 1 worker_failure"), "{shown}");
    assert!(!shown.contains("kept out: 127.0.0.3"), "the control host failed once: {shown}");
    // Repaired: let back in, it joins again.
    let readmitted = status(&endpoint, &run_id, &["--readmit", "127.0.0.2"]);
    assert!(readmitted.starts_with("readmitted 127.0.0.2: 2 incident(s) forgotten"), "{readmitted}");
    assert!(!readmitted.contains("kept out:"), "{readmitted}");
    agents[1] = agent("b", "127.0.0.2", &endpoint, &run_id, dir.path());
    wait_world(dir.path(), 3, 12);
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    for agent in &mut agents {
        assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
    }
}
