//! Reading a worker's Python stacks from outside the process (py-spy as a library): every thread, without
//! stopping it (a hung process's stack does not move, and a running one must not be paused by a scrape of
//! `/stacks`). Each capture runs on a thread of its own under a deadline, so a process in uninterruptible
//! sleep cannot stall the agent; a thread that outlives its deadline is left to finish on its own.

use std::io::BufRead;
use std::time::{Duration, Instant};

use serde::Serialize;

/// A worker to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Target {
    pub rank: u32,
    pub local_rank: u32,
    pub pid: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: i32,
    /// The source line, when the file can be read here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl Frame {
    /// `train.py:88 load_batch`, the file by its last path component.
    pub fn short(&self) -> String {
        let file = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{file}:{} {}", self.line, self.function)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Thread {
    pub name: Option<String>,
    pub os_thread_id: Option<u64>,
    /// Running on a CPU (py-spy's "active"), as opposed to waiting.
    pub active: bool,
    pub owns_gil: bool,
    /// Innermost first.
    pub frames: Vec<Frame>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum CaptureError {
    #[error(
        "reading its memory is not permitted (ptrace): grant the agent CAP_SYS_PTRACE (docker run --cap-add \
         SYS_PTRACE; Kubernetes securityContext.capabilities.add: [SYS_PTRACE]) or lower kernel.yama.ptrace_scope \
         to 1 or less; hang detection goes on without stacks"
    )]
    Denied,
    #[error("the process is gone")]
    Gone,
    #[error("no answer within {0:?} (the process may be in uninterruptible sleep)")]
    Timeout(Duration),
    #[error("{0}")]
    Failed(String),
}

impl CaptureError {
    /// A few words for the verdict line (the stack files and `/stacks` give the whole message).
    pub fn short(&self) -> &'static str {
        match self {
            CaptureError::Denied => "ptrace not permitted",
            CaptureError::Gone => "process gone",
            CaptureError::Timeout(_) => "no answer in time",
            CaptureError::Failed(_) => "stack unreadable",
        }
    }
}

/// One worker's capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capture {
    #[serde(flatten)]
    pub target: Target,
    /// The process state from `/proc/<pid>/stat` (R running, S sleeping, D uninterruptible, ...).
    pub state: Option<String>,
    pub threads: Result<Vec<Thread>, CaptureError>,
    pub took_ms: u64,
}

impl Capture {
    /// The main thread (the one whose OS id is the process's), else the first.
    pub fn main_thread(&self) -> Option<&Thread> {
        let threads = self.threads.as_ref().ok()?;
        threads.iter().find(|t| t.os_thread_id == Some(self.target.pid as u64)).or_else(|| threads.first())
    }

