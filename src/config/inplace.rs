//! `--in-place`, `--in-place-timeout`: re-forming in place (`crate::inplace`), typed once.

use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;

/// In-place re-formation; None when `--in-place off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlaceConfig {
    /// How long a kept worker has to re-form (and a worker whose collective failed waits for its new
    /// assignment) before it is stopped and started cold.
    pub timeout: Duration,
}

pub fn from_cli(cli: &Cli) -> Result<Option<InPlaceConfig>, ConfigError> {
    match cli.in_place.as_str() {
        "on" => {}
        "off" => return Ok(None),
        other => return Err(bad(format!("invalid value '{other}' for '--in-place': use on or off"))),
    }
    Ok(Some(InPlaceConfig { timeout: Duration::from_secs_f64(cli.in_place_timeout) }))
}
