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
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::Stream;

/// How much console output one agent stream holds for a console that is behind.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub bytes: usize,
    pub lines: usize,
}

/// Some 40 ms of a worker writing at 100 MB/s, so a console that keeps up on average rides out its writer
/// being descheduled on a busy host; about 4 s of a 1 MB/s console, so the exit flush stays short.
pub const BOUNDS: Bounds = Bounds { bytes: 4 << 20, lines: 64 * 1024 };
/// The writer takes at most this much per write, so the agent's own log lines (which share the stream's lock)
/// never wait behind more than one batch.
const BATCH_BYTES: usize = 64 * 1024;
/// How long the exit waits for a console that is behind: a full queue at 1 MB/s takes about 4 s.
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
    /// The queued lines back to back (no allocation per line), and each one's length.
    data: VecDeque<u8>,
    lens: VecDeque<usize>,
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

    fn write_loop(&self, stream: Stream) {
        let mut batch = Vec::with_capacity(2 * BATCH_BYTES);
        loop {
            {
                let mut q = self.lock();
                while q.lens.is_empty() {
                    q = self.work.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
                batch.clear();
                q.take(&mut batch);
                q.writing = true;
            }
            // A console that is gone (EPIPE, a hung-up terminal's EIO) loses its lines; the log files have
            // them. crate::console notes it once and skips the writes from then on.
            crate::console::write(agent_stream(stream), &batch);
            self.lock().writing = false;
            self.written.notify_all();
        }
    }

    fn drain_until(&self, deadline: Instant) {
        let mut q = self.lock();
        while q.writer && (q.writing || !q.lens.is_empty()) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return };
            q = self.written.wait_timeout(q, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Queue {
    /// Queues one line made of `parts`.
    fn push(&mut self, parts: &[&[u8]]) {
        for part in parts {
            self.data.extend(part.iter());
        }
        self.lens.push_back(parts.iter().map(|p| p.len()).sum());
    }

    /// Moves whole lines, about `BATCH_BYTES` of them (at least one), to `batch`.
    fn take(&mut self, batch: &mut Vec<u8>) {
        let mut n = 0;
        while let Some(len) = self.lens.pop_front() {
            n += len;
            if n >= BATCH_BYTES {
                break;
            }
        }
        let (front, back) = self.data.as_slices();
        let from_front = n.min(front.len());
        batch.extend_from_slice(&front[..from_front]);
        batch.extend_from_slice(&back[..n - from_front]);
        self.data.drain(..n);
    }
}

fn agent_stream(stream: Stream) -> crate::console::Stream {
    match stream {
        Stream::Out => crate::console::Stream::Out,
        Stream::Err => crate::console::Stream::Err,
    }
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

    /// Queues the line made of `parts` or counts it as dropped; never waits for the console, only for the
    /// queue's lock.
    pub fn offer(&mut self, parts: &[&[u8]]) {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut q = self.console.lock();
        // The writer waits only on an empty queue; waking it costs a syscall, so only then.
        let was_empty = q.lens.is_empty();
        match admit((q.data.len(), q.lens.len()), len, self.dropped, BOUNDS) {
            Admit::Drop => {
                self.dropped += 1;
                return;
            }
            Admit::NoticeThenLine => {
                q.push(&[&notice(self.dropped, self.local_rank, self.has_file)]);
                self.dropped = 0;
            }
            Admit::Line => {}
        }
        q.push(parts);
        drop(q);
        if was_empty {
            self.console.work.notify_one();
        }
    }

    /// At the end of the stream: a last notice for lines dropped since the previous one, queued even past
    /// the bounds (one short line per rank and stream), so a gap at the end is never silent.
    pub fn finish(self) {
        if self.dropped > 0 {
            self.console.lock().push(&[&notice(self.dropped, self.local_rank, self.has_file)]);
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
    fn the_writer_takes_whole_lines_in_batches() {
        let mut q = Queue::default();
        let line = vec![b'x'; BATCH_BYTES / 2 + 1];
        for _ in 0..3 {
            q.push(&[b"[h]:", &line, b"\n"]);
        }
        let mut batch = Vec::new();
        q.take(&mut batch);
        assert_eq!((batch.len(), q.lens.len(), q.data.len()), (2 * (line.len() + 5), 1, line.len() + 5));
        assert!(batch.starts_with(b"[h]:x") && batch.ends_with(b"x\n"));
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
