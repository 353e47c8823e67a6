//! torchrun's file timer, the workers' watchdog (torch's `FileTimerServer`,
//! torch/distributed/elastic/timer/file_based_local_timer.py).
//!
//! With `TORCHELASTIC_ENABLE_FILE_TIMER=1` in the agent's environment, each start of the group gets a FIFO at
//! `TORCHELASTIC_TIMER_FILE` (or one path per agent in the temp dir), exported to the workers under that name.
//! `torch.distributed.elastic.timer.FileTimerClient` writes one JSON line per request:
//! `{"version": 1, "pid": P, "scope_id": S, "expiration_time": <epoch seconds>, "signal": N}`, where a negative
//! expiration time releases the timer `(P, S)`. When a timer expires, `P` is sent the first signal > 0 among
//! its expired timers in expiration order (none: it is left alone), and all of `P`'s timers are dropped.
//!
//! Two deliberate differences from torch: only processes in this group's workers' sessions are signalled (the
//! FIFO is a file anyone on the host may write to), and the agent does not then send the signal to itself —
//! the worker's death is an ordinary worker failure, so the group stops and restarts like any other.
//!
//! The FIFO is read through tokio's pipe (non-blocking, in the reactor), opened read-write so it never reads
//! end-of-file between clients.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

pub const ENABLE_VAR: &str = "TORCHELASTIC_ENABLE_FILE_TIMER";
pub const FILE_VAR: &str = "TORCHELASTIC_TIMER_FILE";
/// torch's clients write at most PIPE_BUF per request; anything much longer is not a request.
const MAX_LINE: usize = 64 * 1024;
/// Longest sleep while timers are pending, so a wall-clock step delays an expiry by at most this.
const MAX_SLEEP: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
#[error("cannot create the file timer FIFO {path} ({FILE_VAR}): {source}")]
pub struct TimerError {
    path: PathBuf,
    source: std::io::Error,
}

/// The FIFO path when the agent's environment enables the file timer, as torch's `_setup_local_watchdog`
/// decides it; `fresh` gives the path when `TORCHELASTIC_TIMER_FILE` is unset.
pub fn timer_file(var: &dyn Fn(&str) -> Option<String>, fresh: impl FnOnce() -> PathBuf) -> Option<PathBuf> {
    if var(ENABLE_VAR).as_deref() != Some("1") {
        return None;
    }
    Some(var(FILE_VAR).map(PathBuf::from).unwrap_or_else(fresh))
}

/// `<tmp>/watchdog_timer_<uuid4>`, one per agent: the path stays the same from one start to the next, so a
/// warm spare started with it fits the next worker.
pub fn agent_timer_file() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| std::env::temp_dir().join(format!("watchdog_timer_{}", uuid::Uuid::new_v4()))).clone()
}

/// One request from a `FileTimerClient` (torch's `FileTimerRequest`; `version` is not checked, as in torch).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct TimerRequest {
    pub pid: i32,
    pub scope_id: String,
    pub expiration_time: f64,
    pub signal: i32,
}

/// What to do about one pid whose timers expired.
#[derive(Debug, Clone, PartialEq)]
pub struct Reap {
    pub pid: i32,
    /// The first signal > 0 in expiration order; None: torch leaves the process alone.
    pub signal: Option<i32>,
    pub scopes: Vec<String>,
}

/// The pending timers, keyed by `(pid, scope_id)`.
#[derive(Debug, Default)]
pub struct Timers {
    pending: BTreeMap<(i32, String), TimerRequest>,
}

impl Timers {
    pub fn register(&mut self, request: TimerRequest) {
        let key = (request.pid, request.scope_id.clone());
        if request.expiration_time < 0.0 {
            self.pending.remove(&key);
        } else {
            self.pending.insert(key, request);
        }
    }

    /// The earliest pending expiration time.
    pub fn next_expiry(&self) -> Option<f64> {
        self.pending.values().map(|r| r.expiration_time).min_by(f64::total_cmp)
    }

