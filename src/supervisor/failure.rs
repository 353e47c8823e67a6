//! Worker failures as torchrun reports them: the `@record` error file, the root cause, and the
//! `ChildFailedError` summary block (torch/distributed/elastic/multiprocessing/errors), value for value.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// One failed worker (torch's `ProcessFailure`).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessFailure {
    pub local_rank: u32,
    pub global_rank: u32,
    pub pid: i32,
    /// The exit code, or minus the signal number when the worker was killed by a signal.
    pub exitcode: i32,
    /// The error file when the worker wrote one.
    pub error_file: Option<PathBuf>,
    /// The parsed error file, when there is one.
    pub error_data: Option<Value>,
    /// Seconds since the epoch: from the error file, else when the exit was noticed.
    pub timestamp: i64,
}

impl ProcessFailure {
    /// Whether the worker was killed by a signal that stops a job (SIGTERM, SIGINT, SIGHUP, SIGQUIT): sent
    /// to every process at once by a scheduler, not a crash of its own.
    pub fn stop_signal(&self) -> bool {
        use nix::sys::signal::Signal::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
        [SIGTERM, SIGINT, SIGHUP, SIGQUIT].iter().any(|s| self.exitcode == -(*s as i32))
    }

    /// Builds the failure record, reading the worker's error file if it wrote one.
    pub fn new(local_rank: u32, global_rank: u32, pid: i32, exitcode: i32, error_file: Option<&Path>, now: i64) -> Self {
        let data = error_file.and_then(|p| std::fs::read(p).ok()).and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let timestamp = data.as_ref().and_then(error_timestamp).unwrap_or(now);
        ProcessFailure {
            local_rank,
            global_rank,
            pid,
            exitcode,
            error_file: data.is_some().then(|| error_file.map(Path::to_path_buf)).flatten(),
            error_data: data,
            timestamp,
        }
    }

    /// What the summary's `traceback` field shows.
    pub fn message(&self) -> String {
        match &self.error_data {
            Some(data) => match data.get("message") {
                Some(Value::Object(m)) => m
                    .get("extraInfo")
                    .and_then(|e| e.get("py_callstack"))
                    .or_else(|| m.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("<N/A>")
                    .replace('\n', "\n  "),
                Some(Value::String(s)) => s.clone(),
                _ => "<N/A>".to_string(),
            },
            None if self.exitcode < 0 => {
                format!("Signal {} ({}) received by PID {}", -self.exitcode, signal_name(-self.exitcode), self.pid)
            }
            None => "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html".to_string(),
        }
    }
}

/// `{"message": {"extraInfo": {"timestamp": "123"}}}` or `{"message": "...", "timestamp": 123}`.
fn error_timestamp(data: &Value) -> Option<i64> {
    let ts = match data.get("message") {
        Some(Value::Object(m)) => m.get("extraInfo")?.get("timestamp")?,
        _ => data.get("timestamp")?,
    };
    match ts {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("SIG{sig}"))
}

/// The first observed failure: the smallest timestamp, ties to the first detected (torch's
/// `get_first_failure`).
pub fn root_cause(failures: &[ProcessFailure]) -> Option<&ProcessFailure> {
    failures.iter().reduce(|best, f| if f.timestamp < best.timestamp { f } else { best })
}

fn local_time(ts: i64) -> String {
    use chrono::TimeZone;
    chrono::Local
        .timestamp_opt(ts, 0)
        .single()
        .map(|t| t.format("%Y-%m-%d_%H:%M:%S").to_string())
        .unwrap_or_else(|| ts.to_string())
}

fn format_failure(idx: usize, f: &ProcessFailure, host: &str) -> String {
    let signal = if f.exitcode < 0 { format!(" ({})", signal_name(-f.exitcode)) } else { String::new() };
    let error_file = f.error_file.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "<N/A>".into());
    format!(
        "[{idx}]:\n  time      : {}\n  host      : {host}\n  rank      : {} (local_rank: {})\n  \
         exitcode  : {} (pid: {}) {signal}\n  error_file: {error_file}\n  traceback : {}",
        local_time(f.timestamp),
        f.global_rank,
        f.local_rank,
        f.exitcode,
        f.pid,
        f.message()
    )
}

