//! The sampler: a thread that reads each local rank's main-thread stack and kernel state on a fixed schedule
//! ([`sample_every`]; py-spy as a library, non-blocking: the process is never paused) and its GPU's SM clock
//! and clock-event reasons, and sums them per window. The last two complete windows are what the heartbeat
//! carries (so that group rank 0 finds each window on every node's beat whatever the beats' phase).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::Nvml;

use super::judge::{classify, NodeWindow, RankWindow, Sample};
use crate::hang::capture::{proc_state, Frame, Target};
use crate::hang::wait::ThreadState;
use crate::rendezvous::pace::PaceNote;

/// How often each rank is sampled at most: a stack read costs well under a millisecond of the agent's CPU.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// Sampling times a window holds at least: twice what the judge needs, so that a window keeps enough
/// samples when some are lost (a rank between two attaches, a late wake-up on a busy host).
const TICKS_PER_WINDOW: u32 = 2 * super::judge::MIN_SAMPLES;

/// The sampling period for `window`: every 250 ms, more often in a window too short for
/// [`TICKS_PER_WINDOW`] of those.
pub fn sample_every(window: Duration) -> Duration {
    SAMPLE_EVERY.min(window / TICKS_PER_WINDOW)
}
/// How long after a failed attach (the interpreter still starting) the next try is made.
const ATTACH_RETRY: Duration = Duration::from_secs(2);
/// Reads failing in a row before the reader attaches afresh.
const FAILED_READS: u32 = 4;

/// What the sampler reads: the ranks, the GPU of each (by local rank), and how windows are cut.
pub struct Armed {
    pub targets: Vec<Target>,
    pub gpus: HashMap<u32, u32>,
    pub nvml: Option<&'static Nvml>,
    pub window: Duration,
    pub node: String,
    pub id: String,
    pub group_rank: u32,
}

/// The running sampler; dropping it stops its thread at its next wake-up.
pub struct Sampler {
    stop: Arc<AtomicBool>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Sampler {
    /// Starts sampling `armed`; each complete window goes into `note`, for the heartbeat to carry (within one
    /// heartbeat of the window's end). None when no thread can be started.
    pub fn start(armed: Armed, note: PaceNote) -> Option<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned =
            std::thread::Builder::new().name("muster-pace".into()).spawn(move || run(armed, &note, &flag));
        match spawned {
            Ok(_) => Some(Sampler { stop }),
            Err(e) => {
                tracing::warn!("straggler detection is off for this attempt: cannot start its thread: {e}");
                None
            }
        }
    }
}

/// One rank's sums in the current window.
#[derive(Default)]
struct Sums {
    samples: u32,
    waiting: u32,
    starting: u32,
    frames: HashMap<String, u32>,
    clocks: Vec<u32>,
    slowed: HashMap<String, u32>,
    gpu_samples: u32,
}

/// One rank's reader.
struct Reader {
    target: Target,
    spy: Option<py_spy::PythonSpy>,
    next_try: Instant,
    denied: bool,
    /// Reads failed in a row on the attached spy.
    failed: u32,
}

impl Reader {
    /// The main thread's frames and kernel state now (None: not readable now).
    fn frames(&mut self) -> Option<(Vec<Frame>, ThreadState)> {
        if self.spy.is_none() {
            if self.denied || Instant::now() < self.next_try {
                return None;
            }
            let mut config = py_spy::Config::default();
            config.blocking = py_spy::config::LockingStrategy::NonBlocking;
            match py_spy::PythonSpy::new(self.target.pid, &config) {
                Ok(spy) => self.spy = Some(spy),
                Err(e) => {
                    self.next_try = Instant::now() + ATTACH_RETRY;
                    self.denied = crate::hang::capture::is_denied(&e);
                    return None;
                }
            }
        }
        // Read first, as py-spy does: the state of the thread whose frames are read next.
        let state = ThreadState::from_letter(proc_state(self.target.pid).as_deref());
        let traces = match self.spy.as_mut()?.get_stack_traces() {
            Ok(t) => t,
            Err(_) => {
                // A read without pausing the process can catch its frames mid-change: the next tick reads
                // again. Gone, or failing tick after tick (the interpreter changed under it): attach again later.
                self.failed += 1;
                if self.failed >= FAILED_READS || proc_state(self.target.pid).is_none() {
                    self.spy = None;
                    self.failed = 0;
                    self.next_try = Instant::now() + ATTACH_RETRY;
                }
                return None;
            }
        };
        self.failed = 0;
        let pid = self.target.pid as u64;
        let main = traces.iter().find(|t| t.os_thread_id == Some(pid)).or_else(|| traces.first())?;
        let frames = main.frames.iter().map(|f| Frame { function: f.name.clone(), file: f.filename.clone(), line: f.line, code: None });
        Some((frames.collect(), state))
    }
}

