//! Stragglers named without a change to the script: two agents × two gloo workers
//! (tests/fixtures/straggler_worker.py) where one rank's step takes three times the others'; group rank 0
//! names that rank, its node, local rank and the function it works in, within two windows. With
//! `--on-straggler drain` its node drains once it stays a straggler through a second window, and the job goes
//! on without it. A GPU slowed on the fake NVML is named the same way. Jobs written as most are, with
//! DistributedDataParallel or FSDP2 (tests/fixtures/ddp_worker.py: the waits inside `loss.backward()`), name
//! a rank slowed by data, by compute, or by SIGSTOP/SIGCONT from outside.

use crate::common;

use common::cluster::*;
use common::*;
use serde_json::Value;
use std::time::Duration;

/// The straggler window of these tests (at least two heartbeats: `keep_alive_interval=1`).
const WINDOW: &str = "--straggler-window=3";
/// The DDP and FSDP2 jobs' window, and its length in milliseconds.
const DDP_WINDOW: &str = "--straggler-window=5";
const DDP_WINDOW_MS: u64 = 5000;

struct Job {
    dir: tempfile::TempDir,
    run_id: String,
    window: &'static str,
}

impl Job {
    fn new() -> Job {
        Job { dir: tempfile::tempdir().expect("tempdir"), run_id: format!("pace{}", std::process::id()), window: WINDOW }
    }

    /// Agent `node`'s arguments, running `script` with `script_args` after OUTDIR.
    fn args(&self, node: &str, endpoint: &str, conf: &str, extra: &[&str], script: &str, script_args: &[String]) -> Vec<String> {
        let hook = format!("env | grep '^MUSTER_FAULT_' > {}", self.dir.path().join(format!("hook-{node}.env")).display());
        let events = format!("--event-log={}", self.dir.path().join(format!("events-{node}.jsonl")).display());
        AgentArgs::c10d("1:2", endpoint)
            .nproc(2)
            .conf(conf)
            .run_id(&self.run_id)
            .ranked(node)
            .opts(["--shutdown-timeout=5", self.window, &events, "--on-node-fault", &hook])
            .opts(extra)
            .script(fixture(script))
            .arg(self.dir.path())
            .args(script_args)
            .build()
    }

    /// Agents a (hosting the store) and b, rank `slow` three times slower than the others.
    fn start(&self, extra: &[&str], slow: u32) -> (Agent, Agent) {
        self.start_script(extra, "straggler_worker.py", &[slow.to_string()])
    }

    /// Agents a (hosting the store) and b running `script`.
    fn start_script(&self, extra: &[&str], script: &str, script_args: &[String]) -> (Agent, Agent) {
        let a = Agent::start("a", &self.args("a", "127.0.0.1:0", "is_host=1,last_call_timeout=600,keep_alive_interval=1", extra, script, script_args));
        let port = a.hosted_port();
        // A last call no test outlives: a drained node is not waited for (the others know who is alive).
        let b_conf = "last_call_timeout=600,keep_alive_interval=1";
        let b = Agent::start("b", &self.args("b", &format!("127.0.0.1:{port}"), b_conf, extra, script, script_args));
        (a, b)
    }

    fn finish(&self) {
        std::fs::write(self.dir.path().join("finish"), "").expect("finish");
    }

    /// The straggler events agent `node` wrote, once it wrote one: the log line comes first, the file's
    /// writer thread after it.
    fn stragglers(&self, node: &str) -> Vec<Value> {
        let read = || {
            let log = std::fs::read_to_string(self.dir.path().join(format!("events-{node}.jsonl"))).unwrap_or_default();
            log.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|e| e["name"] == "muster.agent.straggler")
                .collect::<Vec<_>>()
        };
        eventually(LONG, || !read().is_empty());
        read()
    }
}

