//! Where worker output goes: `--log-dir`, `-r/--redirects`, `-t/--tee`, the prefix template and the filters.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::parse::{parse_filters, parse_ranks_filter};
use super::{bad, ConfigError, Host};
use crate::cli::Cli;

/// Which of a worker's streams go to files (and, for tee, also to the console).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Std {
    pub out: bool,
    pub err: bool,
}

impl Std {
    fn from_digit(d: char) -> Option<Std> {
        let v = d.to_digit(10).filter(|v| *v <= 3)?;
        Some(Std { out: v & 1 != 0, err: v & 2 != 0 })
    }

    fn union(self, o: Std) -> Std {
        Std { out: self.out || o.out, err: self.err || o.err }
    }
}

/// `-r` / `-t` values: one mask for every rank, or a per-local-rank map (ranks missing from it get none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdSpec {
    All(Std),
    PerRank(BTreeMap<u32, Std>),
}

impl StdSpec {
    pub fn for_rank(&self, local_rank: u32) -> Std {
        match self {
            StdSpec::All(s) => *s,
            StdSpec::PerRank(m) => m.get(&local_rank).copied().unwrap_or_default(),
        }
    }

    fn parse(flag: &str, s: &str) -> Result<StdSpec, ConfigError> {
        let invalid = || {
            bad(format!(
                "invalid value '{s}' for '{flag}': use 0 (none), 1 (stdout), 2 (stderr), 3 (both), \
                 or a per-rank map like 0:1,1:3"
            ))
        };
        let s = s.trim();
        let mut chars = s.chars();
        if let (Some(d), None) = (chars.next(), chars.next()) {
            return Std::from_digit(d).map(StdSpec::All).ok_or_else(invalid);
        }
        // torchrun's regex allows one digit per rank only: ^(\d:[0123],)*(\d:[0123])$
        let mut map = BTreeMap::new();
        for item in s.split(',') {
            let b: Vec<char> = item.chars().collect();
            match b.as_slice() {
                [r, ':', m] if r.is_ascii_digit() => {
                    let std = Std::from_digit(*m).ok_or_else(invalid)?;
                    map.insert(r.to_digit(10).unwrap_or_default(), std);
                }
                _ => return Err(invalid()),
            }
        }
        Ok(StdSpec::PerRank(map))
    }
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// None: a fresh `torchelastic_*` temp directory. `/dev/null`: no files at all.
    pub log_dir: Option<PathBuf>,
    pub redirects: StdSpec,
    pub tee: StdSpec,
    pub prefix_template: Option<String>,
    pub local_ranks_filter: Option<BTreeSet<u32>>,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
}

impl LogConfig {
    /// Streams written to files for a rank (tee implies redirect).
    pub fn redirected(&self, local_rank: u32) -> Std {
        self.redirects.for_rank(local_rank).union(self.tee.for_rank(local_rank))
    }

    /// Whether this rank's output reaches the console at all.
    pub fn on_console(&self, local_rank: u32) -> bool {
        self.local_ranks_filter.as_ref().is_none_or(|f| f.contains(&local_rank))
    }

    pub fn files_disabled(&self) -> bool {
        self.log_dir.as_deref() == Some(Path::new("/dev/null"))
    }

    pub(super) fn from_cli(cli: &Cli, host: &Host) -> Result<LogConfig, ConfigError> {
        let logs = LogConfig {
            log_dir: cli.log_dir.as_deref().filter(|d| !d.is_empty()).map(PathBuf::from),
            redirects: StdSpec::parse("--redirects", &cli.redirects)?,
            tee: StdSpec::parse("--tee", &cli.tee)?,
            prefix_template: cli
                .log_line_prefix_template
                .clone()
                .or_else(|| (host.env)("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
                .filter(|t| !t.is_empty()),
            local_ranks_filter: parse_ranks_filter(&cli.local_ranks_filter)?,
            duplicate_stdout_filters: parse_filters(&cli.duplicate_stdout_filters),
            duplicate_stderr_filters: parse_filters(&cli.duplicate_stderr_filters),
        };
        if let Some(dir) = logs.log_dir.as_deref().filter(|_| !logs.files_disabled()) {
            prepare_log_dir(dir)?;
        }
        Ok(logs)
    }
}

/// `--log-dir`: created if missing (torchrun creates it at the same point) and writable, so that an unusable
/// one is bad input, refused before anything starts, rather than a failure of the first start.
fn prepare_log_dir(dir: &Path) -> Result<(), ConfigError> {
    let unusable = |why: String| {
        bad(format!("'--log-dir {}': {why}; give a writable directory (it is created if missing)", dir.display()))
    };
    if dir.exists() && !dir.is_dir() {
        return Err(unusable("is a file, not a directory".to_string()));
    }
    std::fs::create_dir_all(dir).map_err(|e| unusable(format!("cannot create it: {e}")))?;
    use nix::unistd::{access, AccessFlags};
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| unusable(format!("not writable: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn std_specs_follow_torchrun() {
        assert_eq!(StdSpec::parse("-r", "3").unwrap(), StdSpec::All(Std { out: true, err: true }));
        let m = StdSpec::parse("-t", "0:1,1:2").unwrap();
        assert_eq!(m.for_rank(0), Std { out: true, err: false });
        assert_eq!(m.for_rank(1), Std { out: false, err: true });
        assert_eq!(m.for_rank(2), Std::default());
        for bad in ["4", "10:1", "0:4", "0:1,", "x"] {
            assert!(StdSpec::parse("-t", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unusable_log_dir_is_named_and_a_missing_one_created() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "").unwrap();
        for (dir, why) in [(file.clone(), "is a file"), (file.join("sub"), "cannot create it"), ("/proc/muster".into(), "cannot create it")] {
            let e = prepare_log_dir(&dir).unwrap_err().to_string();
            assert!(e.starts_with(&format!("'--log-dir {}': {why}", dir.display())), "{e}");
        }
        let missing = tmp.path().join("a/b");
        prepare_log_dir(&missing).unwrap();
        assert!(missing.is_dir());
    }
}
