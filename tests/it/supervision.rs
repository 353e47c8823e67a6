//! Supervision as a user sees it: restarts, the failure summary, signals, and no process left behind.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn starts(dir: &Path) -> Vec<(u32, u32)> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<u32> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0], f[1])
        })
        .collect()
}

#[test]
fn exhausted_restarts_exit_1_with_the_root_cause() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        muster()
            .args(["--nproc-per-node=2", "--max-restarts=2"])
            .arg(fixture("worker.py"))
            .arg(dir.path())
            .args(["0=sleep", "1=exit:3"]),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let mut rank1: Vec<u32> = starts(dir.path()).into_iter().filter(|(r, _)| *r == 1).map(|(_, c)| c).collect();
    rank1.sort();
    assert_eq!(rank1, [0, 1, 2], "rank 1 started once per attempt with the restart count");
    let root = out.stderr.split("Root Cause (first observed failure):").nth(1).expect("summary printed");
    assert!(out.stderr.contains("worker.py FAILED"), "{}", out.stderr);
    assert!(root.contains("rank      : 1 (local_rank: 1)"), "{root}");
    assert!(root.contains("exitcode  : 3 (pid: "), "{root}");
    let others = out.stderr.split("Failures:").nth(1).unwrap();
    assert!(others.contains("exitcode  : -15 (pid: ") && others.contains("(SIGTERM)"), "{others}");
}

#[test]
fn record_traceback_reaches_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let out = run(
        muster()
            .args(["--nproc-per-node=2", "--log-dir"])
            .arg(logs.path())
            .arg(fixture("worker.py"))
            .arg(dir.path())
            .args(["0=sleep", "1=raise"]),
        Duration::from_secs(120),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let root = out.stderr.split("Root Cause (first observed failure):").nth(1).expect("summary printed");
    assert!(root.contains("rank      : 1 (local_rank: 1)"), "{root}");
    assert!(root.contains("traceback : Traceback (most recent call last):"), "{root}");
    assert!(root.contains("ValueError: boom from rank 1"), "{root}");
    assert!(root.contains("raise ValueError(f\"boom from rank {rank}\")"), "{root}");
    let error_file = root.lines().find_map(|l| l.trim().strip_prefix("error_file: ")).expect("error_file line");
    assert!(Path::new(error_file).starts_with(logs.path()) && Path::new(error_file).is_file(), "{error_file}");
}

fn read_pids(dir: &Path, rank: u32) -> Vec<i32> {
    let text = wait_for_lines(&dir.join(format!("{rank}.pids")), 1, Duration::from_secs(60));
    text.split_whitespace().map(|p| p.parse().unwrap()).collect()
}

#[test]
fn kill_9_of_the_agent_leaves_no_worker_or_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Guard::spawn(
        muster().args(["--nproc-per-node=2"]).arg(fixture("worker.py")).arg(dir.path()).arg("grandchild"),
    );
    let pids: Vec<i32> = (0..2).flat_map(|r| read_pids(dir.path(), r)).collect();
    assert_eq!(pids.len(), 4);
    assert!(pids.iter().all(|p| alive(*p)), "workers and grandchildren run before the kill");
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agent.pid(), libc::SIGKILL) };
    agent.wait_timeout(Duration::from_secs(5)).expect("agent died");
    let gone = eventually(Duration::from_secs(1), || pids.iter().all(|p| !alive(*p)));
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    assert!(gone, "still alive 1 s after kill -9 of the agent: {left:?}");
}

#[test]
fn grandchildren_are_swept_when_the_group_stops() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Guard::spawn(
        muster().args(["--nproc-per-node=1"]).arg(fixture("worker.py")).arg(dir.path()).arg("grandchild"),
    );
    let pids = read_pids(dir.path(), 0);
    // The worker dies on its own; its grandchild must not survive the failed group.
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    let status = agent.wait_timeout(Duration::from_secs(30)).expect("agent exits after the failure");
    assert_eq!(status.code(), Some(1));
    assert!(!alive(pids[1]), "grandchild {} outlived its worker group", pids[1]);
}

