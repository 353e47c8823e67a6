//! Shared helpers for driving the `muster` binary as a user does: real processes, real torch workers.
#![allow(dead_code)] // the harnesses offer more than the tests use today

pub mod apiserver;
pub mod cluster;
pub mod etcd;
pub mod gate;
pub mod gpus;
pub mod netns;
pub mod repeat;

#[path = "../../../fake-nvml/tests/support/mod.rs"]
pub mod fake_nvml;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn muster() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
    cmd.env("PATH", path_with_venv());
    cmd
}

/// The venv Python with torch that `scripts/test.sh` sets up. A test that needs it fails (never skips)
/// when it is missing.
pub fn python() -> PathBuf {
    let p = std::env::var_os("MUSTER_PYTHON")
        .map(PathBuf::from)
        .expect("MUSTER_PYTHON is not set: run the tests through scripts/test.sh, which sets up the torch venv");
    assert!(p.exists(), "MUSTER_PYTHON={} does not exist; run scripts/test.sh", p.display());
    p
}

/// `PATH` with the venv's bin directory first, so `python3` and `torchrun` are the venv's.
pub fn path_with_venv() -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    match std::env::var_os("MUSTER_PYTHON").map(PathBuf::from) {
        Some(py) => format!("{}:{old}", py.parent().unwrap_or(Path::new("/")).display()),
        None => old,
    }
}

pub fn torchrun() -> Command {
    let py = python();
    let mut cmd = Command::new(py.parent().expect("venv bin dir").join("torchrun"));
    cmd.env("PATH", path_with_venv());
    cmd
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

/// A child killed (with its whole process group) and reaped on drop, so no test leaks a process.
pub struct Guard(pub Child);

impl Guard {
    pub fn spawn(cmd: &mut Command) -> Guard {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        Guard(cmd.spawn().expect("spawn"))
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// Waits up to `timeout` for the child to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.0.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: plain kill(2) calls.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a command to completion with a deadline (the test fails if it is exceeded).
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut g = Guard::spawn(cmd);
    let mut out = g.0.stdout.take().expect("stdout");
    let mut err = g.0.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = g.wait_timeout(timeout).unwrap_or_else(|| panic!("command did not finish within {timeout:?}: {cmd:?}"));
    Output { status, stdout: t_out.join().unwrap_or_default(), stderr: t_err.join().unwrap_or_default() }
}

/// `(state, ppid, session)` of a live process from /proc, or None once it is gone. A zombie counts as gone:
/// it has exited and holds nothing but a PID.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let rest = &s[s.rfind(')').map(|i| i + 1).unwrap_or(0)..];
            !matches!(rest.split_whitespace().next(), Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// Polls until `f` holds or `timeout` passes; returns whether it held.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `path` exists and holds at least `lines` lines; returns its content.
pub fn wait_for_lines(path: &Path, lines: usize, timeout: Duration) -> String {
    let mut content = String::new();
    let ok = eventually(timeout, || {
        content = std::fs::read_to_string(path).unwrap_or_default();
        content.lines().count() >= lines
    });
    assert!(ok, "{} did not reach {lines} lines within {timeout:?}; has: {content:?}", path.display());
    content
}

/// Lines of `reader`, on a channel, read by a thread of their own.
pub fn lines_of(reader: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(reader)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `GET path` on `addr` over HTTP/1.0: (status, body), or None when nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// The address an agent logged for its metrics endpoint.
pub fn metrics_addr(agent: &cluster::Agent) -> String {
    let mut addr = None;
    eventually(Duration::from_secs(30), || {
        addr = agent
            .log()
            .lines()
            .find_map(|l| l.split("metrics on http://").nth(1))
            .and_then(|rest| rest.split('/').next())
            .map(str::to_string);
        addr.is_some()
    });
    addr.unwrap_or_else(|| panic!("the agent did not log its metrics address:\n{}", agent.log()))
}