/// The window `now` falls in: unix time over the window's length, the same on every agent.
fn window_of(window: Duration) -> u64 {
    let ms = crate::rendezvous::unix_ms().unwrap_or(0);
    ms / (window.as_millis().max(1) as u64)
}

fn run(armed: Armed, note: &PaceNote, stop: &AtomicBool) {
    let mut readers: Vec<Reader> = armed
        .targets
        .iter()
        // Not at once: a new worker is still starting its interpreter, and attaching costs the CPU its start
        // and the re-formation around it need.
        .map(|&target| Reader { target, spy: None, next_try: Instant::now() + ATTACH_RETRY, denied: false, failed: 0 })
        .collect();
    let mut sums: Vec<Sums> = readers.iter().map(|_| Sums::default()).collect();
    let mut current = window_of(armed.window);
    let mut done: Vec<NodeWindow> = Vec::new();
    let mut said_denied = false;
    let every = sample_every(armed.window);
    let mut tick = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = window_of(armed.window);
        if now != current {
            done.push(summarize(&armed, current, &readers, &mut sums));
            if done.len() > 2 {
                done.remove(0);
            }
            if let Ok(json) = serde_json::to_string(&done) {
                *note.lock().unwrap_or_else(PoisonError::into_inner) = Some(json);
            }
            current = now;
        }
        for (reader, sum) in readers.iter_mut().zip(sums.iter_mut()) {
            sample(&armed, reader, sum);
        }
        if !said_denied && readers.iter().any(|r| r.denied) {
            tracing::warn!(
                "straggler detection cannot read the workers' stacks (ptrace not permitted: grant CAP_SYS_PTRACE or \
                 lower kernel.yama.ptrace_scope); it goes on with the GPUs' clocks only"
            );
            said_denied = true;
        }
        // A fixed schedule, whatever the samples took; a wake-up late by more than a period starts it again.
        tick += every;
        let now = Instant::now();
        if tick < now {
            tick = now;
        }
        std::thread::sleep(tick - now);
    }
}

/// One sample of one rank: its stack and state, its GPU.
fn sample(armed: &Armed, reader: &mut Reader, sum: &mut Sums) {
    if let Some((frames, state)) = reader.frames() {
        match classify(&frames, state) {
            Sample::Starting => sum.starting += 1,
            Sample::Waiting => {
                sum.samples += 1;
                sum.waiting += 1;
            }
            Sample::Working(frame) => {
                sum.samples += 1;
                if let Some(f) = frame {
                    *sum.frames.entry(f).or_default() += 1;
                }
            }
        }
    }
    if let (Some(nvml), Some(gpu)) = (armed.nvml, armed.gpus.get(&reader.target.local_rank)) {
        gpu_sample(nvml, *gpu, sum);
    }
}

fn gpu_sample(nvml: &Nvml, index: u32, sum: &mut Sums) {
    let Ok(device) = nvml.device_by_index(index) else { return };
    sum.gpu_samples += 1;
    if let Ok(mhz) = device.clock_info(Clock::SM) {
        sum.clocks.push(mhz);
    }
    if let Ok(reasons) = device.current_throttle_reasons() {
        let slowing = reasons.intersection(crate::gpu::SLOWING_CLOCKS);
        if !slowing.is_empty() {
            let names: Vec<&str> = slowing.iter_names().map(|(name, _)| name).collect();
            *sum.slowed.entry(names.join("|")).or_default() += 1;
        }
    }
}

/// The window's summary, the sums started again.
fn summarize(armed: &Armed, window: u64, readers: &[Reader], sums: &mut [Sums]) -> NodeWindow {
    let ranks = readers
        .iter()
        .zip(sums.iter_mut())
        .map(|(reader, sum)| {
            let s = std::mem::take(sum);
            let frame = s.frames.into_iter().max_by_key(|(_, n)| *n).map(|(f, _)| f);
            let mut clocks = s.clocks;
            clocks.sort_unstable();
            let slowed = s.slowed.into_iter().max_by_key(|(_, n)| *n).filter(|(_, n)| 2 * n > s.gpu_samples).map(|(r, _)| r);
            RankWindow {
                rank: reader.target.rank,
                local_rank: reader.target.local_rank,
                samples: s.samples,
                waiting: s.waiting,
                starting: s.starting,
                frame,
                gpu: armed.gpus.get(&reader.target.local_rank).copied(),
                sm_mhz: clocks.get(clocks.len() / 2).copied(),
                slowed,
            }
        })
        .collect();
    let denied = readers.iter().all(|r| r.denied);
    NodeWindow { window, node: armed.node.clone(), id: armed.id.clone(), group_rank: armed.group_rank, ranks, denied }
}