    /// The capture as the `rank_<R>.txt` file shows it.
    pub fn text(&self) -> String {
        let t = &self.target;
        let state = self.state.as_deref().unwrap_or("?");
        let mut out = format!("rank {} (local rank {}, pid {}, state {state})\n", t.rank, t.local_rank, t.pid);
        match &self.threads {
            Err(e) => out.push_str(&format!("no stack: {e}\n")),
            Ok(threads) => {
                for th in threads {
                    let name = th.name.as_deref().unwrap_or("?");
                    let tid = th.os_thread_id.map(|t| t.to_string()).unwrap_or_else(|| "?".into());
                    let what = match (th.active, th.owns_gil) {
                        (_, true) => "active, holds the GIL",
                        (true, false) => "active",
                        (false, false) => "idle",
                    };
                    out.push_str(&format!("\nThread {tid} ({name}, {what}):\n"));
                    for f in &th.frames {
                        out.push_str(&format!("    {} ({}:{})\n", f.function, f.file, f.line));
                        if let Some(code) = &f.code {
                            out.push_str(&format!("        {code}\n"));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Frames kept per thread: the innermost ones say where it is.
const MAX_FRAMES: usize = 64;

/// Captures every target at once, each within `bound` (off the async threads).
pub async fn capture_all(targets: &[Target], bound: Duration) -> Vec<Capture> {
    let pending: Vec<_> = targets
        .iter()
        .map(|&target| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let spawned = std::thread::Builder::new().name(format!("muster-stack-{}", target.rank)).spawn(move || {
                let _ = tx.send(capture(target));
            });
            (target, spawned.ok().map(|_| rx))
        })
        .collect();
    let deadline = tokio::time::Instant::now() + bound;
    let mut out = Vec::with_capacity(pending.len());
    for (target, rx) in pending {
        let threads = match rx {
            None => Err(CaptureError::Failed("cannot start a capture thread".into())),
            Some(rx) => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(capture)) => {
                    out.push(capture);
                    continue;
                }
                Ok(Err(_)) => Err(CaptureError::Failed("the capture thread ended without a result".into())),
                Err(_) => Err(CaptureError::Timeout(bound)),
            },
        };
        out.push(Capture { target, state: proc_state(target.pid), threads, took_ms: bound.as_millis() as u64 });
    }
    out
}

/// One capture (blocking).
pub fn capture(target: Target) -> Capture {
    let start = Instant::now();
    let mut config = py_spy::Config::default();
    config.blocking = py_spy::config::LockingStrategy::NonBlocking;
    let state = proc_state(target.pid);
    let threads = py_spy::PythonSpy::new(target.pid, &config)
        .and_then(|mut spy| spy.get_stack_traces())
        .map(|traces| traces.into_iter().map(thread).collect())
        .map_err(|e| classify(target.pid, &e));
    Capture { target, state, threads, took_ms: start.elapsed().as_millis() as u64 }
}

fn thread(trace: py_spy::StackTrace) -> Thread {
    Thread {
        name: trace.thread_name,
        os_thread_id: trace.os_thread_id,
        active: trace.active,
        owns_gil: trace.owns_gil,
        frames: trace
            .frames
            .into_iter()
            .take(MAX_FRAMES)
            .map(|f| Frame { code: source_line(&f.filename, f.line), function: f.name, file: f.filename, line: f.line })
            .collect(),
    }
}

/// What a failed capture means: py-spy's errors are text, so the process's own state decides between
/// "gone", "not permitted" and anything else.
fn classify(pid: i32, e: &anyhow::Error) -> CaptureError {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return CaptureError::Gone;
    }
    if is_denied(e) {
        CaptureError::Denied
    } else {
        CaptureError::Failed(format!("{e:#}").lines().next().unwrap_or_default().to_string())
    }
}

/// Whether py-spy's error says reading the process is not permitted (ptrace).
pub fn is_denied(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
            || c.to_string().contains("Operation not permitted")
            || c.to_string().contains("Permission denied")
    })
}

/// The state letter of `/proc/<pid>/stat` (after the parenthesised command, which may hold spaces).
pub fn proc_state(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next().map(str::to_string)
}

/// Line `line` of `file`, trimmed, when it is a readable file (scripts are; `<string>` is not).
fn source_line(file: &str, line: i32) -> Option<String> {
    let n = usize::try_from(line).ok()?.checked_sub(1)?;
    let f = std::fs::File::open(file).ok()?;
    let text = std::io::BufReader::new(f).lines().nth(n)?.ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.chars().take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_past_a_command_with_spaces_and_parentheses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let odd = dir.path().join("a) (b");
        std::fs::copy("/bin/sleep", &odd).expect("copy sleep");
        let mut child = std::process::Command::new(&odd).arg("30").spawn().expect("spawn");
        let pid = child.id() as i32;
        let mut state = None;
        for _ in 0..500 {
            state = proc_state(pid);
            if state.as_deref() == Some("S") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(state.as_deref(), Some("S"));
        assert_eq!(proc_state(-1), None);
    }

    #[test]
    fn a_source_line_is_read_only_from_a_real_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.py");
        std::fs::write(&path, "a = 1\n    time.sleep(5)  \n").expect("write");
        let p = path.to_str().expect("utf-8");
        assert_eq!(source_line(p, 2).as_deref(), Some("time.sleep(5)"));
        assert_eq!(source_line(p, 3), None);
        assert_eq!(source_line(p, 0), None);
        assert_eq!(source_line("<string>", 1), None);
    }

    #[test]
    fn a_process_that_is_not_python_fails_without_a_stack_and_a_gone_one_says_so() {
        let me = capture(Target { rank: 0, local_rank: 0, pid: std::process::id() as i32 });
        assert!(matches!(me.threads, Err(CaptureError::Failed(_))), "{:?}", me.threads);
        let gone = capture(Target { rank: 1, local_rank: 1, pid: i32::MAX });
        assert_eq!(gone.threads, Err(CaptureError::Gone));
    }
}
