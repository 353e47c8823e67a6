//! Nothing outlives the agent: the orphan guard, sweeps, and reaping adopted children.
//!
//! The layers, because each covers what the others cannot:
//! - every worker has a parent-death signal of SIGKILL (set in `spawn_worker`), which kills the worker
//!   itself when the agent dies, however it dies;
//! - the agent is a child subreaper, so while it runs everything its workers leave behind (a daemon that
//!   double-forked and called `setsid`, too) is re-parented to it: the agent's descendants are exactly the
//!   job's processes. It sweeps them at every stop of the group and at its end, and reaps adopted zombies
//!   (also what PID 1 in a container must do);
//! - where it may create one, the *job cgroup* (`cgroup.rs`) holds every worker, spare and hook and all they
//!   start; the agent kills it at its end, and so does the guard;
//! - the *orphan guard*, a tiny process forked before the runtime starts, runs after the agent is gone
//!   (SIGKILLed, too): when its pipe from the agent reaches EOF it kills the job cgroup, then every process
//!   still in the sessions it was told about (each worker's, spare's and running hook's) or told about by
//!   PID (without a cgroup: each process the agent saw outside those sessions, on any child's exit), and
//!   their descendants. The one gap without a cgroup: a process that left its worker's session while its
//!   parent lives, started after the agent's last look, can survive a SIGKILL of the agent.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use super::cgroup::{self, JobCgroup, Unavailable};
use super::children::{self, freeze_and_kill};
use super::proctree::Tree;

