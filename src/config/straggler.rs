//! `--straggler-window`, `--on-straggler`: straggler detection (`crate::straggler`), typed once.

use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;

/// `--straggler-window`'s default.
const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

/// What a straggler does once named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStraggler {
    /// Named once per stretch; training goes on.
    Report,
    /// A rank that stays a straggler through a second window has its node drained.
    Drain,
}

/// Straggler detection; None when `--straggler-window 0` turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StragglerConfig {
    pub window: Duration,
    pub on_straggler: OnStraggler,
}

/// `heartbeat`: the agents' `keep_alive_interval`; a window carries on heartbeats, so it must span two.
pub fn from_cli(cli: &Cli, heartbeat: Duration) -> Result<Option<StragglerConfig>, ConfigError> {
    let on_straggler = match cli.on_straggler.as_str() {
        "report" => OnStraggler::Report,
        "drain" => OnStraggler::Drain,
        other => return Err(bad(format!("invalid value '{other}' for '--on-straggler': use report or drain"))),
    };
    let window = match cli.straggler_window {
        Some(0.0) => return Ok(None),
        None => DEFAULT_WINDOW.max(2 * heartbeat),
        Some(s) if Duration::from_secs_f64(s) < 2 * heartbeat => {
            let least = 2 * heartbeat;
            return Err(bad(format!(
                "--straggler-window {s}: shorter than two heartbeats (keep_alive_interval {heartbeat:?}), which carry \
                 each window; give at least {least:?}, or 0 to turn it off"
            )));
        }
        Some(s) => Duration::from_secs_f64(s),
    };
    Ok(Some(StragglerConfig { window, on_straggler }))
}
