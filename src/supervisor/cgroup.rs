//! The job cgroup (cgroup v2): nothing a worker starts can leave it.
//!
//! A process's cgroup is inherited by everything it forks and changes only when someone writes to
//! `cgroup.procs`; `setsid`, double forks and re-parenting leave it alone. So every worker, warm spare and
//! hook joins the job cgroup before exec (`join`, in `pre_exec`), and ending the job is one write to
//! `cgroup.kill` (`kill_and_remove`), done by the agent at its end and by the orphan guard when the agent is
//! gone, however it died. The job cgroup is `muster-<pid>` under the agent's own cgroup, so the agent and
//! the guard stay outside it and any limits of the agent's cgroup (Slurm's step, a container) still apply.
//! Where it cannot be created (no cgroup v2, no delegation, a read-only cgroupfs, a kernel without
//! `cgroup.kill`) or `MUSTER_CGROUP=off`, the supervisor relies on sessions and the subreaper (`guard.rs`, `reaper.rs`).

use std::fmt;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `off`: never create a job cgroup (the session and subreaper fallback); `auto` (or unset): create one
/// where the agent may.
pub const SETTING_VAR: &str = "MUSTER_CGROUP";

#[derive(Debug, thiserror::Error)]
#[error("{SETTING_VAR}={0:?} is not valid; use `auto` (a job cgroup where possible, the default) or `off`")]
pub struct BadSetting(pub String);

/// Whether the agent tries to create a job cgroup, from `MUSTER_CGROUP`.
pub fn wanted(value: Option<&str>) -> Result<bool, BadSetting> {
    match value {
        None | Some("auto") => Ok(true),
        Some("off") => Ok(false),
        Some(other) => Err(BadSetting(other.to_string())),
    }
}

/// Why there is no job cgroup.
#[derive(Debug)]
pub enum Unavailable {
    Off,
    /// No `0::` line in /proc/self/cgroup: cgroup v2 is not in use here.
    NoV2,
    /// The agent's cgroup is not under any cgroup2 mount this process can see.
    NotMounted(String),
    Create(PathBuf, std::io::Error),
    /// The kernel predates `cgroup.kill` (5.14).
    NoKill(PathBuf),
    Read(&'static str, std::io::Error),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::Off => write!(f, "{SETTING_VAR}=off"),
            Unavailable::NoV2 => write!(f, "no cgroup v2 hierarchy"),
            Unavailable::NotMounted(cg) => write!(f, "the agent's cgroup {cg} is not under a visible cgroup2 mount"),
            Unavailable::Create(dir, e) => write!(f, "cannot create {}: {e}", dir.display()),
            Unavailable::NoKill(dir) => write!(f, "{} has no cgroup.kill (kernel older than 5.14)", dir.display()),
            Unavailable::Read(what, e) => write!(f, "cannot read {what}: {e}"),
        }
    }
}

/// The agent's cgroup v2 path from /proc/self/cgroup (the `0::` line).
pub fn own_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim_end)
}

/// The directory of cgroup `path` (as /proc/self/cgroup names it) from /proc/self/mountinfo: under a cgroup2
/// mount whose root contains it.
pub fn dir_of(path: &str, mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace().skip(3);
        let (root, mount) = (unescape(fields.next()?), unescape(fields.next()?));
        let rest = if root == "/" { Some(path) } else { path.strip_prefix(root.as_str()) }?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        Some(Path::new(&mount).join(rest.trim_start_matches('/')))
    })
}

/// mountinfo writes space, tab, newline and backslash in paths as octal escapes (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8).wrapping_add(b - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The job cgroup, created by this agent.
#[derive(Debug)]
pub struct JobCgroup {
    dir: PathBuf,
    /// Its `cgroup.procs`, opened once so that a child joins with one write and no allocation.
    procs: OwnedFd,
    /// The agent's own cgroup's `cgroup.procs`, for [`JobCgroup::prime`] (None if it cannot be opened).
    own_procs: Option<OwnedFd>,
}

