//! A console that goes away under the agent: the terminal of `ssh -tt` hangs up (a pty closed under it), or
//! stdout and stderr are a pipe nobody reads (`| head`, `ssh` without `-tt`). The agent stops as documented
//! (docs/exit-codes.md), leaves nothing running, and never panics (exit 101); nor do the tools.
//!
//! Real processes, real signals: the pty is the kernel's, the hang-up is its SIGHUP. Every wait is for an
//! event (a pid in /proc, an exit, bytes on the terminal); the deadlines only bound a test that fails.

use crate::common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{alive, eventually, muster, Guard};

/// Bounds a wait that would otherwise hang a failing test; never a measure of speed.
const WAIT: Duration = Duration::from_secs(60);

/// `(comm, ppid)` of a live process.
fn stat(pid: i32) -> Option<(String, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let comm = s.get(s.find('(')? + 1..s.rfind(')')?)?.to_string();
    let mut rest = s.get(s.rfind(')')? + 1..)?.split_whitespace();
    let state = rest.next()?;
    let ppid = rest.next()?.parse().ok()?;
    (state != "Z" && state != "X").then_some((comm, ppid))
}

/// The live children of `parent`, with their names.
fn children(parent: i32) -> Vec<(i32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| stat(pid).filter(|(_, ppid)| *ppid == parent).map(|(comm, _)| (pid, comm)))
        .collect()
}

/// Waits until `parent` has `n` children named `comm` (its workers running); returns them.
fn wait_for_children(parent: i32, comm: &str, n: usize) -> Vec<i32> {
    let mut found = Vec::new();
    let ok = eventually(WAIT, || {
        found = children(parent).into_iter().filter(|(_, c)| c == comm).map(|(pid, _)| pid).collect();
        found.len() >= n
    });
    assert!(ok, "{parent} never had {n} children named {comm}: {:?}", children(parent));
    found
}

/// Every live descendant of `pid`.
fn descendants(pid: i32) -> Vec<i32> {
    let mut all = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        for (child, _) in children(p) {
            all.push(child);
            next.push(child);
        }
    }
    all
}

/// After the agent exited: none of what it started runs. Its workers it has ended itself, before exiting;
/// the orphan guard ends just after it.
fn assert_nothing_left(workers: &[i32], started: &[i32]) {
    let left: Vec<i32> = workers.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "workers {left:?} outlived the agent");
    assert!(eventually(WAIT, || started.iter().all(|p| !alive(*p))), "left running: {:?}", started.iter().filter(|p| alive(**p)).collect::<Vec<_>>());
}

fn wait(guard: &mut Guard) -> ExitStatus {
    guard.wait_timeout(WAIT).unwrap_or_else(|| panic!("pid {} did not exit", guard.pid()))
}

/// The master side of a new pty (kept from children by O_CLOEXEC, which std's `open` sets) and its slave.
fn open_pty() -> (File, File) {
    let master = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open("/dev/ptmx")
        .expect("open /dev/ptmx");
    let mut name = [0u8; 128];
    // SAFETY: plain libc calls on a descriptor we own, with a buffer of the size given.
    let ok = unsafe {
        libc::grantpt(master.as_raw_fd()) == 0
            && libc::unlockpt(master.as_raw_fd()) == 0
            && libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr().cast(), name.len()) == 0
    };
    assert!(ok, "cannot set up the pty: {}", std::io::Error::last_os_error());
    let len = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    let path = std::str::from_utf8(&name[..len]).expect("pty name").to_string();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    (master, slave)
}

/// Runs `cmd` as a session leader whose controlling terminal, stdin, stdout and stderr are the slave, as
/// sshd runs a command under `ssh -tt`.
fn spawn_on_terminal(mut cmd: Command, slave: File) -> Guard {
    let fd = |f: &File| Stdio::from(f.try_clone().expect("dup the pty"));
    cmd.stdin(fd(&slave)).stdout(fd(&slave)).stderr(fd(&slave));
    // SAFETY: setsid and ioctl are async-signal-safe; fd 0 is the slave once std has set up the stdio.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Guard's drop kills the process group, which a session leader's pid names.
    Guard(cmd.spawn().expect("spawn on the pty"))
    // `cmd` and `slave` drop here: only the child holds the slave, so the master's close is its hang-up.
}

