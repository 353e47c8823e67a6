//! The children registry: the one place the agent spawns its own children and signals the job's processes
//! (invariant 1). Everything else asks it.
//!
//! Two hazards it exists for, each solved once here:
//! - a PID is safe to signal only while its exit status has not been read (after that it may be anyone's);
//!   so an own child's status is read only by its waiter, never by the zombie reaper. [`spawn`] holds the
//!   registry's lock across fork and registration, and the reaper reads the registry under the same lock;
//! - `kill(0)`, `killpg(0)` or a negative PID hit the agent's own process group or every process it may
//!   signal; no such PID gets past [`signal`] and [`signal_group`].

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::proctree::{ProcStat, Tree};

/// PIDs of the agent's own direct children whose exit status belongs to someone else (tokio, for workers,
/// spares and hooks; the agent, for the orphan guard).
static OWN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// The registry, whatever a panic elsewhere left it as: a list of PIDs stays a valid list.
pub(super) fn own() -> MutexGuard<'static, Vec<i32>> {
    OWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spawns `cmd` as one of the agent's own children (a worker, a spare, a hook). [`disown`] it once its
/// status is read (or nobody will read it).
pub fn spawn(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut own = own();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        own.push(pid as i32);
    }
    Ok(child)
}

/// Registers a child forked by hand (the orphan guard), whose status the agent reads itself.
pub(super) fn register(pid: i32) {
    own().push(pid);
}

/// `pid`'s exit status is no longer anyone's to wait for: the zombie reaper may take it.
pub fn disown(pid: i32) {
    own().retain(|p| *p != pid);
}

/// A PID that names one process (or group): not 0 (our own group), not negative (every process), not init.
fn one(pid: i32) -> nix::Result<Pid> {
    if pid > 1 {
        Ok(Pid::from_raw(pid))
    } else {
        Err(Errno::EINVAL)
    }
}

/// `sig` to process `pid` alone (a notice, a file timer's signal): its children did not ask for it.
pub fn signal(pid: i32, sig: Signal) -> nix::Result<()> {
    kill(one(pid)?, sig)
}

/// `sig` to process group `pgid` (a worker, spare or hook is its group's leader): the stop of a whole
/// worker, DataLoader processes included.
pub fn signal_group(pgid: i32, sig: Signal) -> nix::Result<()> {
    killpg(one(pgid)?, sig)
}

/// SIGKILLs every live process `select` takes (never this one). Each is SIGSTOPped first and `/proc` read
/// again until no new one appears, so a process cannot fork its way out between a scan and the kill, and
/// parentage (a selection's "below X") holds while the sweep runs. Returns how many were killed.
pub fn freeze_and_kill(scan: impl Fn() -> Tree, select: impl Fn(&Tree, &ProcStat) -> bool) -> usize {
    let me = std::process::id() as i32;
    let mut stopped = HashSet::new();
    for _ in 0..16 {
        let tree = scan();
        let new: Vec<i32> =
            tree.live().filter(|p| p.pid != me && !stopped.contains(&p.pid) && select(&tree, p)).map(|p| p.pid).collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = signal(pid, Signal::SIGSTOP);
            stopped.insert(pid);
        }
    }
    for pid in &stopped {
        let _ = signal(*pid, Signal::SIGKILL);
    }
    stopped.len()
}

/// Kills the agent's descendants in session `sid` (what a hook left in its session): blocking, reads `/proc`.
pub fn kill_session(sid: i32) -> usize {
    let me = std::process::id() as i32;
    freeze_and_kill(Tree::scan, |tree, p| p.session == sid && tree.descends(p.pid, me))
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;
    use nix::sys::signal::Signal;

    use super::{signal, signal_group};

    #[test]
    fn no_signal_reaches_our_own_group_or_every_process() {
        for pid in [0, -1, -1234, 1] {
            assert_eq!(signal(pid, Signal::SIGTERM), Err(Errno::EINVAL), "kill({pid})");
            assert_eq!(signal_group(pid, Signal::SIGTERM), Err(Errno::EINVAL), "killpg({pid})");
        }
    }
}