    /// Takes every pid with a timer expired at `now` out of the table (all its timers, expired or not, as
    /// torch's `clear_timers`) and says how to reap it.
    pub fn take_expired(&mut self, now: f64) -> Vec<Reap> {
        let mut expired: BTreeMap<i32, Vec<&TimerRequest>> = BTreeMap::new();
        for r in self.pending.values().filter(|r| r.expiration_time <= now) {
            expired.entry(r.pid).or_default().push(r);
        }
        let reaps: Vec<Reap> = expired
            .into_values()
            .map(|mut timers| {
                timers.sort_by(|a, b| a.expiration_time.total_cmp(&b.expiration_time));
                Reap {
                    pid: timers[0].pid,
                    signal: timers.iter().map(|t| t.signal).find(|s| *s > 0),
                    scopes: timers.iter().map(|t| t.scope_id.clone()).collect(),
                }
            })
            .collect();
        let pids: HashSet<i32> = reaps.iter().map(|r| r.pid).collect();
        self.pending.retain(|(pid, _), _| !pids.contains(pid));
        reaps
    }
}

/// Splits the FIFO's bytes into lines; a line over `MAX_LINE` is dropped up to its newline.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
    discarding: bool,
}

impl Lines {
    fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        for chunk in bytes.split_inclusive(|b| *b == b'\n') {
            let ends = chunk.ends_with(b"\n");
            if !self.discarding {
                self.partial.extend_from_slice(chunk);
                if self.partial.len() > MAX_LINE {
                    tracing::warn!("file timer: dropped a request longer than {MAX_LINE} bytes");
                    self.partial.clear();
                    self.discarding = true;
                } else if ends {
                    lines.push(std::mem::take(&mut self.partial));
                }
            }
            if ends {
                self.discarding = false;
            }
        }
        lines
    }
}

/// How long to sleep for an expiry at `at` (epoch seconds, any finite value a client sent), at most
/// `MAX_SLEEP`: clamped in seconds first, as `Duration::from_secs_f64` panics on a far-future time.
fn sleep_until(at: f64, now: f64) -> Duration {
    Duration::from_secs_f64((at - now).clamp(0.0, MAX_SLEEP.as_secs_f64()))
}

fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default()
}

/// The FIFO of one start, open and buffering requests; `serve` starts acting on them.
pub struct Fifo {
    path: PathBuf,
    receiver: pipe::Receiver,
}

impl Fifo {
    /// Replaces whatever is at `path` with a new FIFO (as torch does) and opens it. Must run in the runtime.
    pub fn create(path: &Path) -> Result<Fifo, TimerError> {
        let error = |source| TimerError { path: path.to_path_buf(), source };
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(error(e)),
            _ => {}
        }
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| error(std::io::Error::from(e)))?;
        let receiver = pipe::OpenOptions::new().read_write(true).open_receiver(path).map_err(error)?;
        tracing::info!("file timer: serving {}", path.display());
        Ok(Fifo { path: path.to_path_buf(), receiver })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Acts on the requests of processes in `sessions` (the workers' session ids) until dropped; with
    /// `marks`, a worker's request is also a sign of its progress.
    pub fn serve(self, sessions: HashSet<i32>, marks: Option<Marks>) -> FileTimer {
        let task = tokio::spawn(serve(self.receiver, sessions, marks));
        FileTimer { path: Some(self.path), task: task.abort_handle() }
    }
}

/// A running file timer. Dropping it stops it; `close` also removes the FIFO (a file system call: run it off
/// the async threads).
pub struct FileTimer {
    path: Option<PathBuf>,
    task: tokio::task::AbortHandle,
}

impl FileTimer {
    pub fn close(mut self) {
        self.task.abort();
        if let Some(path) = self.path.take() {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::debug!("cannot remove the file timer FIFO {}: {e}", path.display());
            }
        }
    }
}

impl Drop for FileTimer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each worker's progress marker by its pid (hang detection on).
pub struct Marks {
    pub ranks: std::collections::HashMap<i32, crate::hang::progress::Marker>,
}

