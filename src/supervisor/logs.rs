//! Worker logs: torchrun's directory layout, `--redirects`, `--tee` with line prefixes, console filtering
//! and the duplicate filters, as torchrun 2.15 has them, with three deliberate improvements:
//! - tee'd output travels through a pipe the agent drains to EOF, so the last lines a worker wrote before it
//!   died always reach both its file and the console (torch tails files and could miss them);
//! - the files never wait for the console: a pump writes the file at the worker's speed and hands console
//!   lines to a bounded queue that drops, with a counted notice, what a slow console cannot take
//!   (`console.rs`);
//! - an attempt directory is never wiped: a start that would reuse `attempt_<n>` gets `attempt_<n>.1`, ...
//!
//! A stream that is neither redirected nor tee'd is the agent's own stdout or stderr, inherited as torchrun
//! does: no prefix, no copy, and so it runs at the console's speed, as it would without a launcher. Only
//! tee'd streams have a file to fall back on, so only they drop console lines.
//!
//! Layout: `<log_dir>/<run_id>_XXXXXXXX/attempt_<n>/<local_rank>/{error.json,stdout.log,stderr.log}` and
//! `attempt_<n>/filtered_std{out,err}.log`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::config::LogConfig;
use crate::hang::progress::LineWatch;
use crate::template::safe_substitute;

mod console;

pub use console::flush as flush_console;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot create log directory {path}: {source}; pass a writable --log-dir")]
    CreateDir { path: PathBuf, source: std::io::Error },
    #[error("cannot open log file {path}: {source}")]
    OpenFile { path: PathBuf, source: std::io::Error },
    #[error("cannot create a pipe for tee'd worker output: {0}")]
    Pipe(std::io::Error),
}

fn create_dir_all(path: &Path) -> Result<(), LogError> {
    std::fs::create_dir_all(path).map_err(|source| LogError::CreateDir { path: path.to_path_buf(), source })
}

/// Creates `<parent>/<prefix>XXXXXXXX` with a fresh random suffix, like Python's `mkdtemp(prefix=...)`.
fn make_unique_dir(parent: &Path, prefix: &str) -> Result<PathBuf, LogError> {
    create_dir_all(parent)?;
    loop {
        let suffix: String = uuid::Uuid::new_v4().simple().to_string().chars().take(8).collect();
        let path = parent.join(format!("{prefix}{suffix}"));
        match std::fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(LogError::CreateDir { path, source }),
        }
    }
}

/// The per-agent run directory, created once.
#[derive(Debug)]
pub struct RunLogs {
    /// None when `--log-dir /dev/null` turned files off.
    run_dir: Option<PathBuf>,
    config: LogConfig,
}

impl RunLogs {
    pub fn create(config: &LogConfig, run_id: &str) -> Result<RunLogs, LogError> {
        if config.files_disabled() {
            return Ok(RunLogs { run_dir: None, config: config.clone() });
        }
        let base = match &config.log_dir {
            Some(dir) => dir.clone(),
            None => make_unique_dir(&std::env::temp_dir(), "torchelastic_")?,
        };
        let run_dir = make_unique_dir(&base, &format!("{run_id}_"))?;
        Ok(RunLogs { run_dir: Some(run_dir), config: config.clone() })
    }

    pub fn run_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref()
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// A fresh directory for one start of the worker group; `attempt_<restart_count>` unless that exists.
    pub fn attempt(&self, restart_count: u32, nproc: u32) -> Result<AttemptLogs, LogError> {
        let Some(run_dir) = &self.run_dir else {
            return Ok(AttemptLogs { dir: None, filtered_out: None, filtered_err: None, progress: None });
        };
        let base = format!("attempt_{restart_count}");
        let dir = (0..)
            .map(|i| if i == 0 { run_dir.join(&base) } else { run_dir.join(format!("{base}.{i}")) })
            .find(|p| !p.exists())
            .unwrap_or_else(|| run_dir.join(&base));
        for rank in 0..nproc {
            create_dir_all(&dir.join(rank.to_string()))?;
        }
        let filtered = |name: &str, filters: &[String]| -> Result<Option<SharedFile>, LogError> {
            if filters.is_empty() {
                return Ok(None);
            }
            let path = dir.join(name);
            let f = File::create(&path).map_err(|source| LogError::OpenFile { path, source })?;
            Ok(Some(Arc::new(Mutex::new(f))))
        };
        Ok(AttemptLogs {
            filtered_out: filtered("filtered_stdout.log", &self.config.duplicate_stdout_filters)?,
            filtered_err: filtered("filtered_stderr.log", &self.config.duplicate_stderr_filters)?,
            dir: Some(dir),
            progress: None,
        })
    }
}