/// The user's side of the terminal: a thread reads everything written to it (so nothing blocks on a full
/// pty) and hands it over, until `hang_up` closes it.
struct Terminal {
    wake: OwnedFd,
    output: mpsc::Receiver<Vec<u8>>,
    reader: std::thread::JoinHandle<()>,
}

impl Terminal {
    fn open(master: File) -> Terminal {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors, which are then owned here.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
        let (wake_rx, wake) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (tx, output) = mpsc::channel();
        let reader = std::thread::spawn(move || read_until_woken(master, wake_rx, tx));
        Terminal { wake, output, reader }
    }

    /// Reads what the terminal shows until `want` holds of it; returns it.
    fn wait_for(&self, mut want: impl FnMut(&[u8]) -> bool) -> Vec<u8> {
        let mut seen = Vec::new();
        while !want(&seen) {
            match self.output.recv_timeout(WAIT) {
                Ok(chunk) => seen.extend_from_slice(&chunk),
                Err(e) => panic!("{e}; the terminal showed: {}", String::from_utf8_lossy(&seen)),
            }
        }
        seen
    }

    /// Closes the master side, as sshd does when the connection goes: the kernel hangs up the terminal and
    /// sends SIGHUP to its session leader. Returns once it is closed.
    fn hang_up(self) {
        let mut wake = File::from(self.wake);
        wake.write_all(b"x").expect("wake the terminal's reader");
        self.reader.join().expect("the terminal's reader");
    }
}

fn read_until_woken(mut master: File, wake: OwnedFd, tx: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut fds = [
            libc::pollfd { fd: master.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: poll on two descriptors owned by this thread.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            return; // `master` drops: the hang-up
        }
        match master.read(&mut buf) {
            Ok(n) if n > 0 => {
                let _ = tx.send(buf[..n].to_vec());
            }
            // EIO: every slave is closed (the agent exited first); keep the master until told.
            _ => {
                let mut wake_only = [libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
                // SAFETY: as above.
                unsafe { libc::poll(wake_only.as_mut_ptr(), 1, -1) };
                return;
            }
        }
    }
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).filter(|w| *w == needle).count()
}

/// The ssh -tt recipe: the agent on a terminal that hangs up while its workers run.
fn agent_on_terminal(args: &[&str]) -> (Guard, Terminal) {
    let (master, slave) = open_pty();
    let terminal = Terminal::open(master);
    let mut cmd = muster();
    cmd.args(args);
    (spawn_on_terminal(cmd, slave), terminal)
}

#[test]
fn a_terminal_that_hangs_up_stops_the_agent_with_129_and_nothing_is_left() {
    let (mut agent, terminal) = agent_on_terminal(&["--nproc-per-node", "2", "--no-python", "sleep", "1000"]);
    let workers = wait_for_children(agent.pid(), "sleep", 2);
    let started = descendants(agent.pid());
    terminal.hang_up();
    let status = wait(&mut agent);
    assert_eq!(status.code(), Some(129), "{status:?}: SIGHUP from the hang-up is 128+1 (101 is a panic)");
    assert_nothing_left(&workers, &started);
}