/// The `ChildFailedError` block torchrun prints when the job fails.
pub fn summary(name: &str, failures: &[ProcessFailure], host: &str) -> String {
    let title = format!("{name} FAILED");
    let root = root_cause(failures);
    let mut width = title.len();
    let mut root_fmt = String::new();
    let mut others = Vec::new();
    for (idx, f) in failures.iter().enumerate() {
        let block = format_failure(idx, f, host);
        width = width.max(block.lines().map(|l| l.chars().count()).max().unwrap_or(0));
        if root.is_some_and(|r| std::ptr::eq(r, f)) {
            root_fmt = block;
        } else {
            others.push(block);
        }
    }
    let width = width.min(60);
    let others = if others.is_empty() { "  <NO_OTHER_FAILURES>".to_string() } else { others.join("\n") };
    let (border, section) = ("=".repeat(width), "-".repeat(width));
    format!(
        "\n{border}\n{title}\n{section}\nFailures:\n{others}\n{section}\nRoot Cause (first observed failure):\n\
         {root_fmt}\n{border}"
    )
}

/// Copies the root cause's error file to the agent's own `TORCHELASTIC_ERROR_FILE`, adding `errorCode`, as
/// torchrun's `@record` on `main` does.
pub fn copy_to_agent_error_file(root: &ProcessFailure, dest: &Path) -> std::io::Result<()> {
    let Some(mut data) = root.error_data.clone() else { return Ok(()) };
    if let Some(Value::Object(m)) = data.get_mut("message") {
        if root.exitcode != 0 {
            m.insert("errorCode".into(), Value::from(root.exitcode));
        }
    }
    std::fs::write(dest, serde_json::to_vec(&data).map_err(std::io::Error::other)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(rank: u32, exitcode: i32, ts: i64) -> ProcessFailure {
        ProcessFailure {
            local_rank: rank,
            global_rank: rank,
            pid: 4240 + rank as i32,
            exitcode,
            error_file: None,
            error_data: None,
            timestamp: ts,
        }
    }

    #[test]
    fn root_cause_is_earliest_then_first_detected() {
        let f = [failure(0, -15, 10), failure(1, 1, 9), failure(2, 1, 9)];
        assert_eq!(root_cause(&f).map(|r| r.global_rank), Some(1));
    }

    #[test]
    fn summary_layout_matches_torchrun() {
        let mut root = failure(1, 1, 0);
        root.error_file = Some("/tmp/e.json".into());
        root.error_data = Some(serde_json::json!({"message": {"message": "ValueError: x",
            "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"", "timestamp": "0"}}}));
        let s = summary("train.py", &[failure(0, -15, 5), root], "node1");
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "");
        let widest = lines[5..lines.len() - 1].iter().map(|l| l.len()).max().unwrap();
        assert_eq!(lines[1], "=".repeat(widest.min(60)));
        assert_eq!(lines[3], "-".repeat(widest.min(60)));
        assert_eq!(lines[2], "train.py FAILED");
        assert_eq!(lines[4], "Failures:");
        assert_eq!(lines[5], "[0]:");
        assert!(s.contains("  exitcode  : -15 (pid: 4240)  (SIGTERM)\n"));
        assert!(s.contains("  traceback : Signal 15 (SIGTERM) received by PID 4240\n"));
        assert!(s.contains("Root Cause (first observed failure):\n[1]:\n"));
        assert!(s.contains("  exitcode  : 1 (pid: 4241) \n"));
        assert!(s.contains("  error_file: /tmp/e.json\n"));
        assert!(s.contains("  traceback : Traceback (most recent call last):\n    File \"t.py\"\n"));
        assert!(s.ends_with(lines[1]));
        let mut long = failure(0, 1, 0);
        long.error_data = Some(serde_json::json!({"message": "x".repeat(100), "timestamp": 0}));
        assert!(summary("t", &[long], "h").lines().nth(1) == Some(&"=".repeat(60)[..]));
    }

    #[test]
    fn lone_failure_has_no_others() {
        let s = summary("x", &[failure(0, 3, 0)], "h");
        assert!(s.contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
        assert!(s.contains("To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"));
    }
}
