//! Nothing escapes: a daemon a worker leaves behind (fork, fork, setsid, fork: a session of its own,
//! re-parented to the agent) is gone within 1 s of the agent's exit, whether the agent exits cleanly, is
//! stopped by SIGTERM or is SIGKILLed; with the job cgroup where this host allows one, and with the session
//! and subreaper fallback (`MUSTER_CGROUP=off`). The same holds for what a node-fault hook leaves running.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::gpus::FakeNode;
use common::*;

const START: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Clean,
    Sigterm,
    Sigkill,
}

/// The agent's stderr, line by line, as it comes.
struct Lines {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(agent: &mut Guard) -> Lines {
        let stderr = agent.0.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// The first line (from now on) containing `needle`, waiting up to `timeout`.
    fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?} within {timeout:?}; stderr so far:\n{}", self.seen.join("\n")),
            }
        }
    }
}

/// Starts an agent with `args` and `envs`, its stderr read line by line; returns it with the line that says
/// how the job's processes are contained.
fn agent(args: &[&str], envs: &[(&str, String)], cgroup: bool) -> (Guard, Lines, String) {
    let mut cmd = muster();
    cmd.args(args)
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .env("MUSTER_CGROUP", if cgroup { "auto" } else { "off" })
        .env("RUST_LOG", "muster=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = Guard::spawn(&mut cmd);
    let mut lines = Lines::of(&mut agent);
    let mechanism = lines.wait_for("job cgroup", START);
    assert!(cgroup || mechanism.contains("no job cgroup (MUSTER_CGROUP=off)"), "{mechanism}");
    eprintln!("mechanism: {mechanism}");
    (agent, lines, mechanism)
}

/// Starts a one-worker job whose worker leaves a daemon, ends the agent as `end` says, and checks that the
/// daemon is gone within 1 s of the agent's exit. `cgroup`: `MUSTER_CGROUP` is `auto` (a job cgroup where
/// this host lets the agent create one) or `off`.
fn daemon_is_gone(end: End, cgroup: bool) {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let (pidfile, mode) = (pidfile.display().to_string(), if end == End::Clean { "exit" } else { "stay" });
    let worker = fixture("daemonize.py").display().to_string();
    let (mut agent, mut lines, mechanism) = agent(&["--nproc-per-node=1", &worker, &pidfile, mode], &[], cgroup);
    let in_cgroup = !mechanism.contains("no job cgroup");
    // The pidfile says the daemon ran. Only a job that stays up until the test ends it (`stay`) is sure to
    // still be running here; with `exit` the job may have ended, daemon and all, before this line.
    let daemon: i32 = wait_for_lines(pidfile.as_ref(), 1, START).trim().parse().unwrap();
    assert!(end == End::Clean || alive(daemon), "the daemon runs while the job does");
    match end {
        End::Clean => {}
        End::Sigterm => {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(agent.pid(), libc::SIGTERM) };
        }
        End::Sigkill => {
            if !in_cgroup {
                // The agent tells the guard about the daemon once it has adopted it (the session leader's exit).
                lines.wait_for(&format!("process {daemon} left the job's sessions"), START);
            }
            // SAFETY: plain kill(2).
            unsafe { libc::kill(agent.pid(), libc::SIGKILL) };
        }
    }
    let status = agent.wait_timeout(START).expect("the agent exits");
    let gone = eventually(Duration::from_secs(1), || !alive(daemon));
    assert!(gone, "daemon {daemon} still runs 1 s after the agent's exit ({end:?}, {mechanism})");
    let want = match end {
        End::Clean => Some(0),
        End::Sigterm => Some(143),
        End::Sigkill => None,
    };
    assert_eq!(status.code(), want, "{end:?}");
}

#[test]
fn a_daemon_ends_with_a_clean_exit() {
    daemon_is_gone(End::Clean, true);
}

#[test]
fn a_daemon_ends_with_sigterm() {
    daemon_is_gone(End::Sigterm, true);
}

#[test]
fn a_daemon_ends_with_sigkill() {
    daemon_is_gone(End::Sigkill, true);
}

#[test]
fn without_a_cgroup_a_daemon_ends_with_a_clean_exit() {
    daemon_is_gone(End::Clean, false);
}

#[test]
fn without_a_cgroup_a_daemon_ends_with_sigterm() {
    daemon_is_gone(End::Sigterm, false);
}

#[test]
fn without_a_cgroup_a_daemon_ends_with_sigkill() {
    daemon_is_gone(End::Sigkill, false);
}

#[test]
fn a_bad_muster_cgroup_is_refused_with_one_line() {
    let out = run(muster().env("MUSTER_CGROUP", "yes").args(["--nproc-per-node=1", "x.py"]), START);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("MUSTER_CGROUP=\"yes\" is not valid; use `auto`"), "{}", out.stderr);
}

/// A node-fault hook that starts a daemon (`setsid`, in the background) and returns: the daemon is gone
/// within 1 s of the drained agent's exit.
fn hook_daemon_is_gone(cgroup: bool) {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 1, &[]);
    let hook_pid = dir.path().join("hook.pid");
    // The daemon writes its own PID (`setsid` may fork first); the hook returns once it has.
    let hook = format!(
        "setsid sh -c 'echo $$ > {0}.tmp && mv {0}.tmp {0}; exec sleep 1000' </dev/null >/dev/null 2>&1 & \
         while [ ! -e {0} ]; do sleep 0.01; done",
        hook_pid.display()
    );
    let worker_pid = dir.path().join("worker-daemon.pid");
    let (worker, pidfile) = (fixture("daemonize.py").display().to_string(), worker_pid.display().to_string());
    let args = ["--nproc-per-node=gpu", "--on-node-fault", &hook, &worker, &pidfile, "stay"];
    let (mut agent, _lines, _) = agent(&args, &gpus.env(), cgroup);
    wait_for_lines(&worker_pid, 1, START);
    assert!(eventually(START, || gpus.registered(0)), "the GPU watcher never started");
    gpus.inject(0, "xid 0 79");
    let status = agent.wait_timeout(START).expect("the drained agent exits");
    assert_eq!(status.code(), Some(75), "node unhealthy");
    let daemon: i32 = wait_for_lines(&hook_pid, 1, START).trim().parse().unwrap();
    let gone = eventually(Duration::from_secs(1), || !alive(daemon));
    assert!(gone, "the hook's daemon {daemon} still runs 1 s after the agent's exit");
}

#[test]
fn a_hooks_daemon_ends_with_the_job() {
    hook_daemon_is_gone(true);
}

#[test]
fn without_a_cgroup_a_hooks_daemon_ends_with_the_job() {
    hook_daemon_is_gone(false);
}
