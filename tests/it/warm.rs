//! Warm spares (`--warm-spares`): a restarted worker comes from a spare interpreter that already imported the
//! listed modules, and sees exactly what a cold worker sees. `tests/fixtures/warm_worker.py` records what
//! each worker sees; `warm_marker.py` (the last module the spares import) marks each spare.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use muster::supervisor::env::PER_START;
use serde_json::Value;

fn records(dir: &Path) -> Vec<Value> {
    let mut all: Vec<Value> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("record-"))
        .map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .collect();
    all.sort_by_key(|r| (env(r, "TORCHELASTIC_RESTART_COUNT"), env(r, "LOCAL_RANK")));
    all
}

fn env(record: &Value, key: &str) -> String {
    record["env"][key].as_str().unwrap_or_default().to_string()
}

fn spare_pids(dir: &Path) -> Vec<i64> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_prefix("spare-").and_then(|p| p.parse().ok()))
        .collect()
}

fn warm_job(out: &Path) -> std::process::Command {
    let mut cmd = muster();
    cmd.env("MUSTER_TEST_WARM_DIR", out)
        .env_remove("PYTHONPATH")
        .args(["--standalone", "--nproc-per-node=2", "--warm-spares-delay=0"]);
    cmd
}

/// For each way of naming the entrypoint, the restarted (warm) workers see what the first (cold) ones saw:
/// argv, sys.path[0], __file__, __main__'s names, unbuffered stdio, the whole environment apart from the
/// per-start values; their output reaches the new attempt's log files; their exit code is the worker's.
#[test]
fn a_warm_worker_sees_what_a_cold_one_sees() {
    let modes: &[(&str, &[&str])] = &[
        ("script", &[]),
        ("module", &["-m", "warm_worker"]),
        ("run-path", &["--run-path"]),
        // No script directory on sys.path (the modules come from PYTHONPATH then).
        ("safe-path", &[]),
    ];
    for (mode, entry) in modes {
        let out = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        let script = fixture("warm_worker.py");
        let mut cmd = warm_job(out.path());
        cmd.current_dir(fixture("")).args(["--max-restarts=1", "--warm-spares=json,warm_marker", "--redirects=3"]);
        cmd.arg("--log-dir").arg(logs.path());
        if *mode == "safe-path" {
            // sys.path[0] is then PYTHONPATH's first entry, which must stay as it is.
            let path = format!("{}:{}", out.path().display(), fixture("").display());
            cmd.env("PYTHONSAFEPATH", "1").env("PYTHONPATH", path);
        }
        match *mode {
            "module" => cmd.args(*entry),
            "run-path" => cmd.args(*entry).arg(&script),
            _ => cmd.arg(&script),
        };
        let result = run(cmd.args(["opt-a", "fail"]), Duration::from_secs(120));
        assert_eq!(result.status.code(), Some(1), "{mode}: the warm rank 1 exits 7: {}", result.stderr);
        let root = result.stderr.split("Root Cause (first observed failure):").nth(1).expect("summary");
        assert!(root.contains("exitcode  : 7 (pid: "), "{mode}: {root}");
        assert!(result.stderr.contains("2 of 2 worker(s) started from warm spares"), "{mode}: {}", result.stderr);

        let all = records(out.path());
        assert_eq!(all.len(), 4, "{mode}: {all:?}");
        let spares = spare_pids(out.path());
        for local_rank in 0..2 {
            let (cold, warm) = (&all[local_rank], &all[2 + local_rank]);
            assert_eq!(cold["warm"], false, "{mode}");
            assert_eq!(warm["warm"], true, "{mode}");
            assert!(spares.contains(&warm["pid"].as_i64().unwrap()), "{mode}: the worker is a spare: {spares:?}");
            for key in ["argv", "path0", "file", "name", "names", "spec", "cwd", "unbuffered", "affinity"] {
                assert_eq!(cold[key], warm[key], "{mode}: {key}");
            }
            assert_eq!(env(warm, "TORCHELASTIC_RESTART_COUNT"), "1");
            assert!(env(warm, "TORCHELASTIC_ERROR_FILE").contains("attempt_1"), "{mode}");
            let strip = |r: &Value| -> BTreeMap<String, Value> {
                let map = r["env"].as_object().unwrap().clone();
                map.into_iter().filter(|(k, _)| !PER_START.contains(&k.as_str())).collect()
            };
            assert_eq!(strip(cold), strip(warm), "{mode}: the environment apart from the per-start values");
            for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
                assert_eq!(env(cold, k), env(warm, k), "{mode}: {k} (same node, same world)");
            }
            let attempt = std::fs::read_dir(logs.path()).unwrap().flatten().next().unwrap().path().join("attempt_1");
            let stdout = std::fs::read_to_string(attempt.join(format!("{local_rank}/stdout.log"))).unwrap();
            let stderr = std::fs::read_to_string(attempt.join(format!("{local_rank}/stderr.log"))).unwrap();
            assert!(stdout.contains(&format!("hello from local rank {local_rank} attempt 1")), "{mode}: {stdout:?}");
            assert!(stderr.contains(&format!("stderr from local rank {local_rank} attempt 1")), "{mode}: {stderr:?}");
        }
    }
}