type SharedFile = Arc<Mutex<File>>;

/// The directory of one start of the group.
#[derive(Debug)]
pub struct AttemptLogs {
    dir: Option<PathBuf>,
    filtered_out: Option<SharedFile>,
    filtered_err: Option<SharedFile>,
    /// Where this start's progress marks go (hang detection on).
    progress: Option<crate::hang::progress::Hooks>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

impl Stream {
    fn file_name(self) -> &'static str {
        match self {
            Stream::Out => "stdout.log",
            Stream::Err => "stderr.log",
        }
    }
}

/// How one stream of one worker is wired.
pub enum StreamPlan {
    /// Straight to the agent's own stream, no prefix (torchrun's default).
    Inherit,
    /// Discarded: not redirected and filtered out of the console by `--local-ranks-filter`.
    Null,
    /// To its file only.
    File(File),
    /// Through the agent: a pipe whose read end feeds its file and, when shown, the console with a prefix.
    Tee { sink: TeeSink, read: File, write: Option<OwnedFd> },
    /// Read for `--progress-pattern`: a pipe whose bytes go on unchanged to where the stream went without
    /// it (the agent's own stream, its file, or nowhere).
    Watched { to: Option<File>, watch: LineWatch, read: File, write: Option<OwnedFd> },
}

impl StreamPlan {
    /// The descriptor the worker gets as this stream (the agent's own for `Inherit`). A tee pipe's write end
    /// is handed over once; the agent must drop it once the worker has it, or the pump never sees EOF.
    pub fn child_fd(&mut self, stream: Stream) -> std::io::Result<OwnedFd> {
        match self {
            StreamPlan::Inherit => match stream {
                Stream::Out => std::io::stdout().as_fd().try_clone_to_owned(),
                Stream::Err => std::io::stderr().as_fd().try_clone_to_owned(),
            }
            .or_else(|_| dev_null()),
            StreamPlan::Null => dev_null(),
            StreamPlan::File(f) => f.try_clone().map(OwnedFd::from),
            StreamPlan::Tee { write, .. } | StreamPlan::Watched { write, .. } => write.take().map_or_else(dev_null, Ok),
        }
    }

    /// For a tee'd stream, starts the thread that drains the pipe; the returned channel fires at EOF.
    /// Call after the worker is spawned, so the agent holds no write end of the pipe any more.
    pub fn start_pump(self) -> Option<oneshot::Receiver<()>> {
        let (done, rx) = oneshot::channel();
        match self {
            StreamPlan::Tee { sink, read, .. } => std::thread::spawn(move || {
                sink.pump(read);
                let _ = done.send(());
            }),
            StreamPlan::Watched { to, watch, read, .. } => std::thread::spawn(move || {
                pass_through(read, to, &watch);
                let _ = done.send(());
            }),
            _ => return None,
        };
        Some(rx)
    }

    /// This plan with its output read for `watch` on the way: the same bytes reach the same place.
    fn watched(self, stream: Stream, watch: Option<LineWatch>) -> Result<StreamPlan, LogError> {
        let Some(watch) = watch else { return Ok(self) };
        let to = match self {
            StreamPlan::Tee { mut sink, read, write } => {
                sink.watch = Some(watch);
                return Ok(StreamPlan::Tee { sink, read, write });
            }
            StreamPlan::Watched { .. } => return Ok(self),
            StreamPlan::Inherit => {
                let own = match stream {
                    Stream::Out => std::io::stdout().as_fd().try_clone_to_owned(),
                    Stream::Err => std::io::stderr().as_fd().try_clone_to_owned(),
                };
                own.ok().map(File::from)
            }
            StreamPlan::Null => None,
            StreamPlan::File(f) => Some(f),
        };
        let (read, write) = pipe()?;
        Ok(StreamPlan::Watched { to, watch, read: File::from(read), write: Some(write) })
    }
}

/// A pipe for a worker's stream; O_CLOEXEC: only the worker it is for gets the write end.
fn pipe() -> Result<(OwnedFd, OwnedFd), LogError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LogError::Pipe(std::io::Error::from(e)))
}