#[test]
fn sigterm_is_forwarded_then_sigkill_after_the_shutdown_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = muster();
    cmd.args(["--nproc-per-node=2", "--shutdown-timeout=2"])
        .arg(fixture("worker.py"))
        .arg(dir.path())
        .args(["0=trap", "1=ignore"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut agent = Guard::spawn(&mut cmd);
    for r in 0..2 {
        assert!(eventually(Duration::from_secs(60), || dir.path().join(format!("{r}.ready")).exists()));
    }
    let worker_pids: Vec<i32> = std::fs::read_to_string(dir.path().join("starts"))
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect();
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agent.pid(), libc::SIGTERM) };
    let status = agent.wait_timeout(Duration::from_secs(30)).expect("agent exits");
    assert_eq!(status.code(), Some(143), "128 + SIGTERM");
    assert!(dir.path().join("0.trapped").exists(), "rank 0 got SIGTERM and exited cleanly");
    assert!(dir.path().join("1.ignored").exists(), "rank 1 got SIGTERM and ignored it");
    assert!(worker_pids.iter().all(|p| !alive(*p)), "the ignoring worker was SIGKILLed");
}

#[test]
fn adopted_orphans_are_reaped() {
    let out = run(muster().arg(fixture("orphan_zombie.py")), Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("ZOMBIES: []"), "the agent left adopted zombies: {}", out.stdout);
}

/// A SIGINT while the group stops for a restart upgrades the stop's cause without starting its grace again:
/// a worker that ignores both signals is killed one `--shutdown-timeout` after the first stop signal.
#[test]
fn a_sigint_during_a_restart_stop_ends_within_one_shutdown_timeout() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("stubborn.py");
    std::fs::write(
        &script,
        "import os, signal, sys, time\nout = os.environ['OUT']\n\
         if os.environ['LOCAL_RANK'] == '1':\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n\
         \x20   open(os.path.join(out, 'ignoring'), 'w').close()\n    time.sleep(3600)\n\
         while not os.path.exists(os.path.join(out, 'ignoring')):\n    time.sleep(0.05)\nsys.exit(1)\n",
    )
    .expect("script");
    let grace = 10;
    let mut cmd = muster();
    cmd.env("OUT", dir.path())
        .args(["--standalone", "--nproc-per-node=2", "--max-restarts=1"])
        .arg(format!("--shutdown-timeout={grace}"))
        .arg(&script);
    let mut agent = common::cluster::Agent::spawn(&mut cmd);
    let stopping = eventually(Duration::from_secs(120), || agent.log().contains("closing signal SIGTERM"));
    assert!(stopping, "{}", agent.log());
    // Well into the grace: a stop that started its grace again would send SIGKILL `grace` after this.
    std::thread::sleep(Duration::from_secs(grace * 6 / 10));
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(agent.guard.pid(), libc::SIGINT) };
    assert_eq!(agent.exit_code(Duration::from_secs(120)), Some(130), "{}", agent.log());
    // The agent's own timestamps: when it sent each signal (its deadline, not this test's scheduling).
    let log = agent.log();
    let at = |what: &str| {
        let line = log.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("no '{what}' line:\n{log}"));
        let ts = line.split_whitespace().next().unwrap_or_default();
        chrono::DateTime::parse_from_rfc3339(ts).unwrap_or_else(|e| panic!("{e}: {line}")).timestamp_millis()
    };
    let (term, int, kill) = (at("closing signal SIGTERM"), at("closing signal SIGINT"), at("forcefully exiting via SIGKILL"));
    assert!(term < int && int < kill, "the SIGINT came during the stop: {term} {int} {kill}\n{log}");
    // One grace is `grace` seconds from the SIGTERM; a restarted one would end at 1.6 x `grace`.
    let grace_ms = grace as i64 * 1000;
    assert!(kill - term >= grace_ms && kill - term < grace_ms * 3 / 2, "SIGKILL {} ms after SIGTERM:\n{log}", kill - term);
}
