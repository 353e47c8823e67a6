//! `--straggler-window`, `--on-straggler`: straggler detection (`crate::straggler`), typed once.

use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;

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

pub fn from_cli(cli: &Cli) -> Result<Option<StragglerConfig>, ConfigError> {
    let on_straggler = match cli.on_straggler.as_str() {
        "report" => OnStraggler::Report,
        "drain" => OnStraggler::Drain,
        other => return Err(bad(format!("invalid value '{other}' for '--on-straggler': use report or drain"))),
    };
    if cli.straggler_window == 0.0 {
        return Ok(None);
    }
    Ok(Some(StragglerConfig { window: Duration::from_secs_f64(cli.straggler_window), on_straggler }))
}
