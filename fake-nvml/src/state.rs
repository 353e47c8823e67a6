//! Global runtime state: the loaded model, event sets, and the events-file reader.

use crate::config::{Model, EV_DBE, EV_SBE, EV_XID};
use crate::incident::{self, Effect, Kill, Line, Remap};
use crate::procs;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::{Mutex, MutexGuard};

/// The XID of a GPU that fell off the bus.
const XID_FELL_OFF_THE_BUS: u64 = 79;

#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub gpu: usize,
    pub kind: u64,
    pub data: u64,
}

#[derive(Debug, Default)]
pub struct EventSet {
    /// gpu index -> registered event mask
    pub regs: HashMap<usize, u64>,
    pub queue: VecDeque<Event>,
}

#[derive(Debug)]
pub struct State {
    pub refcount: u32,
    pub model: Model,
    pub sets: HashMap<u64, EventSet>,
    pub next_set: u64,
    offset: u64,
    debug: bool,
    /// Which init this state belongs to: timers started under an earlier one do nothing.
    epoch: u64,
}

static EPOCHS: AtomicU64 = AtomicU64::new(0);

/// The one global state; `None` while NVML is not initialised.
pub static STATE: Mutex<Option<State>> = Mutex::new(None);

pub fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    pub fn new(model: Model) -> State {
        let st = State {
            refcount: 1,
            model,
            sets: HashMap::new(),
            next_set: 1,
            offset: 0,
            debug: std::env::var_os("FAKE_NVML_DEBUG").is_some_and(|v| !v.is_empty() && v != "0"),
            epoch: EPOCHS.fetch_add(1, Ordering::Relaxed),
        };
        st.status("init");
        st
    }

    pub fn debug(&self, msg: &str) {
        if self.debug {
            eprintln!("fake-nvml: {msg}");
        }
    }

    /// Appends one line to the status file (if configured); errors are ignored.
    pub fn status(&self, line: &str) {
        self.debug(line);
        if let Some(p) = &self.model.status_file {
            if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(p) {
                let _ = f.write_all(format!("{line}\n").as_bytes());
            }
        }
    }

    /// Reads complete lines appended to the events file since the last call and applies them.
    pub fn poll_events(&mut self) {
        let Some(path) = self.model.events_file.clone() else {
            return;
        };
        let Ok(mut f) = File::open(&path) else { return };
        let Ok(len) = f.metadata().map(|m| m.len()) else {
            return;
        };
        if len < self.offset {
            // Truncated or replaced: start over.
            self.offset = 0;
        }
        if len == self.offset {
            return;
        }
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.take(len - self.offset).read_to_end(&mut buf).is_err() {
            return;
        }
        // Only complete lines; a line still being written is picked up next time.
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        self.offset += end as u64 + 1;
        let text = String::from_utf8_lossy(&buf[..end]).into_owned();
        for line in text.lines() {
            self.apply_line(line);
        }
    }

    fn push_event(&mut self, gpu: usize, kind: u64, data: u64) {
        let mut delivered_to = 0;
        for set in self.sets.values_mut() {
            if set.regs.get(&gpu).is_some_and(|m| m & kind != 0) {
                set.queue.push_back(Event { gpu, kind, data });
                delivered_to += 1;
            }
        }
        self.status(&format!(
            "event {gpu} 0x{kind:x} {data} sets={delivered_to}"
        ));
    }

    pub fn apply_line(&mut self, text: &str) {
        let line = match incident::parse(text, self.model.gpus.len()) {
            Ok(Some(line)) => line,
            Ok(None) => return,
            Err(()) => return self.status(&format!("malformed {}", text.trim())),
        };
        let text = text.trim();
        if self.model.gpus[line.gpu].lost && !matches!(line.effect, Effect::NoProcess(_)) {
            return self.status(&format!("ignored (gpu {} is lost) {text}", line.gpu));
        }
        self.status(&format!("applied {text}"));
        let uuids: Vec<String> = self.model.gpus.iter().map(|g| g.uuid.clone()).collect();
        match line.kill {
            None => self.apply(&line),
            Some(Kill::After(delay)) => {
                self.apply(&line);
                let gpu = line.gpu;
                self.later(delay, move || kill(&uuids, gpu), |_, _| {});
            }
            Some(Kill::Before(delay)) => {
                let gpu = line.gpu;
                // The kill runs at once on the helper thread; the effect follows `delay` later unless the GPU
                // was lost meanwhile.
                self.later(
                    Duration::ZERO,
                    move || {
                        kill(&uuids, gpu);
                        std::thread::sleep(delay);
                    },
                    move |st, ()| {
                        if !st.model.gpus[line.gpu].lost {
                            st.apply(&line);
                        }
                    },
                );
            }
        }
    }

    /// The line's effect now, and its companion events on their own delays.
    fn apply(&mut self, line: &Line) {
        let g = line.gpu;
        match line.effect {
            // XID 79 is the driver's report that the GPU fell off the bus: from then on every call on it
            // answers GPU_IS_LOST, as `lost` does.
            Effect::Xid(XID_FELL_OFF_THE_BUS) => {
                self.push_event(g, EV_XID, XID_FELL_OFF_THE_BUS);
                self.model.gpus[g].lost = true;
            }
            Effect::Xid(code) => self.push_event(g, EV_XID, code),
            Effect::Dbe => {
                let e = &mut self.model.gpus[g].ecc;
                e.volatile_dbe += 1;
                e.aggregate_dbe += 1;
                self.push_event(g, EV_DBE, 0);
            }
            Effect::Sbe => {
                let e = &mut self.model.gpus[g].ecc;
                e.volatile_sbe += 1;
                e.aggregate_sbe += 1;
                self.push_event(g, EV_SBE, 0);
            }
            Effect::Lost => {
                self.push_event(g, EV_XID, 79);
                self.model.gpus[g].lost = true;
                self.model.gpus[g].stall = line.stall;
            }
            Effect::Process { pid, bytes } => {
                let procs = &mut self.model.gpus[g].processes;
                procs.retain(|p| p.0 != pid);
                procs.push((pid, bytes));
            }
            Effect::NoProcess(pid) => self.model.gpus[g].processes.retain(|p| u64::from(p.0) != pid),
            Effect::Recovery(a) => self.model.gpus[g].recovery_action = a,
            Effect::Remap(r) => self.remap(g, r),
            Effect::Retired(pending) => self.model.gpus[g].ecc.retired_pending = pending,
            Effect::Nvlink { link, up } => {
                let down = &mut self.model.gpus[g].links_down;
                down.retain(|l| *l != link);
                if !up {
                    down.push(link);
                }
            }
            Effect::Clocks { reasons, sm } => {
                let gpu = &mut self.model.gpus[g];
                gpu.clock_reasons = reasons;
                gpu.sm_clock = sm.unwrap_or(gpu.sm_clock);
            }
        }
        if let Some(r) = line.remap {
            self.remap(g, r);
        }
        for &(code, delay) in &line.companions {
            self.later(delay, || {}, move |st, ()| st.push_event(g, EV_XID, code));
        }
    }

    fn remap(&mut self, gpu: usize, r: Remap) {
        let e = &mut self.model.gpus[gpu].ecc;
        match r {
            Remap::Pending => {
                e.remap_pending = true;
                e.remapped_unc += 1;
            }
            Remap::Failure => e.remap_failure = true,
            Remap::Clear => {
                e.remap_pending = false;
                e.remap_failure = false;
            }
        }
    }

    /// On a helper thread (so it happens even if nobody calls NVML): sleeps `delay`, runs `work` without the
    /// lock, then `then` on the state, if NVML was not shut down or re-initialised meanwhile.
    fn later<T: 'static>(
        &self,
        delay: Duration,
        work: impl FnOnce() -> T + Send + 'static,
        then: impl FnOnce(&mut State, T) + Send + 'static,
    ) {
        let epoch = self.epoch;
        let spawned = std::thread::Builder::new().name("fake-nvml-timer".into()).spawn(move || {
            std::thread::sleep(delay);
            let out = work();
            let mut g = lock();
            if let Some(st) = g.as_mut().filter(|st| st.epoch == epoch) {
                then(st, out);
            }
        });
        if let Err(e) = spawned {
            self.status(&format!("cannot start a timer thread: {e}"));
        }
    }
}

/// SIGKILLs the GPU's attached processes and records it in the status file.
fn kill(uuids: &[String], gpu: usize) {
    let pids = procs::kill_attached(uuids, gpu);
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    if let Some(st) = lock().as_ref() {
        st.status(&format!("killed {gpu} pids=[{}]", list.join(",")));
    }
}