/// Copies `pipe` to `to` unchanged until EOF, showing each line to `watch`. A console that is gone makes
/// the copy stop, not the reading (the worker must never block on a full pipe).
fn pass_through(pipe: impl Read, mut to: Option<File>, watch: &LineWatch) {
    let mut lines = Lines::default();
    read_to_end(pipe, |chunk| {
        if to.as_mut().is_some_and(|f| f.write_all(chunk).is_err()) {
            to = None;
        }
        lines.feed(chunk, |line| watch.see(line));
    });
    lines.finish(|line| watch.see(line));
}

/// Reads `pipe` until EOF (or an error), handing each chunk read to `each`.
fn read_to_end(mut pipe: impl Read, mut each: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => each(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// `/dev/null` for reading and writing.
pub fn dev_null() -> std::io::Result<OwnedFd> {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").map(OwnedFd::from)
}

/// Where a tee'd stream's bytes go.
pub struct TeeSink {
    file: Option<File>,
    header: String,
    /// None when `--local-ranks-filter` keeps this rank off the console.
    console: Option<console::Feed>,
    filters: Vec<String>,
    filtered: Option<SharedFile>,
    /// `--progress-pattern`, when on.
    watch: Option<LineWatch>,
}

/// Identity of a worker for prefixes and paths.
#[derive(Debug, Clone)]
pub struct WorkerTag<'a> {
    pub role: &'a str,
    pub local_rank: u32,
    pub global_rank: u32,
    pub hostname: &'a str,
}

impl AttemptLogs {
    /// `<attempt>/<local_rank>/error.json`, or None when files are off.
    pub fn error_file(&self, local_rank: u32) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(local_rank.to_string()).join("error.json"))
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// This start's workers report progress to `hooks`.
    pub fn with_progress(self, hooks: crate::hang::progress::Hooks) -> AttemptLogs {
        AttemptLogs { progress: Some(hooks), ..self }
    }

    pub fn progress(&self) -> Option<&crate::hang::progress::Hooks> {
        self.progress.as_ref()
    }

    /// Decides how `stream` of one worker is wired, opening (truncating) its file if it has one; with
    /// `watch`, its lines are read for progress on the way.
    pub fn plan(&self, logs: &LogConfig, tag: &WorkerTag, stream: Stream, watch: Option<LineWatch>) -> Result<StreamPlan, LogError> {
        self.plan_unwatched(logs, tag, stream)?.watched(stream, watch)
    }

    fn plan_unwatched(&self, logs: &LogConfig, tag: &WorkerTag, stream: Stream) -> Result<StreamPlan, LogError> {
        let pick = |s: crate::config::Std| if stream == Stream::Out { s.out } else { s.err };
        let redirected = pick(logs.redirected(tag.local_rank));
        let teed = pick(logs.tee.for_rank(tag.local_rank));
        let on_console = logs.on_console(tag.local_rank);
        let file = match (&self.dir, redirected) {
            (Some(dir), true) => {
                let path = dir.join(tag.local_rank.to_string()).join(stream.file_name());
                Some(File::create(&path).map_err(|source| LogError::OpenFile { path, source })?)
            }
            _ => None,
        };
        Ok(match (redirected, teed, file) {
            (false, _, _) if on_console => StreamPlan::Inherit,
            (false, _, _) => StreamPlan::Null,
            (true, false, Some(f)) => StreamPlan::File(f),
            // Redirected to /dev/null-disabled files and not tee'd: nothing to keep.
            (true, false, None) => StreamPlan::Null,
            (true, true, file) => {
                let (filters, filtered) = match stream {
                    Stream::Out => (&logs.duplicate_stdout_filters, self.filtered_out.clone()),
                    Stream::Err => (&logs.duplicate_stderr_filters, self.filtered_err.clone()),
                };
                let (read, write) = pipe()?;
                let console = on_console.then(|| console::Feed::new(stream, tag.local_rank, file.is_some()));
                StreamPlan::Tee {
                    sink: TeeSink { file, header: header(logs, tag), console, filters: filters.clone(), filtered, watch: None },
                    read: File::from(read),
                    write: Some(write),
                }
            }
        })
    }
}

