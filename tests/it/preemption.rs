//! Preemption as schedulers signal it, sent straight to the agent (tests/it/slurm.rs does it through Slurm): a
//! warning (SIGUSR1) never ends the job, SIGCONT is harmless, SIGTERM stops it with 143.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(90);

fn signals(dir: &Path, r: u32) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(format!("{r}.signals"))).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

fn worker_pids(dir: &Path) -> Vec<i32> {
    let text = std::fs::read_to_string(dir.join("starts")).unwrap_or_default();
    text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse().ok()).collect()
}

fn kill(pid: i32, sig: libc::c_int) {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, sig) };
}

/// An agent with two `signals` workers, both ready; its stderr goes to `dir/agent.err`.
fn start(dir: &Path, launcher_args: &[&str]) -> Guard {
    let err = std::fs::File::create(dir.join("agent.err")).unwrap();
    let mut cmd = muster();
    cmd.arg("--nproc-per-node=2").args(launcher_args).arg(fixture("worker.py")).arg(dir).arg("signals");
    let agent = Guard::spawn(cmd.stdout(Stdio::null()).stderr(err));
    let ready = || (0..2).all(|r| dir.join(format!("{r}.ready")).exists());
    assert!(eventually(LONG, ready), "workers not ready");
    agent
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("agent.err")).unwrap_or_default()
}

#[test]
fn a_listed_usr1_reaches_the_workers_who_keep_running_then_sigterm_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start(dir.path(), &["--signals-to-handle=SIGTERM,SIGUSR1"]);
    kill(agent.pid(), libc::SIGUSR1);
    let warned = || (0..2).all(|r| signals(dir.path(), r) == ["SIGUSR1"]);
    assert!(eventually(LONG, warned), "{}", log(dir.path()));
    // scancel sends SIGCONT before SIGTERM; the agent does not forward it and goes on.
    kill(agent.pid(), libc::SIGCONT);
    kill(agent.pid(), libc::SIGTERM);
    let status = agent.wait_timeout(LONG).expect("the agent exits");
    assert_eq!(status.code(), Some(143), "{}", log(dir.path()));
    for r in 0..2 {
        assert_eq!(signals(dir.path(), r), ["SIGUSR1", "SIGTERM"], "rank {r}");
    }
    assert!(worker_pids(dir.path()).iter().all(|p| !alive(*p)));
}

#[test]
fn an_unlisted_usr1_is_dropped_and_never_ends_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start(dir.path(), &[]);
    kill(agent.pid(), libc::SIGUSR1);
    let said = || log(dir.path()).contains("received SIGUSR1; it is not in --signals-to-handle");
    assert!(eventually(LONG, said), "{}", log(dir.path()));
    kill(agent.pid(), libc::SIGTERM);
    let status = agent.wait_timeout(LONG).expect("the agent exits");
    assert_eq!(status.code(), Some(143), "the agent outlived SIGUSR1: {}", log(dir.path()));
    for r in 0..2 {
        assert_eq!(signals(dir.path(), r), ["SIGTERM"], "rank {r}");
    }
}
