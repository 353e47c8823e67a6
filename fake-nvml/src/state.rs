//! Global runtime state: the loaded model, event sets, and the events-file reader.

use crate::config::{Model, EV_DBE, EV_SBE, EV_XID};
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::{Mutex, MutexGuard};

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
}

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

    pub fn apply_line(&mut self, line: &str) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return;
        }
        let t: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| t.get(i).and_then(|s| s.parse::<u64>().ok());
        let gpu = num(1)
            .map(|g| g as usize)
            .filter(|g| *g < self.model.gpus.len());
        let ok = match (t[0], gpu) {
            (_, None) => false,
            (cmd, Some(g)) if self.model.gpus[g].lost && cmd != "noprocess" => {
                self.status(&format!("ignored (gpu {g} is lost) {line}"));
                return;
            }
            ("xid", Some(g)) => match num(2) {
                Some(code) => {
                    self.push_event(g, EV_XID, code);
                    true
                }
                None => false,
            },
            ("dbe", Some(g)) => {
                let e = &mut self.model.gpus[g].ecc;
                e.volatile_dbe += 1;
                e.aggregate_dbe += 1;
                self.push_event(g, EV_DBE, 0);
                true
            }
            ("sbe", Some(g)) => {
                let e = &mut self.model.gpus[g].ecc;
                e.volatile_sbe += 1;
                e.aggregate_sbe += 1;
                self.push_event(g, EV_SBE, 0);
                true
            }
            ("lost", Some(g)) => {
                self.push_event(g, EV_XID, 79);
                self.model.gpus[g].lost = true;
                true
            }
            ("process", Some(g)) => match (num(2), num(3)) {
                (Some(pid), Some(bytes)) if pid <= u32::MAX as u64 => {
                    let procs = &mut self.model.gpus[g].processes;
                    procs.retain(|p| p.0 != pid as u32);
                    procs.push((pid as u32, bytes));
                    true
                }
                _ => false,
            },
            ("noprocess", Some(g)) => match num(2) {
                Some(pid) => {
                    self.model.gpus[g].processes.retain(|p| p.0 as u64 != pid);
                    true
                }
                None => false,
            },
            ("recovery", Some(g)) => match num(2) {
                Some(a) if a <= u32::MAX as u64 => {
                    self.model.gpus[g].recovery_action = a as u32;
                    true
                }
                _ => false,
            },
            ("remap", Some(g)) => {
                let e = &mut self.model.gpus[g].ecc;
                match t.get(2).copied() {
                    Some("pending") => {
                        e.remap_pending = true;
                        e.remapped_unc += 1;
                        true
                    }
                    Some("failure") => {
                        e.remap_failure = true;
                        true
                    }
                    Some("clear") => {
                        e.remap_pending = false;
                        e.remap_failure = false;
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        };
        if ok {
            self.status(&format!("applied {line}"));
        } else {
            self.status(&format!("malformed {line}"));
        }
    }
}