/// A real torch job: the restarted workers come warm (torch imported), form a gloo group and all-reduce;
/// the spares started for a start that never comes are gone when muster exits.
#[test]
fn a_restart_takes_over_spares_with_torch_imported_and_none_outlive_the_job() {
    let out = tempfile::tempdir().unwrap();
    let result = run(
        warm_job(out.path())
            .args(["--max-restarts=2", "--warm-spares=torch.distributed,warm_marker", "--tee=3"])
            .arg(fixture("warm_worker.py"))
            .args(["torch", "wait-spares"]),
        Duration::from_secs(180),
    );
    assert_eq!(result.status.code(), Some(0), "{}", result.stderr);
    let all = records(out.path());
    let warm: Vec<&Value> = all.iter().filter(|r| env(r, "TORCHELASTIC_RESTART_COUNT") == "1").collect();
    assert_eq!(warm.len(), 2, "{all:?}");
    assert!(warm.iter().all(|r| r["warm"] == true), "{warm:?}");
    assert!(result.stdout.contains("[default0]:hello from local rank 0 attempt 1"), "{}", result.stdout);
    let spares = spare_pids(out.path());
    assert_eq!(spares.len(), 4, "two rounds of spares: {spares:?}");
    let gone = eventually(Duration::from_secs(1), || spares.iter().all(|p| !alive(*p as i32)));
    assert!(gone, "spares outlived the job: {spares:?}");
}

/// A start that comes while the spares are still importing uses them anyway: the hand-over waits in the
/// socket, and the workers run once the imports are done.
#[test]
fn a_spare_still_importing_is_used_and_finishes_first() {
    let out = tempfile::tempdir().unwrap();
    let result = run(
        warm_job(out.path())
            .args(["--max-restarts=1", "--warm-spares=warm_slow,warm_marker"])
            .arg(fixture("warm_worker.py"))
            .arg("early"),
        Duration::from_secs(120),
    );
    assert_eq!(result.status.code(), Some(0), "{}", result.stderr);
    assert_eq!(result.stderr.matches("warm spare still importing").count(), 2, "{}", result.stderr);
    let warm: Vec<Value> = records(out.path()).into_iter().filter(|r| env(r, "TORCHELASTIC_RESTART_COUNT") == "1").collect();
    assert_eq!(warm.len(), 2);
    assert!(warm.iter().all(|r| r["warm"] == true), "{warm:?}");
}

/// SIGKILL of the agent: its idle spares die with its workers.
#[test]
fn kill_9_of_the_agent_leaves_no_spare() {
    let out = tempfile::tempdir().unwrap();
    let mut agent = Guard::spawn(
        warm_job(out.path())
            .args(["--max-restarts=1", "--warm-spares=warm_marker"])
            .arg(fixture("warm_worker.py"))
            .arg("hold"),
    );
    assert!(eventually(Duration::from_secs(60), || spare_pids(out.path()).len() == 2 && records(out.path()).len() == 2));
    let mut pids: Vec<i32> = spare_pids(out.path()).into_iter().map(|p| p as i32).collect();
    pids.extend(records(out.path()).iter().map(|r| r["pid"].as_i64().unwrap() as i32));
    assert!(pids.iter().all(|p| alive(*p)), "{pids:?}");
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agent.pid(), libc::SIGKILL) };
    let _ = agent.wait_timeout(Duration::from_secs(5));
    let gone = eventually(Duration::from_secs(1), || pids.iter().all(|p| !alive(*p)));
    assert!(gone, "workers or spares outlived the agent by 1 s: {pids:?}");
}
