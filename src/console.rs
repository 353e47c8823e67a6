//! muster's own writes to stdout and stderr, which never fail the process.
//!
//! A console can go away under a running agent: the terminal of `ssh -tt` hangs up (writes fail with EIO),
//! the reader of a pipe exits (`| head`, an `ssh` without `-tt` whose connection dropped: EPIPE, as Rust
//! ignores SIGPIPE). `println!` and `eprintln!` panic on such an error, and a panic would skip what the agent
//! still has to do: stop the workers, write its files, exit with the documented code. So every line muster
//! writes (the agent's summary and errors, the event log's console handler, tee'd worker output, the tracing
//! subscriber's lines, the tools' output) goes through [`write`] or the macros here:
//! - an error is swallowed; the first one on each stream goes to the note set with [`on_lost`] (the agent
//!   logs it and records an event; the tools set none: like `ls | head`, they say nothing);
//! - a stream that is gone for good (EPIPE, EIO, ENXIO) is not written again, so nothing waits or retries.
//!
//! A write may still block on a console that is there but does not read (a stalled terminal); tee'd worker
//! output, the bulk, has a writer thread of its own for that (`supervisor::logs::console`).

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

/// One of muster's own standard streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Out => "stdout",
            Stream::Err => "stderr",
        }
    }

    fn index(self) -> usize {
        match self {
            Stream::Out => 0,
            Stream::Err => 1,
        }
    }
}

/// What is known about one stream's failures.
struct Health {
    /// A write failed in a way that never heals: later writes are skipped.
    gone: AtomicBool,
    /// The first failure, kept until there is a note to give it to (the agent's first log lines are
    /// written before its event log is open).
    first: Mutex<Option<io::Error>>,
    /// The note has been given its one call for this stream.
    noted: AtomicBool,
}

impl Health {
    const fn new() -> Health {
        Health { gone: AtomicBool::new(false), first: Mutex::new(None), noted: AtomicBool::new(false) }
    }
}

static HEALTH: [Health; 2] = [Health::new(), Health::new()];

type Note = Box<dyn Fn(Stream, &io::Error) + Send + Sync>;

static NOTE: OnceLock<Note> = OnceLock::new();

/// Sets what is told, once per stream, about the first write to it that failed, a failure before this call
/// included. It may write to the other stream; a write to the failed one is skipped (or fails silently), so
/// it cannot recurse. The first call wins (one process has one console).
pub fn on_lost(note: impl Fn(Stream, &io::Error) + Send + Sync + 'static) {
    let _ = NOTE.set(Box::new(note));
    for stream in [Stream::Out, Stream::Err] {
        note_first(stream);
    }
}

/// Writes `bytes` to `stream` under its lock, so lines written from several threads never interleave, and
/// flushes stdout; an error is swallowed (see the module's text).
pub fn write(stream: Stream, bytes: &[u8]) {
    let health = &HEALTH[stream.index()];
    if health.gone.load(Ordering::Relaxed) {
        return;
    }
    let written = match stream {
        Stream::Out => {
            let mut out = io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush())
        }
        Stream::Err => io::stderr().lock().write_all(bytes),
    };
    if let Err(e) = written {
        failed(stream, e);
    }
}

fn failed(stream: Stream, e: io::Error) {
    let health = &HEALTH[stream.index()];
    // Marked before the note runs, so a note that writes to this stream again does not write.
    if gone_for_good(&e) {
        health.gone.store(true, Ordering::Relaxed);
    }
    if !health.noted.load(Ordering::Relaxed) {
        health.first.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(e);
    }
    note_first(stream);
}

/// Gives the first failure of `stream` to the note, if there are both and it has not been given yet. Kept
/// first, taken second, in both `failed` and `on_lost`: whichever runs last finds both.
fn note_first(stream: Stream) {
    let Some(note) = NOTE.get() else { return };
    let health = &HEALTH[stream.index()];
    // Taken out of the lock before the note runs: the note may write, and fail, again.
    let first = health.first.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(e) = first {
        if !health.noted.swap(true, Ordering::Relaxed) {
            note(stream, &e);
        }
    }
}

/// `text` and a newline, in one write.
pub fn line(stream: Stream, text: std::fmt::Arguments) {
    let mut buf = text.to_string();
    buf.push('\n');
    write(stream, buf.as_bytes());
}

/// `text` as it is (it brings its own newlines: a table, a script).
pub fn text(stream: Stream, text: std::fmt::Arguments) {
    write(stream, text.to_string().as_bytes());
}

/// A closed pipe, a hung-up terminal, a terminal whose device went away: no later write can succeed.
fn gone_for_good(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::BrokenPipe || matches!(e.raw_os_error(), Some(libc::EIO | libc::ENXIO))
}

/// stderr as an `io::Write` that never fails, for the tracing subscriber: tracing-subscriber reports a
/// failed write with `eprintln!`, which would panic on the same dead stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct ErrWriter;

impl Write for ErrWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write(Stream::Err, buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A line on stdout that never panics: `println!` for muster's own output.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::console::line($crate::console::Stream::Out, ::std::format_args!($($arg)*)) };
}

/// Text on stdout that never panics: `print!`, for output that brings its own newlines.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::console::text($crate::console::Stream::Out, ::std::format_args!($($arg)*)) };
}

/// A line on stderr that never panics: `eprintln!` for muster's messages (each is in docs/errors.md).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::console::line($crate::console::Stream::Err, ::std::format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_and_a_hung_up_terminal_are_gone_for_good_other_errors_are_not() {
        assert!(gone_for_good(&io::Error::from(io::ErrorKind::BrokenPipe)));
        assert!(gone_for_good(&io::Error::from_raw_os_error(libc::EPIPE)));
        assert!(gone_for_good(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!gone_for_good(&io::Error::from_raw_os_error(libc::EAGAIN)));
        assert!(!gone_for_good(&io::Error::from_raw_os_error(libc::ENOSPC)));
    }
}