/// Rank 3 (node b's local rank 1) works three times as long per step: group rank 0 names it within two
/// windows of the workers' start, with the function it works in, and nobody else; training goes on.
#[test]
fn a_rank_three_times_slower_is_named_with_where_it_works() {
    let job = Job::new();
    let (mut a, mut b) = job.start(&[], 3);
    let world = wait_world(job.dir.path(), 4, 4);
    let line = "straggler: rank 3 on node ";
    assert!(eventually(LONG, || a.log().contains(line)), "no {line:?} in\n{}\n---\n{}", a.log(), b.log());
    let named = job.stragglers("a");
    assert_eq!(named.len(), 1, "{named:?}");
    let e = &named[0];
    assert_eq!((e["rank"].as_u64(), e["local_rank"].as_u64(), e["group_rank"].as_u64()), (Some(3), Some(1), Some(1)), "{e}");
    assert!(e["windows_training"].as_u64().is_some_and(|w| w <= 2), "named later than two windows of training: {e}");
    let why = e["why"].as_str().unwrap_or_default();
    assert!(why.contains("the job's median") && why.contains("it works in straggler_worker.py:") && why.contains(" work"), "{why}");
    assert!(world.iter().all(|s| alive(s.pid)), "a worker ended: {}", a.log());
    job.finish();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
}

/// With `--on-straggler drain`, node b (whose rank 3 stays a straggler through a second window) drains: exit
/// 75, the line, the hook with `straggler`; a goes on alone (`--nnodes 1:2`) without spending a restart.
#[test]
fn with_drain_the_stragglers_node_drains_and_the_job_goes_on_without_it() {
    let job = Job::new();
    let (mut a, mut b) = job.start(&["--on-straggler=drain"], 3);
    wait_world(job.dir.path(), 4, 4);
    assert_eq!(b.exit_code(LONG), Some(75), "{}\n---\n{}", b.log(), a.log());
    assert!(b.log().contains("straggler: rank 3 on node ") && b.log().contains("its node drains (--on-straggler drain)"), "{}", b.log());
    let hook = std::fs::read_to_string(job.dir.path().join("hook-b.env")).expect("b's hook ran");
    assert!(hook.contains("MUSTER_FAULT_KIND=straggler"), "{hook}");
    let alone = wait_world(job.dir.path(), 2, 2);
    assert!(alone.iter().all(|s| s.node == "a" && s.restart_count == 0), "{alone:?}");
    job.finish();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
}

/// One agent, two workers on two fake GPUs, the job balanced; GPU 1 then slows for heat (its clock-event
/// reasons say HW thermal slowdown, its SM clock 800 MHz): rank 1 is named for its GPU.
#[test]
fn a_gpu_slowed_on_the_fake_nvml_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = common::gpus::FakeNode::new(dir.path(), "a", 2, &[]);
    let args = AgentArgs::c10d(1, "127.0.0.1:0")
        .nproc(2)
        .conf("is_host=1,keep_alive_interval=1")
        .opts([WINDOW])
        .script(fixture("straggler_worker.py"))
        .arg(dir.path())
        .build();
    let mut agent = Agent::start_with_env("a", &args, &gpus.env());
    wait_world(dir.path(), 2, 2);
    gpus.write("clocks 1 0x40 sm=800");
    let line = "straggler: rank 1 on node ";
    let named = || agent.log().lines().any(|l| l.contains(line) && l.contains("runs on GPU 1, slowed (HW_THERMAL_SLOWDOWN) at 800 MHz"));
    assert!(eventually(LONG, named), "rank 1 not named for its GPU:\n{}", agent.log());
    assert!(!agent.log().contains("straggler: rank 0 "), "{}", agent.log());
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
}

/// A slowdown of rank 2 in a DDP job, where the others wait inside `loss.backward()`.
enum Slowdown {
    Data,
    /// Data, in an FSDP2 job (`fully_shard`).
    Fsdp2Data,
    Compute,
    /// SIGSTOP for 250 ms, then SIGCONT for 50 ms, from outside, for as long as the test runs.
    Pulsed,
}

