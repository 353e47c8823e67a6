//! The values of single flags: `--nnodes`, `--nproc-per-node`, `--signals-to-handle`, the console filters.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;

use super::{bad, ConfigError, Host};

/// Signals muster can trap and forward.
const HANDLEABLE_SIGNALS: &[Signal] = &[
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

pub fn parse_nnodes(s: &str) -> Result<(u32, u32), ConfigError> {
    let invalid = || bad(format!("invalid value '{s}' for '--nnodes': use N or MIN:MAX with 0 < MIN <= MAX"));
    let num = |x: &str| x.trim().parse::<u32>().map_err(|_| invalid());
    let (min, max) = match s.split(':').collect::<Vec<_>>().as_slice() {
        [n] => (num(n)?, num(n)?),
        [a, b] => (num(a)?, num(b)?),
        _ => return Err(invalid()),
    };
    if min == 0 || min > max {
        return Err(invalid());
    }
    Ok((min, max))
}

pub(super) fn parse_nproc(s: &str, host: &Host) -> Result<u32, ConfigError> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i64>() {
        return match u32::try_from(n) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(format!(
                "invalid value '{s}' for '--nproc-per-node': use an integer > 0, cpu, gpu or auto"
            ))),
        };
    }
    let cpus = u32::try_from(host.cpu_count.max(1)).unwrap_or(u32::MAX);
    match s {
        "cpu" => Ok(cpus),
        "gpu" => match (host.gpu_count)() {
            Ok(n) if n > 0 => Ok(n),
            Ok(_) => Err(bad("'--nproc-per-node gpu': NVML reports no GPU on this node; use an integer, cpu or auto")),
            Err(e) => Err(bad(format!("'--nproc-per-node gpu': {e}; use an integer, cpu or auto"))),
        },
        "auto" => Ok((host.gpu_count)().ok().filter(|n| *n > 0).unwrap_or(cpus)),
        _ => Err(bad(format!(
            "invalid value '{s}' for '--nproc-per-node': use an integer > 0, cpu, gpu or auto"
        ))),
    }
}

/// `--duplicate-*-filters`: comma-separated substrings, `,,` stands for a literal comma.
pub(super) fn parse_filters(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                cur.push(',');
                chars.next();
            }
            (',', _) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.retain(|f| !f.is_empty());
    out
}

pub(super) fn parse_ranks_filter(s: &str) -> Result<Option<BTreeSet<u32>>, ConfigError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    s.split(',')
        .map(|r| r.trim().parse::<u32>())
        .collect::<Result<BTreeSet<_>, _>>()
        .map(Some)
        .map_err(|_| bad(format!("invalid value '{s}' for '--local-ranks-filter': use comma-separated local ranks like 0,2")))
}

pub fn parse_signals(s: &str) -> Result<Vec<Signal>, ConfigError> {
    let valid = || HANDLEABLE_SIGNALS.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let full = if name.starts_with("SIG") { name.to_string() } else { format!("SIG{name}") };
            HANDLEABLE_SIGNALS
                .iter()
                .copied()
                .find(|sig| sig.as_str() == full)
                .ok_or_else(|| bad(format!("invalid signal '{name}' in '--signals-to-handle': use {}", valid())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnodes_forms() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
        for bad in ["0", "3:2", "a", "1:2:3", "", "0:1"] {
            assert!(parse_nnodes(bad).unwrap_err().to_string().contains("--nnodes"), "{bad}");
        }
    }

    #[test]
    fn filters_unescape_double_commas() {
        assert_eq!(parse_filters("a,b,,c,"), ["a", "b,c"]);
        assert!(parse_filters("").is_empty());
    }

    #[test]
    fn signals_are_validated() {
        assert_eq!(parse_signals("SIGTERM, USR1").unwrap(), [Signal::SIGTERM, Signal::SIGUSR1]);
        assert!(parse_signals("SIGKILL").unwrap_err().to_string().contains("SIGUSR2"));
    }
}