/// How long the processes of a killed cgroup may take to exit (only uninterruptible sleep delays SIGKILL).
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(transparent)]
    BadSetting(#[from] cgroup::BadSetting),
    #[error("cannot start the orphan guard process: {0}")]
    Start(#[from] std::io::Error),
}

/// The agent's end of the orphan guard, and what the agent knows of the job's processes.
#[derive(Debug)]
pub struct OrphanGuard {
    pipe: Mutex<std::fs::File>,
    /// The guard process, a child of the agent that no sweep takes.
    pid: i32,
    pub(super) cgroup: Result<JobCgroup, Unavailable>,
    /// The sessions the guard holds: each running worker's, spare's and hook's.
    sessions: Mutex<HashSet<i32>>,
    /// Without a cgroup: the processes outside those sessions the guard was told about, with start times.
    told: Mutex<HashMap<i32, u64>>,
    /// The guard process died (said once; nothing more is sent to it).
    gone: AtomicBool,
}

impl OrphanGuard {
    /// Creates the job cgroup (unless `MUSTER_CGROUP=off` or it cannot be), forks the guard and makes this
    /// process a child subreaper.
    ///
    /// Must run before any other thread exists (before the tokio runtime): the child only runs plain Rust
    /// after `fork`, which is sound in a single-threaded process.
    pub fn start() -> Result<OrphanGuard, GuardError> {
        let setting = std::env::var(cgroup::SETTING_VAR).ok();
        let cgroup = if cgroup::wanted(setting.as_deref())? { JobCgroup::create() } else { Err(Unavailable::Off) };
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let dir = cgroup.as_ref().ok().map(|cg| cg.dir().to_path_buf());
        // SAFETY: called while the process is single-threaded (see above).
        match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
            ForkResult::Child => {
                drop(write);
                guard_main(read, dir)
            }
            ForkResult::Parent { child } => {
                drop(read);
                children::register(child.as_raw());
                Ok(OrphanGuard {
                    pipe: Mutex::new(std::fs::File::from(write)),
                    pid: child.as_raw(),
                    cgroup,
                    sessions: Mutex::new(HashSet::new()),
                    told: Mutex::new(HashMap::new()),
                    gone: AtomicBool::new(false),
                })
            }
        }
    }

    /// A guard that kills nothing, with no cgroup, for unit tests of the code that reports to it.
    #[cfg(test)]
    pub(crate) fn inert() -> OrphanGuard {
        Self::inert_with_pid(0)
    }

    /// An inert guard whose process is `pid` (a child of the test), to see its death noticed.
    #[cfg(test)]
    fn inert_with_pid(pid: i32) -> OrphanGuard {
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").expect("/dev/null");
        OrphanGuard {
            pipe: Mutex::new(null),
            pid,
            cgroup: Err(Unavailable::Off),
            sessions: Mutex::new(HashSet::new()),
            told: Mutex::new(HashMap::new()),
            gone: AtomicBool::new(false),
        }
    }

    /// Whether the guard process is known to be gone.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    /// Notices the guard process's death (on SIGCHLD: it is the agent's child) and says once what that
    /// leaves uncovered. The job goes on: the guard matters only should the agent itself be killed, and
    /// then the workers' parent-death signal still ends them; only what they started in sessions of its own
    /// may be left (in the job cgroup, where there is one). The agent's own end still sweeps everything.
    /// It is not restarted: a fork from the threaded agent may run only async-signal-safe code.
    pub(super) fn check_alive(&self) {
        if self.pid <= 0 || self.is_gone() {
            return;
        }
        let status = waitpid(Pid::from_raw(self.pid), Some(WaitPidFlag::WNOHANG));
        let cgroup = self.cgroup.as_ref().ok().map(JobCgroup::dir);
        if let Some(notice) = guard_death_notice(status, cgroup) {
            self.gone.store(true, Ordering::Relaxed);
            tracing::warn!("{notice}");
        }
    }

    /// The job cgroup's `cgroup.procs`, for a child to `cgroup::join` before exec; None without a cgroup.
    /// See [`JobCgroup::prime`]: called ahead of spawning, so the workers' joins are fast.
    pub fn prime_cgroup(&self) {
        if let Ok(cgroup) = &self.cgroup {
            cgroup.prime();
        }
    }

    pub fn cgroup_procs(&self) -> Option<RawFd> {
        self.cgroup.as_ref().ok().map(JobCgroup::procs_fd)
    }

    /// From now on the guard kills session `sid` if the agent dies.
    pub fn watch(&self, sid: i32) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(sid);
        }
        self.send(&format!("+s {sid}\n"));
    }

    /// Session `sid` has been swept by the agent itself; the guard forgets it (its id may be reused).
    pub fn forget(&self, sid: i32) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(&sid);
        }
        self.send(&format!("-s {sid}\n"));
    }

    /// Kills the agent's descendants (the guard aside) that are in one of the `ending` sessions or in none the
    /// guard holds: whatever a stopped group left, wherever it went, sparing warm spares and a running hook.
    /// Blocking (reads `/proc`).
    pub fn sweep(&self, ending: &HashSet<i32>) -> usize {
        let keep: HashSet<i32> = match self.sessions.lock() {
            Ok(sessions) => sessions.difference(ending).copied().collect(),
            Err(_) => HashSet::new(),
        };
        self.sweep_keeping(&keep)
    }

    /// With a cgroup the job's processes are its members (read from `cgroup.procs`, not all of `/proc`);
    /// without one, or when its member list cannot be read, the agent's descendants.
    fn sweep_keeping(&self, keep: &HashSet<i32>) -> usize {
        let me = std::process::id() as i32;
        if let Ok(cg) = &self.cgroup {
            match cg.members() {
                Ok(first) => {
                    // Each rescan reads the members again (a process may have forked meanwhile).
                    let members = || {
                        cg.members().unwrap_or_else(|e| {
                            tracing::debug!("cannot read the job cgroup's members again ({e}); using the first read");
                            first.clone()
                        })
                    };
                    return freeze_and_kill(|| Tree::of_pids(&members()), |_, p| !keep.contains(&p.session));
                }
                Err(e) => tracing::debug!("cannot read the job cgroup's members ({e}); sweeping the agent's descendants"),
            }
        }
        freeze_and_kill(Tree::scan, |tree, p| p.pid != self.pid && !keep.contains(&p.session) && tree.descends(p.pid, me))
    }

    /// The agent's end: kills every process of the job (`cgroup.kill`, else a sweep of its descendants),
    /// then removes the job cgroup. Blocking; call it once the runtime is shut down.
    pub fn end(&self) {
        match &self.cgroup {
            Ok(cg) => {
                if let Err(e) = cgroup::kill_and_remove(cg.dir(), KILL_TIMEOUT) {
                    tracing::warn!("{e}");
                }
            }
            Err(_) => {
                let killed = self.sweep_keeping(&HashSet::new());
                if killed > 0 {
                    tracing::info!(killed, "killed processes of the job left running at its end");
                }
            }
        }
    }

    /// Tells the guard about each live descendant outside the sessions it holds (but the agent's own
    /// children `own`: a worker being started is not in its session yet), and which of those are gone.
    pub(super) fn track(&self, tree: &Tree, own: &[i32]) {
        let me = std::process::id() as i32;
        let (Ok(sessions), Ok(mut told)) = (self.sessions.lock(), self.told.lock()) else { return };
        let alive = |pid: i32, start: u64| tree.get(pid).is_some_and(|p| p.start == start && p.state != 'Z');
        let gone: Vec<i32> = told.iter().filter(|(pid, start)| !alive(**pid, **start)).map(|(pid, _)| *pid).collect();
        for pid in gone {
            told.remove(&pid);
            self.send(&format!("-p {pid}\n"));
        }
        for p in tree.live() {
            let outside = !sessions.contains(&p.session) && p.pid != self.pid && !own.contains(&p.pid);
            if outside && !told.contains_key(&p.pid) && tree.descends(p.pid, me) {
                told.insert(p.pid, p.start);
                self.send(&format!("+p {} {}\n", p.pid, p.start));
                // Said once the guard has been told (a test kills the agent on this line).
                tracing::debug!("process {} left the job's sessions; the orphan guard will end it with the job", p.pid);
            }
        }
    }

    fn send(&self, line: &str) {
        if self.is_gone() {
            return;
        }
        // A line is far below PIPE_BUF, so the write is atomic; the guard reads continuously.
        if let Ok(mut pipe) = self.pipe.lock() {
            if let Err(e) = pipe.write_all(line.as_bytes()) {
                if !self.gone.swap(true, Ordering::Relaxed) {
                    tracing::warn!("orphan guard is gone ({e}); workers may outlive a crash of this agent");
                }
            }
        }
    }
}

