//! Locate (building it first if needed) the fake NVML library from an integration test.
//!
//! Usable from any crate of the workspace:
//! ```ignore
//! #[path = "../../../fake-nvml/tests/support/mod.rs"]   // from muster's tests/it/common/
//! mod fake_nvml;
//! let lib: std::path::PathBuf = fake_nvml::library();
//! ```
//! Order: `$FAKE_NVML_LIB` if set; otherwise `cargo build` of the fake-nvml package into the
//! same target directory and profile as the running test binary (a no-op when it is fresh),
//! then the `.so` next to it. Panics with a clear message if it cannot be found.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const LIB_FILE: &str = "libnvidia_ml_fake.so";

/// The fake-nvml package directory, given the including crate's manifest dir.
fn package_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.join("src/state.rs").exists() && here.ends_with("fake-nvml") {
        here
    } else {
        here.join("fake-nvml")
    }
}

/// (target dir, profile dir name) of the running test binary: `<target>/<profile>/deps/<exe>`.
fn target_of_current_exe() -> Option<(PathBuf, String)> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let profile_dir = if deps.file_name()? == "deps" {
        deps.parent()?
    } else {
        deps
    };
    let target = profile_dir.parent()?;
    Some((
        target.to_path_buf(),
        profile_dir.file_name()?.to_str()?.to_string(),
    ))
}

fn build_and_find() -> PathBuf {
    if let Some(p) = std::env::var_os("FAKE_NVML_LIB") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "FAKE_NVML_LIB={} does not exist", p.display());
        return p;
    }
    let (target, profile) = target_of_current_exe()
        .unwrap_or_else(|| (package_dir().join("../target"), "debug".to_string()));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(package_dir().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .arg("--quiet");
    match profile.as_str() {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    let status = cmd.status();
    let candidates = [
        target.join(&profile).join(LIB_FILE),
        target.join(&profile).join("deps").join(LIB_FILE),
    ];
    let found = candidates.iter().find(|p| p.exists()).cloned();
    match (status, found) {
        (Ok(s), Some(p)) if s.success() => p,
        (st, Some(p)) => {
            eprintln!("warning: building fake-nvml failed ({st:?}); using the existing {}", p.display());
            p
        }
        (st, None) => panic!(
            "fake NVML library not found (cargo build of {} -> {st:?}); looked in {:?}; set FAKE_NVML_LIB",
            package_dir().display(),
            candidates
        ),
    }
}

/// Absolute path of `libnvidia_ml_fake.so`, built once per test process.
pub fn library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(build_and_find).clone()
}

/// `tests/fixtures/gpu` of the workspace.
pub fn fixtures_dir() -> PathBuf {
    package_dir().join("../tests/fixtures/gpu")
}

/// A fixture path, e.g. `fixture("hgx-h100.json")`.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    assert!(Path::new(&p).exists(), "missing fixture {}", p.display());
    p
}
