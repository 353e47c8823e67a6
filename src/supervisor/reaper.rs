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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use super::cgroup::{self, JobCgroup, Unavailable};

/// How long the processes of a killed cgroup may take to exit (only uninterruptible sleep delays SIGKILL).
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// One line of `/proc/<pid>/stat` that matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub session: i32,
    /// Clock ticks after boot: with the PID, names one process even once the PID is reused.
    pub start: u64,
}

/// Parses `/proc/<pid>/stat`; the command name may contain spaces and parentheses, so fields are counted
/// from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let _pgrp = f.next()?;
    let session = f.next()?.parse().ok()?;
    // Field 22 of stat(5); the fields after the command name start at 3.
    let start = f.nth(22 - 7)?.parse().ok()?;
    Some(ProcStat { pid, state, ppid, session, start })
}

/// Every process visible in `/proc` at one moment, with who is whose parent.
pub struct Tree {
    procs: HashMap<i32, ProcStat>,
}

impl Tree {
    /// Reads `/proc`, skipping processes that vanish while we read.
    pub fn scan() -> Tree {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Tree::of(Vec::new()) };
        let procs = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|t| parse_stat(&t))
            .collect();
        Tree::of(procs)
    }

    /// Reads just these processes (e.g. a cgroup's members), skipping those that are gone.
    pub fn of_pids(pids: &[i32]) -> Tree {
        Tree::of(pids.iter().filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()).filter_map(|t| parse_stat(&t)).collect())
    }

    fn of(procs: Vec<ProcStat>) -> Tree {
        Tree { procs: procs.into_iter().map(|p| (p.pid, p)).collect() }
    }

    /// The processes that have not exited (a zombie holds nothing but its PID).
    pub fn live(&self) -> impl Iterator<Item = &ProcStat> {
        self.procs.values().filter(|p| p.state != 'Z' && p.state != 'X')
    }

    /// `pid`, its parent, its parent's parent... up to init.
    fn lineage(&self, pid: i32) -> impl Iterator<Item = &ProcStat> {
        std::iter::successors(self.procs.get(&pid), |p| self.procs.get(&p.ppid)).take(64)
    }

    /// Whether `pid` is below `ancestor`.
    pub fn descends(&self, pid: i32, ancestor: i32) -> bool {
        self.lineage(pid).skip(1).any(|p| p.pid == ancestor)
    }
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
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            stopped.insert(pid);
        }
    }
    for pid in &stopped {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    stopped.len()
}

/// PIDs of the agent's own direct children whose exit status belongs to someone else (tokio, for workers;
/// the agent, for the guard). Spawning holds the lock across fork and insert, so the zombie reaper can never
/// take a status tokio is waiting for.
static OWN_CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// `OWN_CHILDREN`, whatever a panic elsewhere left it as: a list of pids stays a valid list.
fn own_children_lock() -> std::sync::MutexGuard<'static, Vec<i32>> {
    OWN_CHILDREN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Spawns `cmd` as one of the agent's own children (a worker, a spare, a hook): the lock is held across
/// fork and registration, so the zombie reaper never takes the exit status its waiter reads. [`disown`] it
/// once that status is read (or nobody will read it).
pub fn spawn_own(cmd: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    let mut own = own_children_lock();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        own.push(pid as i32);
    }
    Ok(child)
}

/// `pid`'s exit status is no longer anyone's to wait for: the zombie reaper may take it.
pub fn disown(pid: i32) {
    own_children_lock().retain(|p| *p != pid);
}

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
    let own = own_children_lock();
    // Read under the lock: a worker is either not forked yet or already in `own`. With a cgroup only the
    // agent's children matter (the cgroup holds the rest); without, every descendant does.
    let tree = match (&guard.cgroup, own_children()) {
        (Ok(_), Some(children)) => Tree::of_pids(&children),
        _ => Tree::scan(),
    };
    for p in tree.procs.values() {
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
    cgroup: Result<JobCgroup, Unavailable>,
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
                own_children_lock().push(child.as_raw());
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
    fn check_alive(&self) {
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

    /// Reads the agent's children now, as on SIGCHLD: for a session just forgotten that may have left
    /// processes. Blocking (reads `/proc`).
    pub fn recheck(&self) {
        on_child_event(self);
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
    fn track(&self, tree: &Tree, own: &[i32]) {
        let me = std::process::id() as i32;
        let (Ok(sessions), Ok(mut told)) = (self.sessions.lock(), self.told.lock()) else { return };
        let alive = |pid: i32, start: u64| tree.procs.get(&pid).is_some_and(|p| p.start == start && p.state != 'Z');
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
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;
    use nix::sys::signal::Signal;
    use nix::sys::wait::WaitStatus;
    use nix::unistd::Pid;

    use super::{guard_death_notice, on_child_event, parse_stat, spawn_own, OrphanGuard, ProcStat, Tree};

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
        let mut own = zombie(|cmd| spawn_own(cmd).expect("spawn"));
        let pid = own.id().map_or(0, |p| p as i32);
        on_child_event(&guard);
        let status = own.wait().await.expect("its status is still there");
        assert_eq!(status.code(), Some(3));
        super::disown(pid);
        // A child spawned past the registry is what the reaper takes: the case above is not vacuous.
        let mut stray = zombie(|cmd| cmd.spawn().expect("spawn"));
        on_child_event(&guard);
        assert!(stray.wait().await.is_err(), "the reaper took the unregistered child's status");
    }

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

    #[test]
    fn descendants_through_adoption_and_new_sessions() {
        let p = |pid, ppid, session| ProcStat { pid, state: 'S', ppid, session, start: 0 };
        // 10 is the agent; 11 a worker; 20 its child in a session of its own; 30 a daemon adopted by the agent;
        // 40 someone else's process.
        let tree = Tree::of(vec![p(1, 0, 1), p(10, 1, 5), p(11, 10, 11), p(20, 11, 20), p(30, 10, 25), p(40, 1, 40)]);
        let cases = [(11, true), (20, true), (30, true), (40, false), (10, false), (1, false), (99, false)];
        for (pid, below_agent) in cases {
            assert_eq!(tree.descends(pid, 10), below_agent, "{pid}");
        }
        assert!(tree.descends(10, 1), "everything descends from init, the agent as PID 1 included");
        let lineage: Vec<i32> = tree.lineage(20).map(|p| p.pid).collect();
        assert_eq!(lineage, [20, 11, 10, 1]);
    }

    #[test]
    fn stat_with_odd_command_names() {
        let line = "4242 (py (worker) 1) S 17 4242 4242 0 -1 4194560 1 0 0 0 5 2 0 0 20 0 1 0 987654 1000 2";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.pid, s.state, s.ppid, s.session, s.start), (4242, 'S', 17, 4242, 987654));
        assert!(parse_stat("garbage").is_none());
    }
}
