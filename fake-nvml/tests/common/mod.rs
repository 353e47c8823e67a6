//! What the tests of this package share: one fake-NVML session at a time, with its own events and status
//! files.

#![allow(dead_code)]

use crate::support;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

pub struct Env {
    _guard: std::sync::MutexGuard<'static, ()>,
    pub dir: PathBuf,
}

impl Env {
    /// Takes the process-wide lock and points the fake at `config` (events/status files in a
    /// fresh temp dir).
    pub fn new(tag: &str, config: &Path) -> Env {
        let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("fake-nvml-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("events"), "").unwrap();
        std::env::set_var("FAKE_NVML_CONFIG", config);
        std::env::set_var("FAKE_NVML_EVENTS_FILE", dir.join("events"));
        std::env::set_var("FAKE_NVML_STATUS_FILE", dir.join("status"));
        Env { _guard: guard, dir }
    }

    pub fn with_json(tag: &str, json: &str) -> Env {
        let env = Env::new(tag, Path::new("/nonexistent"));
        let cfg = env.dir.join("config.json");
        std::fs::write(&cfg, json).unwrap();
        std::env::set_var("FAKE_NVML_CONFIG", &cfg);
        env
    }

    pub fn inject(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("events"))
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }

    /// Waits (reading only the status file, never calling NVML) until a status line starts with
    /// `prefix`; returns the whole status. Panics after 10 s.
    pub fn await_status(&self, prefix: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let status = self.status();
            if status.lines().any(|l| l.starts_with(prefix)) {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "no status line {prefix:?} in:\n{status}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    pub fn status(&self) -> String {
        std::fs::read_to_string(self.dir.join("status")).unwrap_or_default()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn init() -> Nvml {
    let lib = support::library();
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("fake NVML init")
}

pub fn init_err() -> NvmlError {
    let lib = support::library();
    match Nvml::builder().lib_path(lib.as_os_str()).init() {
        Ok(_) => panic!("init should fail"),
        Err(e) => e,
    }
}

