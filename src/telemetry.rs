//! Agent logging and events.
//!
//! Logs go to stderr through `tracing`; the level comes from `RUST_LOG` (a full filter), else torch's
//! `LOGLEVEL` (DEBUG, INFO, WARNING, ERROR), else INFO — one level above torchrun's default WARNING so the
//! startup banner and recovery timings are visible. Events (`--event-log-handler console`) are JSON lines on
//! stderr, one per agent transition, with a timestamp and the time spent in the previous state.

use std::io::IsTerminal;

use serde_json::{json, Value};
use tracing_subscriber::EnvFilter;

pub fn init() {
    let level = match std::env::var("LOGLEVEL").unwrap_or_default().to_ascii_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARNING" | "WARN" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => "info",
    };
    init_with(&format!("muster={level}"));
}

/// Logging to stderr with `default` as the filter unless `RUST_LOG` gives one (tool subcommands choose
/// their own default: `muster bench` shows only errors, for one).
pub fn init_with(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

/// Where agent events go.
#[derive(Debug, Clone, Copy)]
pub struct Events {
    pub console: bool,
}

impl Events {
    /// Records one event; `fields` is a JSON object merged into the event.
    pub fn emit(&self, name: &str, fields: Value) {
        let ts = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut event = json!({ "name": name, "timestamp": ts });
        if let (Some(e), Value::Object(f)) = (event.as_object_mut(), fields) {
            e.extend(f);
        }
        tracing::debug!(event = %event, "event");
        if self.console {
            eprintln!("{event}");
        }
    }
}
