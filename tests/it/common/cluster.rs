//! Several agents on loopback: agent processes with collected logs, and what the test workers
//! (`tests/fixtures/elastic_worker.py`) record.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

pub const LONG: Duration = Duration::from_secs(90);

/// One worker start as `tests/fixtures/elastic_worker.py` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub node: String,
    pub rank: u32,
    pub local_rank: u32,
    pub group_rank: u32,
    pub world_size: u32,
    pub restart_count: u32,
    pub pid: i32,
    /// CUDA_VISIBLE_DEVICES, or `-` when unset.
    pub visible: String,
}

pub fn starts(dir: &Path) -> Vec<Start> {
    std::fs::read_to_string(dir.join("starts"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse().ok());
            Some(Start {
                node: f.first()?.to_string(),
                rank: n(1)?,
                local_rank: n(2)?,
                group_rank: n(3)?,
                world_size: n(4)?,
                restart_count: n(5)?,
                pid: n(6)? as i32,
                visible: f.get(7).unwrap_or(&"-").to_string(),
            })
        })
        .collect()
}

/// Waits until `count` workers have joined a world of `world` (and passed its all-reduce check).
pub fn wait_world(dir: &Path, world: u32, count: usize) -> Vec<Start> {
    let ready = || {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&format!("ready-{world}-"))).count()
            })
            .unwrap_or(0)
    };
    let ok = eventually(LONG, || ready() >= count);
    assert!(ok, "no world of {world} with {count} workers; starts: {:?}", starts(dir));
    starts(dir).into_iter().filter(|s| s.world_size == world).collect()
}

/// An agent process whose stderr is collected as it comes.
pub struct Agent {
    pub guard: Guard,
    log: Arc<Mutex<String>>,
    /// Closed when the log reader saw the end of stderr.
    read_all: std::sync::mpsc::Receiver<()>,
}

impl Agent {
    pub fn start(node: &str, args: &[String]) -> Agent {
        Agent::start_with_env(node, args, &[])
    }

    pub fn start_with_env(node: &str, args: &[String], envs: &[(&str, String)]) -> Agent {
        let mut cmd = muster();
        cmd.env("MUSTER_TEST_NODE", node).args(args);
        cmd.envs(envs.iter().map(|(k, v)| (*k, v.as_str())));
        Agent::spawn(&mut cmd)
    }

    /// An agent from a command line made elsewhere (in a network namespace, say): stdout dropped, stderr
    /// collected.
    pub fn spawn(cmd: &mut std::process::Command) -> Agent {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut guard = Guard::spawn(cmd);
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = guard.0.stderr.take().expect("stderr");
        let sink = log.clone();
        let (reading, read_all) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let _reading = reading;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = sink.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        Agent { guard, log, read_all }
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The port of the rendezvous store this agent hosts (from its startup banner).
    pub fn hosted_port(&self) -> u16 {
        let mut port = None;
        eventually(Duration::from_secs(30), || {
            let log = self.log();
            port = log
                .lines()
                .find(|l| l.contains("(hosted here)"))
                .and_then(|l| l.split("rdzv_store=").nth(1))
                .and_then(|s| s.split_whitespace().next())
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok());
            port.is_some()
        });
        port.unwrap_or_else(|| panic!("the host agent did not report its store: {}", self.log()))
    }

    pub fn exit_code(&mut self, timeout: Duration) -> Option<i32> {
        let status = self.guard.wait_timeout(timeout).unwrap_or_else(|| panic!("agent still running: {}", self.log()));
        // The agent's last lines may still be in the pipe; a worker left alive may hold it open, so the
        // wait for its end is bounded.
        let _ = self.read_all.recv_timeout(Duration::from_secs(5));
        status.code()
    }
}

