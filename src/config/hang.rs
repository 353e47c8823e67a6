//! `--hang-timeout`, `--progress-pattern`, `--on-hang`, `--stacks-on-failure`, typed once.

use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;

/// What a hang does after the capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHang {
    /// Stop and restart the group, spending a restart (cause "hang").
    Restart,
    /// Keep the workers running.
    Report,
}

/// Hang detection, on when `--hang-timeout` is given.
#[derive(Debug, Clone)]
pub struct HangConfig {
    pub timeout: Duration,
    /// A worker output line matching it is progress.
    pub pattern: Option<regex::bytes::Regex>,
    pub on_hang: OnHang,
}

/// The hang settings (None: off), or the flag given without `--hang-timeout` named.
pub fn from_cli(cli: &Cli) -> Result<Option<HangConfig>, ConfigError> {
    let Some(seconds) = cli.hang_timeout else {
        for (given, flag) in [(cli.progress_pattern.is_some(), "--progress-pattern"), (cli.on_hang.is_some(), "--on-hang")] {
            if given {
                return Err(bad(format!("{flag} needs --hang-timeout SECONDS (hang detection is off without it)")));
            }
        }
        return Ok(None);
    };
    if seconds <= 0.0 {
        return Err(bad(format!("invalid value '{seconds}' for '--hang-timeout': must be a number of seconds > 0")));
    }
    let pattern = match cli.progress_pattern.as_deref() {
        None => None,
        Some(p) => Some(regex::bytes::Regex::new(p).map_err(|e| {
            let why = e.to_string().lines().last().unwrap_or_default().trim().to_string();
            bad(format!("invalid value '{p}' for '--progress-pattern': not a regular expression ({why})"))
        })?),
    };
    let on_hang = match cli.on_hang.as_deref() {
        None | Some("restart") => OnHang::Restart,
        _ => OnHang::Report,
    };
    Ok(Some(HangConfig { timeout: Duration::from_secs_f64(seconds), pattern, on_hang }))
}