impl JobCgroup {
    /// Creates `muster-<pid>` (or `muster-<pid>-<n>` if a dead agent with this PID left one) under the agent's
    /// own cgroup.
    pub fn create() -> Result<JobCgroup, Unavailable> {
        let read = |what| std::fs::read_to_string(what).map_err(|e| Unavailable::Read(what, e));
        let proc_cgroup = read("/proc/self/cgroup")?;
        let path = own_path(&proc_cgroup).ok_or(Unavailable::NoV2)?;
        let parent = dir_of(path, &read("/proc/self/mountinfo")?).ok_or_else(|| Unavailable::NotMounted(path.into()))?;
        let pid = std::process::id();
        let mut n = 0;
        let dir = loop {
            let dir = parent.join(if n == 0 { format!("muster-{pid}") } else { format!("muster-{pid}-{n}") });
            match std::fs::create_dir(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 16 => n += 1,
                Err(e) => return Err(Unavailable::Create(dir, e)),
            }
        };
        if !dir.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&dir);
            return Err(Unavailable::NoKill(dir));
        }
        // O_CLOEXEC (std's default): the fd reaches the child's pre_exec but not the program it runs.
        let own_procs = std::fs::OpenOptions::new().write(true).open(parent.join("cgroup.procs")).ok().map(OwnedFd::from);
        match std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs")) {
            Ok(file) => Ok(JobCgroup { dir, procs: file.into(), own_procs }),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(Unavailable::Create(dir, e))
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the next few milliseconds' joins cheap, off the caller's thread: the first move into a cgroup
    /// after a quiet spell waits out an RCU grace period in the kernel (about 8 ms here), which would
    /// otherwise delay the first worker's exec. Moving the agent into the cgroup it is already in pays it
    /// in the background while the agent does other work (a rendezvous, a placement); joins soon after are
    /// fast. Best effort: without the descriptor or on any error, the first join pays instead.
    pub fn prime(&self) {
        let Some(fd) = self.own_procs.as_ref().and_then(|fd| fd.try_clone().ok()) else { return };
        let pid = std::process::id().to_string();
        let spawned = std::thread::Builder::new().name("muster-cgroup-prime".into()).spawn(move || {
            let mut file = std::fs::File::from(fd);
            let _ = std::io::Write::write_all(&mut file, pid.as_bytes());
        });
        if let Err(e) = spawned {
            tracing::debug!("cannot prime the job cgroup: {e}");
        }
    }

    /// The processes in the cgroup now (empty if it cannot be read).
    pub fn members(&self) -> std::io::Result<Vec<i32>> {
        let text = std::fs::read_to_string(self.dir.join("cgroup.procs"))?;
        Ok(text.split_whitespace().filter_map(|p| p.parse().ok()).collect())
    }

    /// The descriptor a child passes to `join`.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` ("0" is the writer itself).
/// Async-signal-safe (one write, no allocation): for `pre_exec`.
pub fn join(procs: RawFd) -> std::io::Result<()> {
    // SAFETY: write(2) of a static one-byte buffer.
    if unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) } == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KillError {
    #[error("cannot kill the processes of cgroup {0}: {1}")]
    Kill(PathBuf, std::io::Error),
    #[error("cgroup {0} still has processes {1:?} after cgroup.kill (uninterruptible kernel sleep?)")]
    StillPopulated(PathBuf, Duration),
    #[error("cannot remove cgroup {0}: {1}")]
    Remove(PathBuf, std::io::Error),
}

/// SIGKILLs every process in the cgroup at `dir` (`cgroup.kill`: atomic, no fork can race it), waits up to
/// `timeout` until it is empty and removes it. A cgroup already removed is not an error. Blocking.
pub fn kill_and_remove(dir: &Path, timeout: Duration) -> Result<(), KillError> {
    match std::fs::write(dir.join("cgroup.kill"), "1") {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(KillError::Kill(dir.to_path_buf(), e)),
    }
    if !wait_empty(dir, timeout) {
        return Err(KillError::StillPopulated(dir.to_path_buf(), timeout));
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(KillError::Remove(dir.to_path_buf(), e)),
    }
}

/// Waits until `cgroup.events` says `populated 0`: the kernel wakes a poll(2) for POLLPRI on every change.
fn wait_empty(dir: &Path, timeout: Duration) -> bool {
    let Ok(mut events) = std::fs::File::open(dir.join("cgroup.events")) else { return true };
    let deadline = Instant::now() + timeout;
    let mut text = String::new();
    loop {
        text.clear();
        // A fresh read from the start each time re-arms the notification.
        let read = std::io::Seek::rewind(&mut events).and_then(|()| events.read_to_string(&mut text));
        if read.is_err() || !populated(&text) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut pfd = libc::pollfd { fd: events.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one pollfd that outlives the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
    }
}

/// Whether `cgroup.events` text says the cgroup still has processes.
fn populated(events: &str) -> bool {
    events.lines().any(|l| l.trim() == "populated 1")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_agents_cgroup_directory() {
        let hybrid = "4:memory:/x\n1:cpu:/\n0::/\n";
        assert_eq!(own_path(hybrid), Some("/"));
        assert_eq!(own_path("4:memory:/x\n"), None, "cgroup v1 only");
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("/", MOUNTINFO, Some("/sys/fs/cgroup/unified")),
            ("/job_7/step_0/user/task_0", MOUNTINFO, Some("/sys/fs/cgroup/unified/job_7/step_0/user/task_0")),
            // A container that sees only its own subtree, mounted at /sys/fs/cgroup.
            ("/docker/abc", "99 1 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", Some("/sys/fs/cgroup")),
            ("/docker/abc/x", "99 1 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", Some("/sys/fs/cgroup/x")),
            ("/docker/abcd", "99 1 0:40 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", None),
            ("/", "1 0 0:1 / /with\\040space rw shared:3 - cgroup2 none rw\n", Some("/with space")),
            ("/", "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n", None),
        ];
        for (path, mountinfo, want) in cases {
            assert_eq!(dir_of(path, mountinfo).as_deref(), want.map(Path::new), "{path} in {mountinfo}");
        }
    }

    #[test]
    fn setting() {
        assert!(wanted(None).unwrap());
        assert!(wanted(Some("auto")).unwrap());
        assert!(!wanted(Some("off")).unwrap());
        let e = wanted(Some("no")).unwrap_err().to_string();
        assert!(e.contains("MUSTER_CGROUP=\"no\"") && e.contains("`off`"), "{e}");
    }

    #[test]
    fn populated_from_cgroup_events() {
        assert!(populated("populated 1\nfrozen 0\n"));
        assert!(!populated("populated 0\nfrozen 0\n"));
    }
}