/// `[<role><local_rank>]:`, or the user's template with `$role_name $rank $local_rank $hostname`.
fn header(logs: &LogConfig, tag: &WorkerTag) -> String {
    match &logs.prefix_template {
        Some(t) => safe_substitute(
            t,
            &[
                ("role_name", tag.role),
                ("rank", &tag.global_rank.to_string()),
                ("local_rank", &tag.local_rank.to_string()),
                ("hostname", tag.hostname),
            ],
        ),
        None => format!("[{}{}]:", tag.role, tag.local_rank),
    }
}

impl TeeSink {
    /// Copies `pipe` to the file as it comes and to the console line by line, until EOF (every writer of
    /// the pipe has exited). Runs on its own thread: the file's writes may block, the console's never do.
    pub fn pump(mut self, pipe: impl Read) {
        let mut lines = Lines::default();
        read_to_end(pipe, |chunk| {
            if let Some(f) = self.file.as_mut() {
                let _ = f.write_all(chunk);
            }
            lines.feed(chunk, |line| self.line(line));
        });
        lines.finish(|line| self.line(line));
        if let Some(console) = self.console.take() {
            console.finish();
        }
        if let Some(f) = self.file.as_mut() {
            let _ = f.flush();
        }
    }

    /// One line, with or without its newline (the last before EOF, or a piece of an over-long line, has
    /// none): to the console and, when it matches a filter, to the filtered file, both with the header.
    fn line(&mut self, line: &[u8]) {
        if let Some(watch) = &self.watch {
            watch.see(line);
        }
        let text = String::from_utf8_lossy(line);
        let newline: &[u8] = if text.ends_with('\n') { b"" } else { b"\n" };
        let parts = [self.header.as_bytes(), text.as_bytes(), newline];
        if let Some(console) = self.console.as_mut() {
            console.offer(&parts);
        }
        if let Some(filtered) = &self.filtered {
            if self.filters.iter().any(|f| text.contains(f.as_str())) {
                if let Ok(mut f) = filtered.lock() {
                    let _ = f.write_all(&parts.concat());
                }
            }
        }
    }
}

/// A console line is cut after this many bytes without a newline, which bounds what a pump holds.
const MAX_LINE: usize = 64 * 1024;

/// Splits a byte stream into lines: at each newline, and every `MAX_LINE` bytes of a line that has none.
#[derive(Debug, Default)]
struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    fn feed(&mut self, mut chunk: &[u8], mut each: impl FnMut(&[u8])) {
        while let Some(pos) = chunk.iter().position(|b| *b == b'\n') {
            let (line, rest) = chunk.split_at(pos + 1);
            if self.partial.is_empty() {
                each(line);
            } else {
                self.partial.extend_from_slice(line);
                each(&self.partial);
                self.partial.clear();
            }
            chunk = rest;
        }
        self.partial.extend_from_slice(chunk);
        while self.partial.len() >= MAX_LINE {
            each(&self.partial[..MAX_LINE]);
            self.partial.drain(..MAX_LINE);
        }
    }

    /// The unterminated rest, if any.
    fn finish(self, mut each: impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            each(&self.partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Lines, MAX_LINE};

    fn split(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut lines = Lines::default();
        let mut got = Vec::new();
        for c in chunks {
            lines.feed(c, |l| got.push(l.to_vec()));
        }
        lines.finish(|l| got.push(l.to_vec()));
        got
    }

    #[test]
    fn lines_split_at_newlines_across_chunks() {
        type Chunks<'a> = &'a [&'a [u8]];
        let cases: &[(Chunks, Chunks)] = &[
            (&[b"a\nb\n"], &[b"a\n", b"b\n"]),
            (&[b"a", b"b\nc"], &[b"ab\n", b"c"]),
            (&[b"", b"\n\n"], &[b"\n", b"\n"]),
            (&[b"x", b"y", b"z"], &[b"xyz"]),
            (&[], &[]),
        ];
        for (chunks, want) in cases {
            assert_eq!(split(chunks), want.iter().map(|l| l.to_vec()).collect::<Vec<_>>(), "{chunks:?}");
        }
    }

    #[test]
    fn an_endless_line_comes_in_bounded_pieces() {
        let long = vec![b'x'; MAX_LINE * 2 + 5];
        let got = split(&[&long[..100], &long[100..], b"\n"]);
        let lens: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(lens, [MAX_LINE, MAX_LINE, 6]);
    }
}
