//! The open-file limit (`RLIMIT_NOFILE`): raised from the soft to the hard limit at start, and the
//! share of it a store may spend on connections, so a flood of connections can never leave the agent
//! without descriptors for its own pipes, log files and workers.

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use thiserror::Error;

/// The open-file limit after [`raise_open_files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at start (the one to give back to programs that expect it).
    pub inherited: u64,
    /// The soft limit now in force.
    pub soft: u64,
}

/// Raises the soft open-file limit to the hard limit. Idempotent; on failure the limit in force is
/// reported unchanged (a debug note: the caps below then follow the lower limit).
pub fn raise_open_files() -> OpenFiles {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return OpenFiles { inherited: FALLBACK, soft: FALLBACK };
    };
    if soft >= hard {
        return OpenFiles { inherited: soft, soft };
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => OpenFiles { inherited: soft, soft: hard },
        Err(e) => {
            tracing::debug!("cannot raise the open-file limit from {soft} to {hard}: {e}");
            OpenFiles { inherited: soft, soft }
        }
    }
}

/// The usual soft limit, assumed when it cannot be read.
const FALLBACK: u64 = 1024;

/// Descriptors kept out of the stores' reach for the process's own files: half the limit, at most 512.
pub fn headroom(limit: u64) -> u64 {
    (limit / 2).min(512)
}

/// The most connections a store may hold open under `limit`.
pub fn connection_cap(limit: u64) -> usize {
    usize::try_from(limit - headroom(limit)).unwrap_or(usize::MAX)
}

/// An explicit connection limit the open-file limit cannot honour.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "invalid value '{requested}' for '{flag}': the open-file limit is {limit} and {headroom} are kept for \
     muster's own files; use at most {cap}, or raise the hard limit (ulimit -Hn)"
)]
pub struct TooManyConnections {
    pub flag: &'static str,
    pub requested: usize,
    pub limit: u64,
    pub headroom: u64,
    pub cap: usize,
}

/// The connection limit to use: `requested` when it fits `limit`, an error naming `flag` when it does
/// not; without a request, `default` clamped to what fits (with an info note when clamped).
pub fn max_connections(
    requested: Option<usize>,
    default: usize,
    limit: u64,
    flag: &'static str,
) -> Result<usize, TooManyConnections> {
    let cap = connection_cap(limit);
    match requested {
        Some(n) if n > cap => Err(TooManyConnections { flag, requested: n, limit, headroom: headroom(limit), cap }),
        Some(n) => Ok(n),
        None if default > cap => {
            tracing::info!(
                "serving at most {cap} store connections: the open-file limit is {limit}, {} kept for muster's own files",
                headroom(limit)
            );
            Ok(cap)
        }
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stores_get_the_limit_less_the_headroom() {
        for (limit, cap) in [(1024, 512), (20000, 19488), (1 << 20, (1 << 20) - 512), (100, 50), (1, 1), (0, 0)] {
            assert_eq!(connection_cap(limit), cap, "{limit}");
        }
    }

    #[test]
    fn a_default_is_clamped_and_an_explicit_value_over_the_cap_is_refused() {
        assert_eq!(max_connections(None, 16384, 20000, "--max-connections"), Ok(16384));
        assert_eq!(max_connections(None, 16384, 1024, "--max-connections"), Ok(512));
        assert_eq!(max_connections(Some(512), 16384, 1024, "--max-connections"), Ok(512));
        let e = max_connections(Some(16384), 16384, 1024, "--max-connections").unwrap_err().to_string();
        for needle in ["'--max-connections'", "16384", "limit is 1024", "512 are kept", "at most 512"] {
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn raising_is_idempotent_and_never_lowers() {
        let first = raise_open_files();
        let again = raise_open_files();
        assert!(first.soft >= first.inherited);
        assert_eq!(again.soft, first.soft);
    }
}
