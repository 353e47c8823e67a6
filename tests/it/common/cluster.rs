//! Several agents on loopback: agent processes with collected logs, and what the test workers
//! (`tests/fixtures/elastic_worker.py`) record.

use std::ffi::OsStr;
use std::fmt::Display;
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

    /// SIGKILLs the agent (as a host that vanishes, or the OOM killer).
    pub fn kill9(&self) {
        // SAFETY: plain kill(2) of a process this test started.
        unsafe { libc::kill(self.guard.pid(), libc::SIGKILL) };
    }

    pub fn exit_code(&mut self, timeout: Duration) -> Option<i32> {
        let status = self.guard.wait_timeout(timeout).unwrap_or_else(|| panic!("agent still running: {}", self.log()));
        // The agent's last lines may still be in the pipe; a worker left alive may hold it open, so the
        // wait for its end is bounded.
        let _ = self.read_all.recv_timeout(Duration::from_secs(5));
        status.code()
    }
}


/// An agent's command line as the tests write it: the job's shape and rendezvous, muster's other options,
/// then the script and its arguments (which must come last), e.g.
/// `AgentArgs::c10d("2:3", "127.0.0.1:0").nproc(2).conf("is_host=1").run_id(&id).opt("--max-restarts=1")
/// .script(fixture("elastic_worker.py")).arg(dir).build()`.
#[derive(Clone, Debug)]
pub struct AgentArgs {
    /// `--nnodes`, `--nproc-per-node` and the `--rdzv-*` options.
    job: Vec<String>,
    options: Vec<String>,
    script: Option<String>,
    script_args: Vec<String>,
}

fn text(s: impl AsRef<OsStr>) -> String {
    s.as_ref().to_string_lossy().into_owned()
}

impl AgentArgs {
    /// `--nnodes=NNODES --rdzv-backend=c10d --rdzv-endpoint=ENDPOINT`.
    pub fn c10d(nnodes: impl Display, endpoint: impl Display) -> AgentArgs {
        AgentArgs::rdzv("c10d", nnodes, endpoint)
    }

    /// As [`AgentArgs::c10d`], with another rendezvous backend (`etcd`).
    pub fn rdzv(backend: &str, nnodes: impl Display, endpoint: impl Display) -> AgentArgs {
        let job = vec![
            format!("--nnodes={nnodes}"),
            format!("--rdzv-backend={backend}"),
            format!("--rdzv-endpoint={endpoint}"),
        ];
        AgentArgs { job, options: Vec::new(), script: None, script_args: Vec::new() }
    }

    /// `--nproc-per-node=NPROC`.
    pub fn nproc(mut self, nproc: impl Display) -> AgentArgs {
        self.job.push(format!("--nproc-per-node={nproc}"));
        self
    }

    /// `--rdzv-conf=CONF`.
    pub fn conf(mut self, conf: impl Display) -> AgentArgs {
        self.job.push(format!("--rdzv-conf={conf}"));
        self
    }

    /// `--rdzv-id=RUN_ID`.
    pub fn run_id(mut self, run_id: impl Display) -> AgentArgs {
        self.job.push(format!("--rdzv-id={run_id}"));
        self
    }

    /// `--node-rank` from the node's letter (a: 0, b: 1, ...): the preferred group rank, so that the ranks
    /// follow the test's names whatever order the agents join in (the store's host prints its port before it
    /// joins: on a loaded machine the next agent may join first).
    pub fn ranked(mut self, node: &str) -> AgentArgs {
        let rank = node.bytes().next().map_or(0, |c| c.saturating_sub(b'a'));
        self.job.push(format!("--node-rank={rank}"));
        self
    }

    /// One more argument of muster's (an option or its value), e.g. `--max-restarts=3`.
    pub fn opt(mut self, option: impl AsRef<OsStr>) -> AgentArgs {
        self.options.push(text(option));
        self
    }

    pub fn opts(mut self, options: impl IntoIterator<Item = impl AsRef<OsStr>>) -> AgentArgs {
        self.options.extend(options.into_iter().map(text));
        self
    }

    /// The training script, after every option of muster's.
    pub fn script(mut self, script: impl AsRef<OsStr>) -> AgentArgs {
        self.script = Some(text(script));
        self
    }

    /// One argument of the script's.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> AgentArgs {
        self.script_args.push(text(arg));
        self
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> AgentArgs {
        self.script_args.extend(args.into_iter().map(text));
        self
    }

    pub fn build(self) -> Vec<String> {
        let script = self.script.unwrap_or_else(|| panic!("an agent's command line without a script: {:?}", self.job));
        self.job.into_iter().chain(self.options).chain([script]).chain(self.script_args).collect()
    }
}