async fn serve(mut receiver: pipe::Receiver, sessions: HashSet<i32>, marks: Option<Marks>) {
    let mut timers = Timers::default();
    let mut lines = Lines::default();
    let mut buf = vec![0u8; 8192];
    loop {
        let sleep = timers.next_expiry().map(|t| sleep_until(t, epoch_now()));
        tokio::select! {
            read = receiver.read(&mut buf) => match read {
                // Never at end-of-file: this end holds the FIFO open for writing too.
                Ok(0) => {
                    tracing::error!("file timer: the FIFO reached end-of-file; the workers' timers are off");
                    return;
                }
                Ok(n) => {
                    for line in lines.push(&buf[..n]) {
                        match serde_json::from_slice::<TimerRequest>(&line) {
                            Ok(request) => {
                                if let Some(m) = marks.as_ref().and_then(|m| m.ranks.get(&request.pid)) {
                                    m.mark();
                                }
                                timers.register(request)
                            }
                            Err(e) => tracing::warn!(
                                "file timer: ignored a request that is not a timer request ({e}): {}",
                                String::from_utf8_lossy(&line).trim_end()
                            ),
                        }
                    }
                }
                Err(e) => {
                    tracing::error!("file timer: cannot read the FIFO ({e}); the workers' timers are off");
                    return;
                }
            },
            () = tokio::time::sleep(sleep.unwrap_or_default()), if sleep.is_some() => {}
        }
        for reap in timers.take_expired(epoch_now()) {
            act(&reap, &sessions);
        }
    }
}

