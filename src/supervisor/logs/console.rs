//! The console side of tee'd worker output, decoupled from the log files so a slow console (a pipe into a
//! slow collector, a stalled `kubectl logs`) never slows the workers:
//! - one bounded queue per agent stream (stdout, stderr), bounded in bytes and in lines, filled by the pumps
//!   of every rank and drained by one writer thread (a plain thread: its writes may block for as long as the
//!   console likes);
//! - a pump never waits: when the queue is full, the line is dropped and counted for its rank and stream;
//!   once the queue has drained to half, one notice on the same stream the lines would have gone to says how
//!   many (`[muster] dropped N console lines of rank 3; the log file has them`, the local rank, as in the
//!   `[default3]:` prefix and the log path), and the rank's lines flow again;
//! - order within one rank's stream is kept (one FIFO queue; the notice stands where the lines were).
//!
//! At exit the agent gives the console a bounded time to take what is still queued (`flush`).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::Stream;

/// How much console output one agent stream holds for a console that is behind.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub bytes: usize,
    pub lines: usize,
}

/// About a second of a 1 MB/s console: enough to ride out bursts, small enough that the exit flush is quick.
pub const BOUNDS: Bounds = Bounds { bytes: 1 << 20, lines: 16 * 1024 };
/// The writer takes at most this much per write, so the agent's own log lines (which share the stream's lock)
/// never wait behind more than one batch.
const BATCH_BYTES: usize = 64 * 1024;
/// How long the exit waits for a console that is behind: a full queue at 1 MB/s takes about a second.
const EXIT_FLUSH: Duration = Duration::from_secs(5);
/// Room kept for the notice that precedes the first line after a gap.
const NOTICE_ROOM: usize = 128;

/// What a pump does with its next console line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    Line,
    /// After a gap: the notice first, then the line.
    NoticeThenLine,
    Drop,
}

/// `queued` is the queue's (bytes, lines) now, `len` the line's size, `dropped` the lines this rank's stream
/// has dropped since its last notice. Once dropping, a stream waits for the queue to drain to half
/// (hysteresis: one notice per gap, not one per line while the console stays just behind).
fn admit(queued: (usize, usize), len: usize, dropped: u64, bounds: Bounds) -> Admit {
    let (bytes, lines) = queued;
    if dropped == 0 {
        if bytes + len <= bounds.bytes && lines < bounds.lines {
            Admit::Line
        } else {
            Admit::Drop
        }
    } else if bytes + len + NOTICE_ROOM <= bounds.bytes / 2 && lines + 2 <= bounds.lines / 2 {
        Admit::NoticeThenLine
    } else {
        Admit::Drop
    }
}

/// The line that stands for `dropped` lines of `local_rank` on the console.
fn notice(dropped: u64, local_rank: u32, has_file: bool) -> Vec<u8> {
    let whereabouts = if has_file { "the log file has them" } else { "they are not kept (--log-dir /dev/null)" };
    format!("[muster] dropped {dropped} console lines of rank {local_rank}; {whereabouts}\n").into_bytes()
}

#[derive(Debug, Default)]
struct Queue {
    lines: VecDeque<Vec<u8>>,
    bytes: usize,
    /// The writer holds a batch it has not finished writing.
    writing: bool,
    /// False when the writer thread could not be started: then nothing waits for it.
    writer: bool,
}

/// One agent stream's console: the queue and its writer thread.
#[derive(Debug, Default)]
struct Console {
    queue: Mutex<Queue>,
    /// Signalled when lines are queued.
    work: Condvar,
    /// Signalled when the writer has finished a batch.
    written: Condvar,
}

static CONSOLES: [OnceLock<Console>; 2] = [OnceLock::new(), OnceLock::new()];

fn index(stream: Stream) -> usize {
    match stream {
        Stream::Out => 0,
        Stream::Err => 1,
    }
}

/// The agent's console for `stream`, its writer started on first use.
fn console(stream: Stream) -> &'static Console {
    let mut started = false;
    let console = CONSOLES[index(stream)].get_or_init(|| {
        started = true;
        Console::default()
    });
    if started {
        console.lock().writer = true;
        let spawned = std::thread::Builder::new()
            .name(format!("console-{}", index(stream)))
            .spawn(move || console.write_loop(stream));
        if let Err(e) = spawned {
            console.lock().writer = false;
            tracing::error!("cannot start the console writer: {e}; tee'd lines reach only the log files");
        }
    }
    console
}

