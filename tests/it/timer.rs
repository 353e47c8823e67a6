//! torchrun's file timer (`TORCHELASTIC_ENABLE_FILE_TIMER=1`): a real torch worker takes a
//! `FileTimerClient` timer with `expires(after=1)` and hangs inside it (`tests/fixtures/timer_worker.py`).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// `(attempt, pid)` per worker start.
fn starts(dir: &Path) -> Vec<(u32, i32)> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (a, p) = l.split_once(' ').unwrap();
            (a.parse().unwrap(), p.parse().unwrap())
        })
        .collect()
}

/// `fifo`: TORCHELASTIC_TIMER_FILE for the launcher, None to let it choose (and export) one.
fn job(cmd: &mut std::process::Command, dir: &Path, fifo: Option<&Path>, nproc: u32) {
    cmd.env("TORCHELASTIC_ENABLE_FILE_TIMER", "1").env_remove("TORCHELASTIC_TIMER_FILE");
    if let Some(fifo) = fifo {
        cmd.env("TORCHELASTIC_TIMER_FILE", fifo);
    }
    cmd.arg(format!("--nproc-per-node={nproc}"))
        .arg("--max-restarts=1")
        .arg(fixture("timer_worker.py"))
        .arg(dir);
}

/// The hung workers are killed with the timer's signal (SIGKILL), the group fails and restarts, and the
/// second attempt finishes: exit 0. With or without TORCHELASTIC_TIMER_FILE given, the workers get the FIFO's
/// path, the same on every attempt, and it is gone afterwards.
#[test]
fn an_expired_timer_kills_the_hung_worker_and_the_group_restarts() {
    for given in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("watchdog");
        let mut cmd = muster();
        job(&mut cmd, dir.path(), given.then_some(fifo.as_path()), 2);
        let out = run(&mut cmd, Duration::from_secs(120));
        assert_eq!(out.status.code(), Some(0), "given={given}: {}", out.stderr);
        let all = starts(dir.path());
        let attempts: Vec<u32> = all.iter().map(|(a, _)| *a).collect();
        assert_eq!(attempts, [0, 0, 1, 1], "two workers per attempt: {all:?}");
        let done = std::fs::read_to_string(dir.path().join("done")).unwrap();
        assert_eq!(done.lines().collect::<Vec<_>>(), ["1 done", "1 done"], "only attempt 1 finishes");
        let killed: Vec<i32> = all.iter().filter(|(a, _)| *a == 0).map(|(_, p)| *p).collect();
        assert!(
            killed.iter().any(|p| out.stderr.contains(&format!("file timer: timer(s) of pid {p} expired"))),
            "the agent says which worker's timer expired: {}",
            out.stderr
        );
        assert!(out.stderr.contains("sending SIGKILL"), "{}", out.stderr);
        assert!(killed.iter().all(|p| !alive(*p)), "attempt 0's workers are gone");
        let paths = std::fs::read_to_string(dir.path().join("fifo")).unwrap();
        let paths: std::collections::BTreeSet<&str> = paths.lines().collect();
        assert_eq!(paths.len(), 1, "one FIFO for every worker and attempt: {paths:?}");
        let used = Path::new(paths.first().copied().unwrap_or_default());
        if given {
            assert_eq!(used, fifo);
        }
        assert!(!used.exists(), "the FIFO {} is removed when the group ends", used.display());
    }
}

/// What torchrun 2.x does in the same case: its `FileTimerServer` SIGKILLs the worker and then sends the
/// same signal to torchrun itself (`file_based_local_timer.py: _run_watchdog`), so there is no restart and
/// the job dies with SIGKILL. (With two workers the sibling is left running, orphaned: one worker here, so
/// that nothing outlives the test.) muster deliberately restarts instead.
#[test]
fn torchrun_kills_itself_after_the_worker() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("watchdog");
    let mut cmd = torchrun();
    job(&mut cmd, dir.path(), Some(&fifo), 1);
    let out = run(&mut cmd, Duration::from_secs(120));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", out.stderr);
    let all = starts(dir.path());
    assert!(all.iter().all(|(a, _)| *a == 0), "no second attempt under torchrun: {all:?}");
    assert!(!dir.path().join("done").exists());
    assert_eq!(all.len(), 1, "{all:?}");
    // SIGKILLed a moment before torchrun killed itself: it may still be dying when torchrun is gone.
    let pid = all[0].1;
    assert!(eventually(Duration::from_secs(10), || !alive(pid)), "the one worker was killed by its timer");
}
