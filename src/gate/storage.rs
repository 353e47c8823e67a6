//! The storage check: each path (the log directory, every `--gate-path`) takes a probe file: created,
//! written, fsynced, read back and removed. A file system that stops answering (an NFS server cut off, a
//! FUSE daemon stopped) blocks this thread in the kernel; the gate's bound (`mod.rs`) reports it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{Check, Finding};

/// The probe's bytes: enough to reach the device through the page cache's fsync.
const PROBE: [u8; 4096] = [0x5a; 4096];

/// The probe file's name in a checked directory (one per agent).
pub(super) fn probe_name() -> String {
    format!(".muster-health-{}", std::process::id())
}

pub(super) fn check(paths: &[PathBuf], deadline: Instant) -> Finding {
    let mut seen = Vec::new();
    for path in paths {
        let start = Instant::now();
        if let Err(e) = probe(path) {
            return Finding::failed(
                Check::Storage,
                format!("{} does not take a probe file: {e}", path.display()),
                "a directory this agent can create, write, fsync, read and remove a file in",
            );
        }
        if Instant::now() > deadline {
            return Finding::failed(
                Check::Storage,
                format!("{} took {:?} for a 4 KiB probe", path.display(), start.elapsed()),
                "a file system that answers within the gate's time",
            );
        }
        seen.push(format!("{} {:.1} ms", path.display(), start.elapsed().as_secs_f64() * 1000.0));
    }
    Finding::ok(Check::Storage, format!("probe written, fsynced, read and removed: {}", seen.join(", ")))
}

fn probe(dir: &Path) -> std::io::Result<()> {
    let file = dir.join(probe_name());
    let mut f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(&file)?;
    f.write_all(&PROBE)?;
    f.sync_all()?;
    drop(f);
    let back = std::fs::read(&file)?;
    std::fs::remove_file(&file)?;
    if back != PROBE {
        return Err(std::io::Error::other(format!("read back {} other bytes than were written", back.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_writable_directory_passes_and_a_missing_one_fails_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let later = Instant::now() + Duration::from_secs(30);
        let ok = check(&[dir.path().to_path_buf()], later);
        assert!(ok.ok, "{ok:?}");
        assert!(!dir.path().join(probe_name()).exists(), "the probe is removed");
        let missing = dir.path().join("nope");
        let failed = check(&[dir.path().to_path_buf(), missing.clone()], later);
        assert!(!failed.ok && failed.saw.contains(&missing.display().to_string()), "{failed:?}");
    }
}
