//! Reaping what the agent adopts: as a child subreaper (and as PID 1 in a container) it is the parent of
//! every orphan its workers leave, and must take their exit statuses, never its own children's (those are
//! their waiters', see `children.rs`). On each SIGCHLD it also tells the orphan guard (`guard.rs`) about
//! processes that left the job's sessions.

use std::sync::Arc;

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::children;
use super::guard::OrphanGuard;
use super::proctree::Tree;

/// The agent's children, from each of its threads' `children` list (an adopted orphan may be any thread's):
/// far cheaper than reading all of `/proc`. None where the kernel has no such lists.
fn own_children() -> Option<Vec<i32>> {
    let mut children = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").ok().into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).ok()?;
        children.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    Some(children)
}

/// What the agent does when one of its children changes state (SIGCHLD): reaps the adopted zombies (never
/// its own workers') and, without a cgroup, tells the guard about every process outside the sessions it holds.
fn on_child_event(guard: &OrphanGuard) {
    let me = std::process::id() as i32;
    let own = children::own();
    // Read under the lock: a worker is either not forked yet or already in `own`. With a cgroup only the
    // agent's children matter (the cgroup holds the rest); without, every descendant does.
    let tree = match (&guard.cgroup, own_children()) {
        (Ok(_), Some(children)) => Tree::of_pids(&children),
        _ => Tree::scan(),
    };
    for p in tree.all() {
        if p.ppid == me && p.state == 'Z' && !own.contains(&p.pid) {
            if let Ok(status) = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG)) {
                tracing::debug!(pid = p.pid, ?status, "reaped adopted process");
            }
        }
    }
    guard.check_alive();
    if guard.cgroup.is_err() {
        guard.track(&tree, &own);
    }
}

/// Reads the agent's children now, as on SIGCHLD: for a session just forgotten that may have left
/// processes. Blocking (reads `/proc`).
pub fn recheck(guard: &OrphanGuard) {
    on_child_event(guard);
}

/// Watches the agent's children from now on (SIGCHLD), off the async threads; says how the job's processes
/// are contained.
pub fn spawn_adopted_reaper(guard: Arc<OrphanGuard>) {
    match &guard.cgroup {
        Ok(cg) => tracing::info!("job cgroup {}: the job's processes are kept in it and end with the job", cg.dir().display()),
        Err(why) => tracing::info!(
            "no job cgroup ({why}); the job's processes are tracked by session and as the agent adopts them"
        ),
    }
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) else {
        tracing::warn!("cannot watch SIGCHLD; adopted orphans will stay zombies until the agent exits");
        return;
    };
    tokio::spawn(async move {
        while sigchld.recv().await.is_some() {
            let guard = guard.clone();
            let _ = tokio::task::spawn_blocking(move || on_child_event(&guard)).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::on_child_event;
    use crate::supervisor::children;
    use crate::supervisor::guard::OrphanGuard;
    use crate::supervisor::proctree::parse_stat;

    /// A child of this process that has exited and not been waited for (a zombie), spawned by `spawn`.
    fn zombie(spawn: impl FnOnce(&mut tokio::process::Command) -> tokio::process::Child) -> tokio::process::Child {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let child = spawn(&mut cmd);
        let pid = child.id().expect("pid");
        for _ in 0..1000 {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if parse_stat(&stat).is_some_and(|p| p.state == 'Z') {
                return child;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("pid {pid} never became a zombie");
    }

    /// The hook's lost status ("cannot wait for the hook: No child processes"): the zombie reaper, run on a
    /// SIGCHLD, takes only adopted zombies, never the status of a child spawned through `spawn_own`.
    #[tokio::test]
    async fn the_zombie_reaper_leaves_an_own_child_s_status_to_its_waiter() {
        let guard = OrphanGuard::inert();
        let mut own = zombie(|cmd| children::spawn(cmd).expect("spawn"));
        let pid = own.id().map_or(0, |p| p as i32);
        on_child_event(&guard);
        let status = own.wait().await.expect("its status is still there");
        assert_eq!(status.code(), Some(3));
        children::disown(pid);
        // A child spawned past the registry is what the reaper takes: the case above is not vacuous.
        let mut stray = zombie(|cmd| cmd.spawn().expect("spawn"));
        on_child_event(&guard);
        assert!(stray.wait().await.is_err(), "the reaper took the unregistered child's status");
    }
}
