//! Agent logging.
//!
//! Logs go to stderr through `tracing`; the level comes from `RUST_LOG` (a full filter), else torch's
//! `LOGLEVEL` (DEBUG, INFO, WARNING, ERROR), else INFO — one level above torchrun's default WARNING so the
//! startup banner and recovery timings are visible. `--log-format json` makes each line a JSON object whose
//! `span` carries the run id, round, group rank and restart count, the identifiers the event log and the
//! metrics' labels use (the events themselves are `observe::events`). Lines are written through
//! `console::ErrWriter`: tracing-subscriber's own writer would `eprintln!` a failed write, and panic on a
//! stderr that is gone.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The flag's value (clap has checked it is `text` or `json`).
    pub fn from_flag(value: &str) -> LogFormat {
        if value == "json" {
            LogFormat::Json
        } else {
            LogFormat::Text
        }
    }
}

static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Agent-level logging as text (the tools that log like the agent).
pub fn init() {
    init_as(LogFormat::Text);
}

/// Agent-level logging in `format`.
pub fn init_as(format: LogFormat) {
    let level = match std::env::var("LOGLEVEL").unwrap_or_default().to_ascii_uppercase().as_str() {
        "DEBUG" => "debug",
        "WARNING" | "WARN" => "warn",
        "ERROR" | "CRITICAL" => "error",
        _ => "info",
    };
    init_format(&format!("muster={level}"), format);
}

/// Logging to stderr with `default` as the filter unless `RUST_LOG` gives one (tool subcommands choose
/// their own default: `muster bench` shows only errors, for one).
pub fn init_with(default: &str) {
    init_format(default, LogFormat::Text);
}

fn init_format(default: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(|| crate::console::ErrWriter).with_target(false);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
    let _ = FORMAT.set(format);
}

/// The span the agent runs in: its fields are the identifiers of every JSON log line, recorded as they
/// change. With text logs there is none (a text line stays as it was, without a span prefix).
pub fn agent_span(run_id: &str) -> tracing::Span {
    if FORMAT.get() == Some(&LogFormat::Json) {
        let empty = tracing::field::Empty;
        tracing::info_span!("agent", run_id, round = empty, group_rank = empty, restart = empty)
    } else {
        tracing::Span::none()
    }
}
