//! A user's hook command (`--on-node-fault`): `sh -c CMD`, bounded, in its own session, never fatal.
//!
//! The hook is a session leader in the job cgroup like a worker, known to the orphan guard while it runs, so
//! on timeout (or if the caller stops waiting) its whole process group is killed and its session swept, and
//! what it leaves running ends with the job: nothing it started outlives the agent.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::cgroup;
use super::{children, reaper};
use super::guard::OrphanGuard;

/// How long a killed hook may take to be reaped (SIGKILL; only uninterruptible sleep delays it).
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Kills the hook's process group if the hook is still owned when this is dropped (the caller's future was
/// dropped mid-wait).
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0.take() {
            let _ = children::signal_group(pgid, Signal::SIGKILL);
        }
    }
}

/// How a hook ended (each is also logged).
#[derive(Debug, PartialEq, Eq)]
pub enum HookOutcome {
    Ran,
    Failed(std::process::ExitStatus),
    /// It could not be started (no `sh`, a process limit).
    NotStarted,
    /// Its exit status could not be read.
    Lost,
    /// Killed at its timeout.
    TimedOut,
}

/// Gives the hook's exit status up to the zombie reaper when the wait is over (or dropped).
struct Disown(i32);

impl Drop for Disown {
    fn drop(&mut self) {
        children::disown(self.0);
    }
}

/// Runs `sh -c cmd` with `env` on top of the agent's environment (stdin from /dev/null, output to the
/// agent's), waits up to `timeout`, and logs the outcome. On timeout its process group is SIGKILLed and its
/// session swept. Never fails the caller.
pub async fn run_hook(
    cmd: &str,
    env: &[(String, String)],
    timeout: Duration,
    guard: &Arc<OrphanGuard>,
) -> HookOutcome {
    let mut command = tokio::process::Command::new("sh");
    // A user's hook gets what workers get: never the job token.
    for name in super::env::WITHHELD {
        command.env_remove(name);
    }
    command.arg("-c").arg(cmd).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
    let cgroup_procs = guard.cgroup_procs();
    // SAFETY: write and setsid are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if let Some(procs) = cgroup_procs {
                cgroup::join(procs)?;
            }
            nix::unistd::setsid().map(drop).map_err(std::io::Error::from)
        });
    }
    // Its exit status is ours to read, not the zombie reaper's (which a busy SIGCHLD stream keeps scanning).
    let mut child = match children::spawn(&mut command) {
        Ok(child) => child,
        Err(e) => {
            tracing::warn!("cannot run the hook `{cmd}`: {e}");
            return HookOutcome::NotStarted;
        }
    };
    let Some(pid) = child.id().map(|p| p as i32) else {
        tracing::warn!("the hook `{cmd}` exited before its pid could be read");
        return HookOutcome::NotStarted;
    };
    guard.watch(pid);
    let mut group = GroupGuard(Some(pid));
    let _own = Disown(pid);
    let outcome = tokio::time::timeout(timeout, child.wait()).await;
    if outcome.is_ok() {
        group.0 = None;
        // What it left running ends with the job: out of the guard's sessions, so the agent rechecks its
        // children now rather than at the next SIGCHLD, which may already have come.
        guard.forget(pid);
        let recheck = guard.clone();
        let _ = tokio::task::spawn_blocking(move || reaper::recheck(&recheck)).await;
    }
    match outcome {
        Ok(Ok(status)) if status.success() => {
            tracing::info!("hook `{cmd}` ran");
            HookOutcome::Ran
        }
        Ok(Ok(status)) => {
            tracing::warn!("hook `{cmd}` failed: {status}");
            HookOutcome::Failed(status)
        }
        Ok(Err(e)) => {
            tracing::warn!("cannot wait for the hook `{cmd}`: {e}");
            HookOutcome::Lost
        }
        Err(_) => {
            group.0 = None;
            let _ = children::signal_group(pid, Signal::SIGKILL);
            // The sweep runs before the hook is reaped, so its session id cannot have been reused yet.
            let swept = tokio::task::spawn_blocking(move || children::kill_session(pid)).await.unwrap_or_default();
            guard.forget(pid);
            if tokio::time::timeout(REAP_TIMEOUT, child.wait()).await.is_err() {
                tracing::error!("the hook `{cmd}` did not exit after SIGKILL (uninterruptible kernel sleep?)");
            }
            tracing::warn!(
                "hook `{cmd}` did not finish within {timeout:?}; killed its process group ({swept} more process(es) \
                 swept from its session)"
            );
            HookOutcome::TimedOut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| crate::supervisor::proctree::parse_stat(&s))
            .is_some_and(|p| p.state != 'Z' && p.state != 'X')
    }

    #[tokio::test]
    async fn a_hook_past_its_timeout_leaves_no_process_behind() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let cmd = format!("sleep 1000 & echo $! > {}.tmp && mv {0}.tmp {0}; wait", pidfile.display());
        let env = [("MUSTER_TEST".to_string(), "1".to_string())];
        let guard = Arc::new(OrphanGuard::inert());
        let hook = tokio::spawn(async move { run_hook(&cmd, &env, Duration::from_secs(2), &guard).await });
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let sleeper = loop {
            if let Ok(text) = std::fs::read_to_string(&pidfile) {
                break text.trim().parse::<i32>().unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "the hook never started its child");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        hook.await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive(sleeper) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!alive(sleeper), "the hook's `sleep 1000` outlived the hook's timeout");
    }

    #[tokio::test]
    async fn a_failing_or_missing_hook_does_not_fail_the_caller() {
        let guard = Arc::new(OrphanGuard::inert());
        let code = |o: HookOutcome| match o {
            HookOutcome::Failed(status) => status.code(),
            other => panic!("{other:?}"),
        };
        assert_eq!(code(run_hook("exit 3", &[], Duration::from_secs(30), &guard).await), Some(3));
        // sh's own "not found".
        assert_eq!(code(run_hook("/nonexistent/hook", &[], Duration::from_secs(30), &guard).await), Some(127));
        assert_eq!(run_hook("true", &[], Duration::from_secs(30), &guard).await, HookOutcome::Ran);
    }
}
