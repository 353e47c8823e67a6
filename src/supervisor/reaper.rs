//! Nothing outlives the agent: the orphan guard, session sweeps, and reaping adopted children.
//!
//! Three layers, because each covers what the others cannot:
//! - every worker has a parent-death signal of SIGKILL (set in `spawn.rs`), which kills the worker itself
//!   when the agent dies, however it dies;
//! - the *orphan guard*, a tiny process forked before the runtime starts, learns each worker's session id over
//!   a pipe. When the pipe reaches EOF — the agent has exited or was SIGKILLed — it SIGKILLs every process
//!   still in those sessions (a dataloader worker, a `bash -c` grandchild) and exits;
//! - the agent is a child subreaper, so orphaned grandchildren are re-parented to it while it runs; it kills
//!   them by session on every stop and reaps the zombies (also what PID 1 in a container must do).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::{ForkResult, Pid};

/// One line of `/proc/<pid>/stat` that matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub session: i32,
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
    Some(ProcStat { pid, state, ppid, session })
}

/// Every process visible in `/proc`, skipping ones that vanish while we read.
pub fn processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|t| parse_stat(&t))
        .collect()
}

/// SIGKILLs every live process whose session is one of `sessions`, repeating while new ones appear (a
/// process may fork between the scan and the kill). Returns how many were signalled.
///
/// With `ancestor`, only that process's descendants are candidates: once a worker (the session leader) has
/// exited its PID, and so the session id, may be reused by an unrelated new session — another job's worker.
/// The agent, a subreaper, is the ancestor of everything its workers left behind; the orphan guard, which
/// runs after the agent is gone, has no ancestor to check and sweeps at once.
pub fn kill_sessions(sessions: &HashSet<i32>, ancestor: Option<i32>) -> usize {
    if sessions.is_empty() {
        return 0;
    }
    let me = std::process::id() as i32;
    let mut total = 0;
    for _ in 0..5 {
        let all = processes();
        let parent: std::collections::HashMap<i32, i32> = all.iter().map(|p| (p.pid, p.ppid)).collect();
        let descends = |mut pid: i32, from: i32| {
            for _ in 0..64 {
                match parent.get(&pid) {
                    Some(&ppid) if ppid == from => return true,
                    Some(&ppid) if ppid > 1 => pid = ppid,
                    _ => return false,
                }
            }
            false
        };
        let victims: Vec<i32> = all
            .iter()
            .filter(|p| sessions.contains(&p.session) && p.state != 'Z' && p.pid != me)
            .filter(|p| ancestor.is_none_or(|a| descends(p.pid, a)))
            .map(|p| p.pid)
            .collect();
        if victims.is_empty() {
            break;
        }
        for pid in &victims {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        total += victims.len();
    }
    total
}

/// PIDs of the agent's own direct children whose exit status belongs to someone else (tokio, for workers;
/// the agent, for the guard). Spawning holds the lock across fork and insert, so the zombie reaper can never
/// take a status tokio is waiting for.
pub static OWN_CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Reaps zombie children the agent adopted as a subreaper (or as PID 1) — never its own workers.
pub fn reap_adopted() -> usize {
    let me = std::process::id() as i32;
    let Ok(own) = OWN_CHILDREN.lock() else { return 0 };
    let mut reaped = 0;
    for p in processes() {
        if p.ppid == me && p.state == 'Z' && !own.contains(&p.pid) {
            if let Ok(status) = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG)) {
                tracing::debug!(pid = p.pid, ?status, "reaped adopted process");
                reaped += 1;
            }
        }
    }
    reaped
}

/// Reaps adopted zombies whenever a child changes state (SIGCHLD), off the async threads.
pub fn spawn_adopted_reaper() {
    let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) else {
        tracing::warn!("cannot watch SIGCHLD; adopted orphans will stay zombies until the agent exits");
        return;
    };
    tokio::spawn(async move {
        while sigchld.recv().await.is_some() {
            let _ = tokio::task::spawn_blocking(reap_adopted).await;
        }
    });
}

/// The agent's end of the orphan guard.
#[derive(Debug)]
pub struct OrphanGuard {
    pipe: Mutex<std::fs::File>,
}

impl OrphanGuard {
    /// Forks the guard and makes this process a child subreaper.
    ///
    /// Must run before any other thread exists (before the tokio runtime): the child only runs plain Rust
    /// after `fork`, which is sound in a single-threaded process.
    pub fn start() -> std::io::Result<OrphanGuard> {
        nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)?;
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        // SAFETY: called while the process is single-threaded (see above).
        match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
            ForkResult::Child => {
                drop(write);
                guard_main(read)
            }
            ForkResult::Parent { child } => {
                drop(read);
                if let Ok(mut own) = OWN_CHILDREN.lock() {
                    own.push(child.as_raw());
                }
                Ok(OrphanGuard { pipe: Mutex::new(std::fs::File::from(write)) })
            }
        }
    }

    /// From now on the guard kills session `sid` if the agent dies.
    pub fn watch(&self, sid: i32) {
        self.send(&format!("+{sid}\n"));
    }

    /// Session `sid` has been swept by the agent itself; the guard forgets it (its id may be reused).
    pub fn forget(&self, sid: i32) {
        self.send(&format!("-{sid}\n"));
    }

    fn send(&self, line: &str) {
        // A line is far below PIPE_BUF, so the write is atomic; the guard reads continuously.
        if let Ok(mut pipe) = self.pipe.lock() {
            if let Err(e) = pipe.write_all(line.as_bytes()) {
                tracing::warn!("orphan guard is gone ({e}); workers may outlive a crash of this agent");
            }
        }
    }
}

/// The guard process: track sessions until the agent's end of the pipe closes, then kill what is left.
fn guard_main(read: OwnedFd) -> ! {
    // Out of the agent's session so a terminal's Ctrl-C or a kill of the agent's group leaves it alive to
    // clean up; immune to the polite signals, it ends only at EOF.
    let _ = nix::unistd::setsid();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGPIPE] {
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
    let reader = BufReader::new(std::fs::File::from(read));
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let (op, sid) = line.split_at(line.len().min(1));
        match (op, sid.parse::<i32>()) {
            ("+", Ok(sid)) => {
                sessions.insert(sid);
            }
            ("-", Ok(sid)) => {
                sessions.remove(&sid);
            }
            _ => {}
        }
    }
    kill_sessions(&sessions, None);
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::parse_stat;

    #[test]
    fn stat_with_odd_command_names() {
        let s = parse_stat("4242 (py (worker) 1) S 17 4242 4242 0 -1 4194560 0").unwrap();
        assert_eq!((s.pid, s.state, s.ppid, s.session), (4242, 'S', 17, 4242));
        assert!(parse_stat("garbage").is_none());
    }
}
