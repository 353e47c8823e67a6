//! The health gate before every join: a failing check drains the node before it joins (exit 75, the hook
//! with the check's name), a healthy node passes the default checks (every other test).

use crate::common;

use common::cluster::*;
use common::*;

/// `/dev/shm` cannot hold what `--gate-shm-min` asks per worker: the shm check fails, no worker starts,
/// the hook gets the check's name, exit 75.
#[test]
fn a_failing_check_drains_the_node_before_any_worker_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hook_out = dir.path().join("hook.env");
    let hook = format!("env | grep '^MUSTER_FAULT_' > {}", hook_out.display());
    let args = AgentArgs::c10d(1, "127.0.0.1:0")
        .nproc(2)
        .conf("is_host=1")
        .opts(["--gate-shm-min=999999999", "--on-node-fault", &hook])
        .script(fixture("incident_worker.py"))
        .arg(dir.path())
        .build();
    let mut agent = Agent::start("a", &args);
    assert_eq!(agent.exit_code(LONG), Some(75), "{}", agent.log());
    assert!(agent.log().contains("health check 'shm' failed: /dev/shm has"), "{}", agent.log());
    let env = std::fs::read_to_string(&hook_out).expect("the hook ran");
    assert!(env.contains("MUSTER_FAULT_KIND=shm") && env.contains("MUSTER_FAULT_DETAIL=health check 'shm' failed"), "{env}");
    assert!(starts(dir.path()).is_empty(), "a worker started on a node that failed its gate");
}

/// `muster doctor` prints the gate as a table, every default check ok on this machine.
#[test]
fn doctor_prints_the_health_gate_as_a_table() {
    let out = run(muster().args(["doctor", "--listen=0", "--gate-checks=storage,shm,network"]), LONG);
    for check in ["storage", "shm", "network"] {
        assert!(out.stdout.lines().any(|l| l.starts_with(check) && l.contains(" ok ")), "{check}: {}", out.stdout);
    }
}