/// Signals one process whose timers expired, if it belongs to the group.
fn act(reap: &Reap, sessions: &HashSet<i32>) {
    let scopes = reap.scopes.join(", ");
    let Some(signal) = reap.signal else {
        tracing::info!("file timer: timer(s) of pid {} expired ({scopes}) with no signal; not reaping it", reap.pid);
        return;
    };
    let pid = Pid::from_raw(reap.pid);
    match nix::unistd::getsid(Some(pid)) {
        Ok(sid) if sessions.contains(&sid.as_raw()) => {}
        Ok(_) => {
            tracing::warn!("file timer: pid {} is not one of this group's processes; not signalling it", reap.pid);
            return;
        }
        Err(_) => {
            tracing::debug!(pid = reap.pid, "file timer: the process of an expired timer is gone");
            return;
        }
    }
    let Ok(sig) = Signal::try_from(signal) else {
        tracing::warn!("file timer: timer(s) of pid {} expired ({scopes}) with invalid signal {signal}", reap.pid);
        return;
    };
    tracing::warn!("file timer: timer(s) of pid {} expired ({scopes}); sending {}", reap.pid, sig.as_str());
    if let Err(e) = super::children::signal(reap.pid, sig) {
        tracing::warn!("file timer: cannot signal pid {}: {e}", reap.pid);
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn req(pid: i32, scope: &str, at: f64, signal: i32) -> TimerRequest {
        TimerRequest { pid, scope_id: scope.into(), expiration_time: at, signal }
    }

    #[test]
    fn enabled_only_by_1_with_the_given_or_a_fresh_path() {
        let fresh = || PathBuf::from("/tmp/fresh");
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(timer_file(&env(&[]), fresh), None);
        assert_eq!(timer_file(&env(&[(ENABLE_VAR, "0"), (FILE_VAR, "/x")]), fresh), None);
        assert_eq!(timer_file(&env(&[(ENABLE_VAR, "true")]), fresh), None);
        assert_eq!(timer_file(&env(&[(ENABLE_VAR, "1")]), fresh), Some(PathBuf::from("/tmp/fresh")));
        assert_eq!(timer_file(&env(&[(ENABLE_VAR, "1"), (FILE_VAR, "/x")]), fresh), Some(PathBuf::from("/x")));
        assert_eq!(agent_timer_file(), agent_timer_file(), "one path per agent");
    }

    #[test]
    fn torch_client_requests_parse() {
        let line = br#"{"version": 1, "pid": 42, "scope_id": "train.py#7", "expiration_time": 1700000000.5, "signal": 9}"#;
        assert_eq!(serde_json::from_slice::<TimerRequest>(line).unwrap(), req(42, "train.py#7", 1700000000.5, 9));
        let release = br#"{"version": 1, "pid": 42, "scope_id": "s", "expiration_time": -1, "signal": 0}"#;
        assert_eq!(serde_json::from_slice::<TimerRequest>(release).unwrap(), req(42, "s", -1.0, 0));
        assert!(serde_json::from_slice::<TimerRequest>(br#"{"pid": 42}"#).is_err());
    }

    #[test]
    fn expiry_table() {
        // (requests, now, expected reaps, timers left)
        let cases: Vec<(Vec<TimerRequest>, f64, Vec<Reap>, usize)> = vec![
            (vec![req(1, "a", 10.0, 9)], 9.9, vec![], 1),
            (vec![req(1, "a", 10.0, 9)], 10.0, vec![Reap { pid: 1, signal: Some(9), scopes: vec!["a".into()] }], 0),
            // A release removes the timer.
            (vec![req(1, "a", 10.0, 9), req(1, "a", -1.0, 0)], 20.0, vec![], 0),
            // Re-acquiring a scope replaces its timer.
            (vec![req(1, "a", 10.0, 9), req(1, "a", 30.0, 9)], 20.0, vec![], 1),
            // The first signal > 0 in expiration order; the pid's unexpired timers go too.
            (
                vec![req(1, "late", 8.0, 15), req(1, "early", 5.0, 0), req(1, "later", 50.0, 9)],
                20.0,
                vec![Reap { pid: 1, signal: Some(15), scopes: vec!["early".into(), "late".into()] }],
                0,
            ),
            (vec![req(1, "a", 5.0, 0)], 20.0, vec![Reap { pid: 1, signal: None, scopes: vec!["a".into()] }], 0),
            // Other pids are untouched.
            (
                vec![req(1, "a", 5.0, 9), req(2, "a", 50.0, 9)],
                20.0,
                vec![Reap { pid: 1, signal: Some(9), scopes: vec!["a".into()] }],
                1,
            ),
        ];
        for (requests, now, reaps, left) in cases {
            let mut timers = Timers::default();
            for r in requests.clone() {
                timers.register(r);
            }
            assert_eq!(timers.take_expired(now), reaps, "{requests:?} at {now}");
            assert_eq!(timers.pending.len(), left, "{requests:?} at {now}");
        }
    }

    #[test]
    fn next_expiry_is_the_earliest() {
        let mut timers = Timers::default();
        assert_eq!(timers.next_expiry(), None);
        timers.register(req(1, "a", 30.0, 9));
        timers.register(req(2, "a", 10.0, 9));
        assert_eq!(timers.next_expiry(), Some(10.0));
    }

    #[test]
    fn lines_across_reads_and_oversized_lines() {
        let mut lines = Lines::default();
        assert!(lines.push(b"{\"a\"").is_empty());
        assert_eq!(lines.push(b":1}\n{\"b\":2}\n{"), vec![b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]);
        let huge = vec![b'x'; MAX_LINE + 1];
        assert!(lines.push(&huge).is_empty());
        assert!(lines.push(b"still the same line").is_empty());
        assert_eq!(lines.push(b"end\nnext\n"), vec![b"next\n".to_vec()]);
    }

    #[tokio::test]
    async fn an_expired_timer_kills_only_a_process_of_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("timer");
        let mut member = std::process::Command::new("sleep");
        member.arg("1000");
        // SAFETY: setsid is async-signal-safe.
        unsafe { member.pre_exec(|| nix::unistd::setsid().map(drop).map_err(std::io::Error::from)) };
        let mut member = member.spawn().unwrap();
        let mut outsider = std::process::Command::new("sleep").arg("1000").spawn().unwrap();
        let member_sid = nix::unistd::getsid(Some(Pid::from_raw(member.id() as i32))).unwrap().as_raw();
        let fifo = Fifo::create(&path).unwrap();
        let timer = fifo.serve(HashSet::from([member_sid]), None);
        let now = epoch_now();
        let mut client = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for pid in [outsider.id(), member.id()] {
            use std::io::Write;
            writeln!(client, r#"{{"version":1,"pid":{pid},"scope_id":"s","expiration_time":{now},"signal":9}}"#).unwrap();
        }
        let status = tokio::task::spawn_blocking(move || member.wait()).await.unwrap().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the group's process was killed with the timer's signal");
        assert!(outsider.try_wait().unwrap().is_none(), "a process outside the group is never signalled");
        outsider.kill().unwrap();
        outsider.wait().unwrap();
        timer.close();
        assert!(!path.exists(), "close removes the FIFO");
    }
}
