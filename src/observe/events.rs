//! The event log: one JSON object per line for every transition, GPU fault and recovery, each with its
//! timestamp. Events go to stderr with `--event-log-handler console` (torchrun's handler, kept) and, with
//! `--event-log PATH`, are appended to that file by a thread of their own, so a slow disk never holds the
//! agent; `close` waits for what is still queued.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
#[error("cannot open --event-log {path}: {source}; pass a writable file path")]
pub struct EventLogError {
    path: PathBuf,
    source: std::io::Error,
}

/// The file's writer thread.
#[derive(Debug)]
struct Writer {
    lines: mpsc::Sender<String>,
    thread: std::thread::JoinHandle<()>,
}

/// Where agent events go. Clones share the file.
#[derive(Debug, Clone, Default)]
pub struct EventLog {
    console: bool,
    file: Option<Arc<Mutex<Option<Writer>>>>,
}

impl EventLog {
    /// Events to stderr (`console`) and, with `path`, appended to that file (opened now: a path that cannot
    /// be written is bad input, found before anything starts).
    pub fn open(console: bool, path: Option<&Path>) -> Result<EventLog, EventLogError> {
        let Some(path) = path else { return Ok(EventLog { console, file: None }) };
        let file = File::options()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| EventLogError { path: path.to_path_buf(), source })?;
        let (lines, rx) = mpsc::channel::<String>();
        let shown = path.display().to_string();
        let thread = std::thread::spawn(move || write_lines(BufWriter::new(file), rx, &shown));
        Ok(EventLog { console, file: Some(Arc::new(Mutex::new(Some(Writer { lines, thread })))) })
    }

    /// Records one event; `fields` is a JSON object merged into it.
    pub fn emit(&self, name: &str, fields: Value) {
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut event = json!({ "name": name, "timestamp": ts });
        if let (Some(e), Value::Object(f)) = (event.as_object_mut(), fields) {
            e.extend(f);
        }
        tracing::debug!(event = %event, "event");
        if self.console {
            crate::console::line(crate::console::Stream::Err, format_args!("{event}"));
        }
        if let Some(writer) = self.file.as_ref().and_then(|f| f.lock().ok()) {
            if let Some(w) = writer.as_ref() {
                // The thread ends only at close, or when the file failed (said once there).
                let _ = w.lines.send(event.to_string());
            }
        }
    }

    /// Makes the first failed write to the agent's stdout and to its stderr (a hung-up terminal, a closed
    /// pipe) an event, `muster.agent.console_lost`, so the file says why the console stopped where it did;
    /// a lost stdout is also said on stderr. A lost stderr is not logged: the log goes there.
    pub fn record_console_loss(&self, run_id: &str) {
        let (log, run_id) = (self.clone(), run_id.to_string());
        crate::console::on_lost(move |stream, e| {
            if stream == crate::console::Stream::Out {
                tracing::warn!("the agent's stdout is gone ({e}); what the agent writes there is dropped from now on");
            }
            log.emit("muster.agent.console_lost", json!({ "run_id": run_id, "stream": stream.name(), "error": e.to_string() }));
        });
    }

    /// Writes what is queued and closes the file (later events go to the console only).
    pub fn close(&self) {
        let writer = self.file.as_ref().and_then(|f| f.lock().ok().and_then(|mut w| w.take()));
        if let Some(Writer { lines, thread }) = writer {
            drop(lines);
            if thread.join().is_err() {
                tracing::warn!("the event log writer thread panicked; the event log may be incomplete");
            }
        }
    }
}

/// The writer thread: each line flushed as it comes (a reader tails the file), until the channel closes.
fn write_lines(mut out: BufWriter<File>, rx: mpsc::Receiver<String>, path: &str) {
    for line in rx {
        let written = writeln!(out, "{line}").and_then(|()| out.flush());
        if let Err(e) = written {
            tracing::warn!("cannot write the event log {path}: {e}; no more events go there");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_json_lines_with_a_timestamp_written_before_close_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::open(false, Some(&path)).unwrap();
        log.emit("a", json!({ "x": 1 }));
        log.clone().emit("b", json!({}));
        log.close();
        log.emit("after close", json!({}));
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(events.len(), 2, "{text}");
        assert_eq!((events[0]["name"].as_str(), events[0]["x"].as_i64()), (Some("a"), Some(1)));
        assert!(events.iter().all(|e| e["timestamp"].as_str().is_some_and(|t| t.ends_with('Z'))), "{text}");
    }

    #[test]
    fn an_unwritable_path_is_named() {
        let e = EventLog::open(false, Some(Path::new("/nonexistent/dir/ev.jsonl"))).unwrap_err();
        assert!(e.to_string().contains("--event-log /nonexistent/dir/ev.jsonl"), "{e}");
    }
}