/// Rank 2 (node b's local rank 0) of a DDP (or FSDP2) job (tests/fixtures/ddp_worker.py) is slowed: group
/// rank 0 names it within two windows of training, with the function of the script it is in, and nobody else.
fn a_ddp_straggler_is_named(slowdown: Slowdown, frame: &str) {
    // Longer windows than the explicit-collective job's: four DDP or FSDP2 ranks starting on 2 cores take a
    // few seconds to settle (the first to start wait for the last), which a 3 s window may not hold.
    let job = Job { window: DDP_WINDOW, ..Job::new() };
    let script_args: Vec<String> = match slowdown {
        Slowdown::Data => vec!["--slow-rank=2".into(), "--slow-by=data".into()],
        Slowdown::Fsdp2Data => vec!["--slow-rank=2".into(), "--slow-by=data".into(), "--fsdp2".into()],
        Slowdown::Compute => vec!["--slow-rank=2".into(), "--slow-by=compute".into()],
        Slowdown::Pulsed => Vec::new(),
    };
    let (mut a, mut b) = job.start_script(&[], "ddp_worker.py", &script_args);
    let world = wait_world(job.dir.path(), 4, 4);
    // The pulses start now, some way into a window: the first window they fill is the next.
    // Window ids as the agents cut them: unix milliseconds / the window's.
    let pulsed_from = muster::rendezvous::unix_ms().expect("a clock after 1970") / DDP_WINDOW_MS + 1;
    let pulses = matches!(slowdown, Slowdown::Pulsed).then(|| {
        let pid = world.iter().find(|s| s.rank == 2).expect("rank 2").pid;
        Pulser::start(pid, Duration::from_millis(250), Duration::from_millis(50))
    });
    let line = "straggler: rank 2 on node ";
    let named = eventually(LONG, || a.log().contains(line));
    drop(pulses);
    assert!(named, "no {line:?} in\n{}\n---\n{}", a.log(), b.log());
    let named = job.stragglers("a");
    assert_eq!(named.len(), 1, "{named:?}");
    let e = &named[0];
    assert_eq!((e["rank"].as_u64(), e["local_rank"].as_u64(), e["group_rank"].as_u64()), (Some(2), Some(0), Some(1)), "{e}");
    // Windows of training (the first whole one on; 0: named before it), and of the slowdown: the pulses start
    // after the workers.
    let window = e["window"].as_u64().unwrap_or(0);
    let since = (window + 1).saturating_sub(e["windows_training"].as_u64().unwrap_or(u64::MAX));
    let from = if matches!(slowdown, Slowdown::Pulsed) { since.max(pulsed_from) } else { since };
    let late = || format!("named later than two windows of training: {e}\n{}\n---\n{}", a.log(), b.log());
    assert!((window + 1).saturating_sub(from) <= 2, "{}", late());
    let why = e["why"].as_str().unwrap_or_default();
    assert!(why.contains("the job's median") && why.contains("it works in ddp_worker.py:") && why.contains(frame), "{why}");
    job.finish();
    assert_eq!(a.exit_code(LONG), Some(0), "{}\n---\n{}", a.log(), b.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}\n---\n{}", b.log(), a.log());
}

#[test]
fn a_ddp_rank_slow_on_data_is_named() {
    a_ddp_straggler_is_named(Slowdown::Data, " fetch_batch");
}

#[test]
fn an_fsdp2_rank_slow_on_data_is_named() {
    a_ddp_straggler_is_named(Slowdown::Fsdp2Data, " fetch_batch");
}

#[test]
fn a_ddp_rank_slow_on_compute_is_named() {
    a_ddp_straggler_is_named(Slowdown::Compute, " heavy_compute");
}

#[test]
fn a_ddp_rank_stopped_and_continued_from_outside_is_named() {
    a_ddp_straggler_is_named(Slowdown::Pulsed, "");
}

/// Sends SIGSTOP and SIGCONT to a worker in turn until dropped (then SIGCONT).
struct Pulser {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pulser {
    fn start(pid: i32, stopped: Duration, running: Duration) -> Pulser {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: kill(2) of a worker this test's agent started.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(stopped);
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                std::thread::sleep(running);
            }
        });
        Pulser { stop, thread: Some(thread) }
    }
}

impl Drop for Pulser {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