/// The one line that says the guard died and what is left uncovered, or None while it runs. `status`: a
/// non-blocking wait for it (an error: it is no longer this process's child, so gone too).
fn guard_death_notice(status: nix::Result<WaitStatus>, cgroup: Option<&std::path::Path>) -> Option<String> {
    let how = match status {
        Ok(WaitStatus::Exited(_, code)) => format!("exited with status {code}"),
        Ok(WaitStatus::Signaled(_, sig, _)) => format!("was killed by {}", sig.as_str()),
        Ok(_) => return None,
        Err(e) => format!("cannot be waited for ({e})"),
    };
    let left = match cgroup {
        Some(dir) => format!("in the job cgroup {} until it is killed", dir.display()),
        None => "running".to_string(),
    };
    Some(format!(
        "the orphan guard process {how}; the job goes on. Should this agent be killed, its workers still end \
         (parent-death signal), but processes they started in sessions of their own are left {left}"
    ))
}

/// The guard process: track sessions and processes until the agent's end of the pipe closes, then kill the
/// job cgroup and what is left.
fn guard_main(read: OwnedFd, cgroup: Option<PathBuf>) -> ! {
    // Out of the agent's session so a terminal's Ctrl-C or a kill of the agent's group leaves it alive to
    // clean up; immune to the polite signals, it ends only at EOF. A scheduler that signals every process
    // of a job step (Slurm's `scancel --signal=USR1`) reaches it too: a warning must not kill it.
    let _ = nix::unistd::setsid();
    let polite = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGPIPE];
    for sig in polite.into_iter().chain(crate::signals::NOTICE_SIGNALS) {
        // SAFETY: setting SIG_IGN installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    let _ = nix::sys::prctl::set_name(c"muster-guard");
    // Keep no terminal or pipe of the caller open: a test reading the agent's stdout must see EOF when the
    // agent exits, not when the guard does.
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors of this single-threaded process.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut sessions = HashSet::new();
    let mut procs = HashMap::new();
    for line in BufReader::new(std::fs::File::from(read)).lines() {
        let Ok(line) = line else { break };
        let mut fields = line.split(' ');
        let (op, id, start) = (fields.next(), fields.next(), fields.next());
        let id = id.and_then(|f| f.parse::<i32>().ok());
        match (op, id, start.and_then(|f| f.parse::<u64>().ok())) {
            (Some("+s"), Some(sid), _) => {
                sessions.insert(sid);
            }
            (Some("-s"), Some(sid), _) => {
                sessions.remove(&sid);
            }
            (Some("+p"), Some(pid), Some(start)) => {
                procs.insert(pid, start);
            }
            (Some("-p"), Some(pid), _) => {
                procs.remove(&pid);
            }
            _ => {}
        }
    }
    if let Some(dir) = cgroup {
        let _ = cgroup::kill_and_remove(&dir, KILL_TIMEOUT);
    }
    // No ancestor to check: the agent is gone. A process named by PID must still have its start time.
    freeze_and_kill(Tree::scan, |tree, p| {
        tree.lineage(p.pid).any(|q| sessions.contains(&q.session) || procs.get(&q.pid) == Some(&q.start))
    });
    std::process::exit(crate::exit::SUCCESS.into())
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;
    use nix::sys::signal::Signal;
    use nix::sys::wait::WaitStatus;
    use nix::unistd::Pid;

    use super::{guard_death_notice, OrphanGuard};

    #[test]
    fn the_guard_s_death_is_told_with_what_still_covers_the_job() {
        let pid = Pid::from_raw(7);
        let cg = Some(std::path::Path::new("/cg/j"));
        let table = [
            (Ok(WaitStatus::StillAlive), cg, None),
            (Ok(WaitStatus::Stopped(pid, Signal::SIGSTOP)), cg, None),
            (Ok(WaitStatus::Signaled(pid, Signal::SIGKILL, false)), cg, Some(("was killed by SIGKILL", "job cgroup /cg/j"))),
            (Ok(WaitStatus::Exited(pid, 3)), None, Some(("exited with status 3", "are left running"))),
            (Err(Errno::ECHILD), None, Some(("cannot be waited for", "are left running"))),
        ];
        for (status, cgroup, expected) in table {
            let notice = guard_death_notice(status, cgroup);
            match (&notice, expected) {
                (None, None) => {}
                (Some(n), Some((how, left))) => assert!(n.contains(how) && n.contains(left) && n.contains("goes on"), "{n}"),
                _ => panic!("{status:?}: {notice:?}"),
            }
        }
    }

    #[test]
    // The guard's own non-blocking wait reaps the child: that is what is tested.
    #[allow(clippy::zombie_processes)]
    fn a_dead_guard_process_is_noticed_once() {
        let child = std::process::Command::new("sh").args(["-c", "exit 3"]).spawn().expect("sh");
        let guard = OrphanGuard::inert_with_pid(child.id() as i32);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !guard.is_gone() && std::time::Instant::now() < deadline {
            guard.check_alive();
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(guard.is_gone(), "the exit of the guard process was noticed");
        guard.watch(5); // sends nothing more, and says nothing more
    }
}