/// Workers that write as fast as they can while the terminal goes: tee'd through the agent's console
/// writer (`--tee 3`, no files to fill), and inherited (the workers write to the terminal themselves and
/// keep going through its EIO).
#[test]
fn a_terminal_that_hangs_up_under_a_flood_of_output_still_gives_129() {
    let flood = "while :; do echo flood-flood-flood-flood-flood-flood-flood-flood-flood-flood || :; done";
    let cases: [(&[&str], &[u8]); 2] = [
        (&["--tee", "3", "--log-dir", "/dev/null"], b"[default1]:flood"),
        (&[], b"flood-flood"),
    ];
    for (flags, marker) in cases {
        let mut args = vec!["--nproc-per-node", "2"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--no-python", "sh", "-c", flood]);
        let (mut agent, terminal) = agent_on_terminal(&args);
        let workers = wait_for_children(agent.pid(), "sh", 2);
        let started = descendants(agent.pid());
        terminal.wait_for(|seen| count(seen, marker) >= 1000);
        terminal.hang_up();
        let status = wait(&mut agent);
        assert_eq!(status.code(), Some(129), "{flags:?}: {status:?}");
        assert_nothing_left(&workers, &started);
    }
}

/// A terminal that hangs up without a SIGHUP for the agent, as when a shell that does not exec its last
/// command is the session leader (`ssh -tt host 'cd dir && muster ...'` without docs/contexts.md's `exec`): the job
/// goes on, its workers fail (their stdin, the terminal, ends), and the failure summary goes to the dead
/// terminal: exit 1, the documented code for a failed job.
#[test]
fn a_failure_summary_written_to_a_hung_up_terminal_still_gives_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let status_file = dir.path().join("status");
    let (master, slave) = open_pty();
    let terminal = Terminal::open(master);
    // The leader ignores the hang-up's SIGHUP and keeps the agent's exit status where it can be read.
    let mut cmd = Command::new("sh");
    cmd.env("PATH", common::path_with_venv()).args(["-c", r#"trap "" HUP; "$@"; echo $? > "$0""#]);
    cmd.arg(&status_file).arg(env!("CARGO_BIN_EXE_muster"));
    cmd.args(["--nproc-per-node", "2", "--max-restarts", "0", "--no-python", "sh", "-c", "read x; exit 1"]);
    let mut leader = spawn_on_terminal(cmd, slave);
    let agent = wait_for_children(leader.pid(), "muster", 1)[0];
    let workers = wait_for_children(agent, "sh", 2);
    let started = descendants(agent);
    terminal.hang_up();
    assert_eq!(wait(&mut leader).code(), Some(0), "the leader shell");
    let code = std::fs::read_to_string(&status_file).expect("the agent's exit status");
    assert_eq!(code.trim(), "1", "a failed job is 1 (101 is a panic)");
    assert_nothing_left(&workers, &started);
}

/// A pipe whose reader is gone before anything is written: every write to it fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors, which are then owned here.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

/// The agent with stdout and stderr a closed pipe.
fn agent_on_closed_pipe(args: &[&str]) -> Guard {
    let pipe = closed_pipe();
    let mut cmd = muster();
    cmd.args(args).stdin(Stdio::null());
    cmd.stdout(pipe.try_clone().expect("dup")).stderr(pipe);
    Guard::spawn(&mut cmd)
}

#[test]
fn on_a_closed_pipe_a_job_that_succeeds_gives_0_and_the_loss_is_an_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let events_arg = format!("--event-log={}", events.display());
    // --tee: the workers' lines go through the agent's console writer, into the closed pipe too.
    let args = ["--nproc-per-node", "2", "--tee", "3", &events_arg, "--no-python", "echo", "hello"];
    let mut agent = agent_on_closed_pipe(&args);
    let status = wait(&mut agent);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let text = std::fs::read_to_string(&events).expect("the event log");
    let lost: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["name"] == "muster.agent.console_lost")
        .collect();
    assert!(lost.iter().any(|e| e["stream"] == "stderr"), "no console_lost event for stderr in:\n{text}");
    assert_eq!(lost.iter().filter(|e| e["stream"] == "stderr").count(), 1, "said once:\n{text}");
}

#[test]
fn on_a_closed_pipe_a_job_that_fails_gives_1() {
    let mut agent = agent_on_closed_pipe(&["--nproc-per-node", "2", "--max-restarts", "0", "--no-python", "false"]);
    let status = wait(&mut agent);
    assert_eq!(status.code(), Some(1), "{status:?}: the failed job's code (101 is a panic)");
}

#[test]
fn on_a_closed_pipe_a_sigterm_gives_143_and_nothing_is_left() {
    let mut agent = agent_on_closed_pipe(&["--nproc-per-node", "2", "--no-python", "sleep", "1000"]);
    let workers = wait_for_children(agent.pid(), "sleep", 2);
    let started = descendants(agent.pid());
    // SAFETY: kill(2) of our own child.
    assert_eq!(unsafe { libc::kill(agent.pid(), libc::SIGTERM) }, 0);
    let status = wait(&mut agent);
    assert_eq!((status.code(), status.signal()), (Some(143), None), "{status:?}");
    assert_nothing_left(&workers, &started);
}

#[test]
fn the_tools_on_a_closed_stdout_do_not_panic() {
    let cases: [&[&str]; 5] = [
        &["--help"],
        &["--print-completion", "bash"],
        &["plan"],
        &["plan", "--format", "json"],
        &["store", "--help"],
    ];
    for args in cases {
        let mut cmd = muster();
        cmd.args(args).stdin(Stdio::null()).stdout(closed_pipe()).stderr(Stdio::piped());
        let out = cmd.output().expect("run muster");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "muster {args:?}: {:?}\n{stderr}", out.status);
        assert!(!stderr.contains("panicked"), "muster {args:?}:\n{stderr}");
    }
}