/// Gives the consoles up to `EXIT_FLUSH` to write what is still queued; what a stalled console has not taken
/// by then is lost to it (the log files have it). Call at exit, from a plain thread; it reports nothing, as
/// a report could only go to a console that is not reading.
pub fn flush() {
    let deadline = Instant::now() + EXIT_FLUSH;
    for console in CONSOLES.iter().filter_map(OnceLock::get) {
        console.drain_until(deadline);
    }
}

impl Console {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // The queue is consistent after every statement, so a panic elsewhere does not spoil it.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(queue: &mut Queue, line: Vec<u8>) {
        queue.bytes += line.len();
        queue.lines.push_back(line);
    }

    fn write_loop(&self, stream: Stream) {
        loop {
            let batch = {
                let mut q = self.lock();
                while q.lines.is_empty() {
                    q = self.work.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
                let mut batch = Vec::with_capacity(BATCH_BYTES);
                while let Some(line) = q.lines.pop_front() {
                    batch.extend_from_slice(&line);
                    q.bytes -= line.len();
                    if batch.len() >= BATCH_BYTES {
                        break;
                    }
                }
                q.writing = true;
                batch
            };
            // A console that is gone (EPIPE) loses its lines; the log files have them.
            let _ = match stream {
                Stream::Out => write_batch(std::io::stdout().lock(), &batch),
                Stream::Err => write_batch(std::io::stderr().lock(), &batch),
            };
            self.lock().writing = false;
            self.written.notify_all();
        }
    }

    fn drain_until(&self, deadline: Instant) {
        let mut q = self.lock();
        while q.writer && (q.writing || !q.lines.is_empty()) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
            q = self.written.wait_timeout(q, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

fn write_batch(mut to: impl Write, batch: &[u8]) -> std::io::Result<()> {
    to.write_all(batch)?;
    to.flush()
}

/// One rank's stream feeding a console: its place in the queue and its count of dropped lines.
#[derive(Debug)]
pub struct Feed {
    console: &'static Console,
    local_rank: u32,
    has_file: bool,
    dropped: u64,
}

impl Feed {
    pub fn new(stream: Stream, local_rank: u32, has_file: bool) -> Feed {
        Feed { console: console(stream), local_rank, has_file, dropped: 0 }
    }

    /// Queues the line `make` builds (at most `len` bytes) or counts it as dropped; never waits for the
    /// console, only for the queue's lock.
    pub fn offer(&mut self, len: usize, make: impl FnOnce() -> Vec<u8>) {
        let mut q = self.console.lock();
        match admit((q.bytes, q.lines.len()), len, self.dropped, BOUNDS) {
            Admit::Drop => {
                self.dropped += 1;
                return;
            }
            Admit::NoticeThenLine => {
                Console::push(&mut q, notice(self.dropped, self.local_rank, self.has_file));
                self.dropped = 0;
            }
            Admit::Line => {}
        }
        Console::push(&mut q, make());
        drop(q);
        self.console.work.notify_one();
    }

    /// At the end of the stream: a last notice for lines dropped since the previous one, queued even past
    /// the bounds (one short line per rank and stream), so a gap at the end is never silent.
    pub fn finish(self) {
        if self.dropped > 0 {
            Console::push(&mut self.console.lock(), notice(self.dropped, self.local_rank, self.has_file));
            self.console.work.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Bounds = Bounds { bytes: 1000, lines: 10 };

    #[test]
    fn admission_table() {
        let cases: &[((usize, usize), usize, u64, Admit)] = &[
            ((0, 0), 10, 0, Admit::Line),
            ((990, 5), 10, 0, Admit::Line),       // exactly full in bytes
            ((991, 5), 10, 0, Admit::Drop),       // one byte over
            ((100, 9), 10, 0, Admit::Line),       // the tenth line
            ((100, 10), 10, 0, Admit::Drop),      // an eleventh line
            ((0, 0), 1001, 0, Admit::Drop),       // longer than the whole queue
            ((500, 2), 10, 3, Admit::Drop),       // dropping: not yet drained to half
            ((0, 4), 10, 3, Admit::Drop),         // half in lines: notice + line would pass it
            ((300, 3), 10, 3, Admit::NoticeThenLine),
            ((0, 0), 10, 1, Admit::NoticeThenLine),
        ];
        for &(queued, len, dropped, want) in cases {
            assert_eq!(admit(queued, len, dropped, B), want, "queued {queued:?} len {len} dropped {dropped}");
        }
    }

    #[test]
    fn notice_names_the_rank_and_where_the_lines_are() {
        assert_eq!(notice(42, 3, true), b"[muster] dropped 42 console lines of rank 3; the log file has them\n");
        assert_eq!(
            notice(1, 0, false),
            b"[muster] dropped 1 console lines of rank 0; they are not kept (--log-dir /dev/null)\n"
        );
    }
}
