//! Hangs: real gloo workers where one rank really stops (it sleeps, or blocks on a lock) and the others
//! really wait in `all_reduce`; two agents on loopback. What a user sees: the verdict line naming the
//! culprit, every rank's stack file, `hang_report.json`, the hang event, the group restarted once (or, with
//! `--on-hang report`, left running and captured once); `GET /stacks`; no ptrace permission.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cluster::{Agent, AgentArgs};
use common::*;

const LONG: Duration = Duration::from_secs(180);
/// `--hang-timeout` of the tests.
const TIMEOUT_S: u64 = 10;
/// muster's bound on one capture (`hang::CAPTURE_BOUND`) and its check period (`hang::CHECK_EVERY`).
const CAPTURE_BOUND: Duration = Duration::from_secs(3);
const TICK: Duration = Duration::from_millis(50);

struct HangJob {
    dir: tempfile::TempDir,
    run_id: String,
}

impl HangJob {
    fn new() -> HangJob {
        python();
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("ckpt")).expect("ckpt dir");
        HangJob { dir, run_id: format!("hang{}", std::process::id()) }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What every agent of these tests is given, before the script.
    fn agent_args(&self, node: &str, endpoint: &str, conf: &str, muster_args: &[&str]) -> AgentArgs {
        let p = self.path();
        AgentArgs::c10d(2, endpoint)
            .nproc(2)
            .conf(conf)
            .run_id(&self.run_id)
            .ranked(node)
            .opt("--max-restarts=1")
            .opt(format!("--log-dir={}", p.join("logs").join(node).display()))
            .opt(format!("--event-log={}", p.join(format!("{node}.events")).display()))
            .opts(muster_args)
    }

    fn args(&self, node: &str, endpoint: &str, conf: &str, muster_args: &[&str], script_args: &[&str]) -> Vec<String> {
        let p = self.path();
        self.agent_args(node, endpoint, conf, muster_args)
            .script(fixture("hang_train.py"))
            .arg("--ckpt-dir")
            .arg(p.join("ckpt"))
            .arg("--result")
            .arg(p.join("result.json"))
            .args(script_args)
            .build()
    }

    /// Agents `a` (hosting the store; group rank 0) and `b`.
    fn start(&self, muster_args: &[&str], script_args: &[&str]) -> (Agent, Agent) {
        self.start_with(|node, endpoint, conf| self.args(node, endpoint, conf, muster_args, script_args))
    }

    /// The same two agents, each with the arguments `args(node, endpoint, conf)`.
    fn start_with(&self, args: impl Fn(&str, &str, &str) -> Vec<String>) -> (Agent, Agent) {
        let a = Agent::start("a", &args("a", "127.0.0.1:0", "is_host=1"));
        let port = a.hosted_port();
        let endpoint = format!("127.0.0.1:{port}");
        let b = Agent::start("b", &args("b", &endpoint, "read_timeout=60"));
        (a, b)
    }

    /// Every `stacks*/rank_*.txt` of `attempt`, by file name, across both agents.
    fn stack_files(&self, attempt: &str, stacks: &str) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for node in ["a", "b"] {
            let Ok(runs) = std::fs::read_dir(self.path().join("logs").join(node)) else {
                continue;
            };
            for run in runs.flatten() {
                let dir = run.path().join(attempt).join(stacks);
                for f in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = f.file_name().to_string_lossy().to_string();
                    if name.ends_with(".txt") {
                        found.push((name, std::fs::read_to_string(f.path()).unwrap_or_default()));
                    }
                }
            }
        }
        found.sort();
        found
    }

    fn events(&self, node: &str, name: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.path().join(format!("{node}.events"))).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == name || e["name"] == name)
            .collect()
    }

    fn report(&self) -> serde_json::Value {
        let runs = std::fs::read_dir(self.path().join("logs").join("a")).expect("a's log dir");
        let path: PathBuf =
            runs.flatten().map(|r| r.path().join("hang_report.json")).find(|p| p.exists()).expect("hang_report.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
    }
}

fn logs(a: &Agent, b: &Agent) -> String {
    format!("--- a:\n{}\n--- b:\n{}", a.log(), b.log())
}

/// The verdict line group rank 0 printed.
fn verdict_line(log: &str) -> Option<String> {
    log.lines().find_map(|l| l.find("hang: ").map(|i| l[i..].to_string()))
}

/// The number of the line of fixture `name` that holds `code`.
fn fixture_line(name: &str, code: &str) -> usize {
    let text = std::fs::read_to_string(fixture(name)).expect("fixture");
    text.lines().position(|l| l.contains(code)).map(|i| i + 1).unwrap_or_else(|| panic!("no {code:?} in {name}"))
}

/// Where the waiters are: the script's frame, then torch's `all_reduce` below it.
fn in_all_reduce() -> String {
    format!("main (hang_train.py:{}) → all_reduce (distributed_c10d.py:", fixture_line("hang_train.py", "dist.all_reduce(p.grad)"))
}

/// Rank 3 stops in `load_batch` at step 20 (before its progress mark), the others wait in `all_reduce`.
fn a_sleeping_rank_is_named_and_the_group_restarts_once(progress: &[&str], script: &[&str]) {
    let job = HangJob::new();
    let timeout = TIMEOUT_S.to_string();
    let mut muster_args = vec!["--hang-timeout", &timeout];
    muster_args.extend_from_slice(progress);
    let (mut a, mut b) = job.start(&muster_args, script);
    assert_eq!(a.exit_code(LONG), Some(0), "{}", logs(&a, &b));
    assert_eq!(b.exit_code(LONG), Some(0), "{}", logs(&a, &b));
    let all = logs(&a, &b);

    let line = verdict_line(&a.log()).unwrap_or_else(|| panic!("no verdict from group rank 0:\n{all}"));
    assert!(line.starts_with("hang: rank 3 (node "), "{line}");
    assert!(line.contains("local rank 1) made no progress since "), "{line}");
    assert!(line.contains("main thread in hang_train.py:"), "{line}");
    assert!(line.contains("stuck_in_load_batch (time.sleep(3600))"), "{line}");
    assert!(line.contains(&format!("the other 3 ranks wait in {}", in_all_reduce())), "{line}");
    assert!(verdict_line(&b.log()).is_none(), "only group rank 0 prints the verdict:\n{all}");

    // Within the timeout, one check period and the capture bound of rank 3's last progress.
    let report = job.report();
    let incident = &report[0];
    assert_eq!(incident["verdict"]["suspects"], serde_json::json!([3]), "{report}");
    assert_eq!(incident["verdict"]["kind"], "stopped_first", "{report}");
    let ranks = incident["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 4, "every rank's summary: {report}");
    let last3 = ranks.iter().find(|r| r["rank"] == 3).and_then(|r| r["last_progress_ms"].as_u64()).expect("rank 3");
    let hang = job.events("a", "muster.agent.hang");
    assert_eq!(hang.len(), 1, "one hang event on a: {hang:?}");
    let at = chrono::DateTime::parse_from_rfc3339(hang[0]["timestamp"].as_str().expect("timestamp"))
        .expect("rfc3339")
        .timestamp_millis() as u64;
    let bound = Duration::from_secs(TIMEOUT_S) + TICK + CAPTURE_BOUND;
    assert!(at >= last3 + TIMEOUT_S * 1000, "verdict {at} before the timeout after {last3}");
    assert!(
        at - last3 <= bound.as_millis() as u64,
        "verdict {} ms after rank 3's last progress (bound {bound:?})",
        at - last3
    );

    let files = job.stack_files("attempt_0", "stacks");
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["rank_0.txt", "rank_1.txt", "rank_2.txt", "rank_3.txt"], "{all}");
    let (_, rank3) = &files[3];
    assert!(
        rank3.contains("stuck_in_load_batch (")
            && rank3.contains("hang_train.py:43")
            && rank3.contains("time.sleep(3600)"),
        "{rank3}"
    );
    for (name, text) in &files[..3] {
        assert!(text.contains("all_reduce ("), "{name}:\n{text}");
    }

    // One restart, spent by rank 3's node; the job finished from the checkpoint at step 20.
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(job.path().join("result.json")).expect("result")).expect("json");
    assert_eq!(result["resumed_from"], 20, "{result}");
    assert!(b.log().contains("recovered from hang"), "{all}");
    assert!(!a.log().contains("recovered from hang"), "{all}");
    assert_eq!(job.events("b", "muster.agent.hang").len(), 1, "{all}");
}

#[test]
fn a_sleeping_rank_found_by_its_output_is_named_captured_and_restarted() {
    a_sleeping_rank_is_named_and_the_group_restarts_once(&["--progress-pattern", r"step \d+"], &[]);
}

#[test]
fn a_sleeping_rank_found_by_its_progress_file_is_named_captured_and_restarted() {
    a_sleeping_rank_is_named_and_the_group_restarts_once(&[], &["--progress", "file"]);
}

/// Rank 3 shows step 20's progress, then blocks on a lock before the collective the others enter: no rank
/// stopped first, but the others wait in it and rank 3 does not: rank 3 is named, and where the others wait.
#[test]
fn a_rank_blocked_within_the_step_the_others_wait_in_is_named() {
    let job = HangJob::new();
    let timeout = TIMEOUT_S.to_string();
    let (mut a, mut b) =
        job.start(&["--hang-timeout", &timeout, "--progress-pattern", r"step \d+"], &["--hang-mode", "lock"]);
    let line = waited_on_verdict(&job, &mut a, &mut b, 3);
    // The second acquire, the one that blocks.
    let lock = fixture_line("hang_train.py", "def wait_for_lock") + 2;
    assert!(line.contains(&format!("main thread in hang_train.py:{lock} wait_for_lock (LOCK.acquire())")), "{line}");
    assert!(line.contains(&format!("the other 3 ranks wait on it in {}", in_all_reduce())), "{line}");
    let files = job.stack_files("attempt_0", "stacks");
    assert_eq!(files.len(), 4, "{files:?}");
    assert!(files[3].1.contains("wait_for_lock (") && files[3].1.contains("LOCK.acquire()"), "{}", files[3].1);
}

/// Both agents end 0 (the group restarted once); returns group rank 0's verdict, which named `suspect` alone
/// as the rank the others wait on (`waited_on` in `hang_report.json`).
fn waited_on_verdict(job: &HangJob, a: &mut Agent, b: &mut Agent, suspect: u32) -> String {
    assert_eq!(a.exit_code(LONG), Some(0), "{}", logs(a, b));
    assert_eq!(b.exit_code(LONG), Some(0), "{}", logs(a, b));
    let line = verdict_line(&a.log()).unwrap_or_else(|| panic!("no verdict:\n{}", logs(a, b)));
    assert!(line.starts_with(&format!("hang: rank {suspect} (node ")), "{line}");
    let report = job.report();
    assert_eq!(report[0]["verdict"]["kind"], "waited_on", "{report}");
    assert_eq!(report[0]["verdict"]["suspects"], serde_json::json!([suspect]), "{report}");
    line
}

/// A DistributedDataParallel job (tests/fixtures/ddp_worker.py): rank 1 shows step 20's progress, then blocks
/// in its data fetch; the others wait for it inside `loss.backward()` (DDP's reducer, below Python, under the
/// same Python frame as the backward's compute). Rank 1 is named, and where the others wait; not a job-wide hang.
#[test]
fn a_ddp_rank_the_others_wait_on_inside_backward_is_named() {
    let job = HangJob::new();
    let timeout = TIMEOUT_S.to_string();
    let muster_args = ["--hang-timeout", &timeout, "--progress-pattern", r"step \d+"];
    let (mut a, mut b) = job.start_with(|node, endpoint, conf| {
        job.agent_args(node, endpoint, conf, &muster_args)
            .script(fixture("ddp_worker.py"))
            .arg(job.path())
            .args(["--hang-rank=1", "--hang-at=20", "--steps=30"])
            .build()
    });
    let line = waited_on_verdict(&job, &mut a, &mut b, 1);
    let fetch = fixture_line("ddp_worker.py", "    time.sleep(seconds)");
    assert!(line.contains(", local rank 1) made no progress since "), "{line}");
    assert!(line.contains(&format!("main thread in ddp_worker.py:{fetch} fetch_batch (time.sleep(seconds))")), "{line}");
    assert!(line.contains("the other 3 ranks wait on it in main (ddp_worker.py:"), "{line}");
    assert!(line.contains("→ _engine_run_backward (graph.py:"), "{line}");
}

/// `--on-hang report`: the workers keep running, and one hang is captured once however long it lasts.
#[test]
fn report_mode_captures_a_hang_once_and_keeps_the_workers_running() {
    let job = HangJob::new();
    let (mut a, mut b) = job.start(
        &["--hang-timeout", "4", "--progress-pattern", r"step \d+", "--on-hang", "report"],
        &["--hang-mode", "lock"],
    );
    let seen = eventually(LONG, || job.events("a", "muster.agent.hang").len() == 1);
    assert!(seen, "no hang event:\n{}", logs(&a, &b));
    let workers = |agent: &Agent| children_of(agent.guard.pid());
    let before = (workers(&a), workers(&b));
    assert_eq!((before.0.len(), before.1.len()), (2, 2), "{before:?}");
    // Three more timeouts of the same hang: the checks go on, the capture does not.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(job.events("a", "muster.agent.hang").len(), 1, "{}", logs(&a, &b));
    assert_eq!(job.events("b", "muster.agent.hang").len(), 1, "{}", logs(&a, &b));
    assert_eq!((workers(&a), workers(&b)), before, "the workers were restarted");
    assert_eq!(job.stack_files("attempt_0", "stacks").len(), 4);
    assert!(job.stack_files("attempt_0", "stacks.1").is_empty());
    // `muster status` shows the verdict and each node's progress from its heartbeat.
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let status =
        run(muster().args(["status", "--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint, "--rdzv-id", &job.run_id]), LONG);
    assert!(status.stdout.contains("\nlast hang: rank 3 (node "), "{}{}", status.stdout, status.stderr);
    assert!(status.stdout.contains("HEARTBEAT  PROGRESS"), "{}", status.stdout);
    for agent in [&a, &b] {
        // SAFETY: kill(2) of a process this test started.
        unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) };
    }
    assert!(a.exit_code(LONG).is_some() && b.exit_code(LONG).is_some());
}

/// The worker processes (direct children) of `pid`, from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let mut kids: Vec<i32> = text.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    // Python workers only (the orphan guard is a copy of the agent, with its command line).
    kids.retain(|k| {
        std::fs::read_to_string(format!("/proc/{k}/cmdline"))
            .is_ok_and(|c| c.split('\0').next().is_some_and(|p| p.contains("python")))
    });
    kids.sort_unstable();
    kids
}

/// A 4-worker job of sleepers, and the address of its metrics endpoint (which serves `/stacks`). `denied`: the workers are
/// not dumpable (as a process is after exec'ing an interpreter with file capabilities, or a setuid wrapper)
/// and the agent runs without CAP_SYS_PTRACE (`setpriv`), so ptrace's access check refuses it their memory.
fn sleepers(dir: &Path, extra: &[&str], denied: bool) -> (Agent, String) {
    let script = dir.join("sleeper.py");
    std::fs::write(
        &script,
        "import ctypes, os, time\nimport torch\n\ndef nap():\n    time.sleep(3600)\n\n\
         if os.environ.get('NOT_DUMPABLE'):\n    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE\n\
         open(os.path.join(os.environ['OUT'], os.environ['RANK']), 'w').close()\nnap()\n",
    )
    .expect("script");
    let mut cmd = if denied {
        let mut c = std::process::Command::new("setpriv");
        c.arg("--bounding-set=-sys_ptrace")
            .arg(env!("CARGO_BIN_EXE_muster"))
            .env("PATH", path_with_venv())
            .env("NOT_DUMPABLE", "1");
        c
    } else {
        muster()
    };
    cmd.env("OUT", dir)
        .args(["--standalone", "--nproc-per-node=4", "--metrics-port=0", "--metrics-host=127.0.0.1"])
        .args(extra)
        .arg(&script);
    let agent = Agent::spawn(&mut cmd);
    let addr = metrics_addr(&agent);
    let started = eventually(LONG, || (0..4).all(|r| dir.join(r.to_string()).exists()));
    assert!(started, "the sleepers did not start:\n{}", agent.log());
    (agent, addr)
}

#[test]
fn get_stacks_shows_every_local_rank_where_it_is() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut agent, addr) = sleepers(dir.path(), &[], false);
    // Each worker marks its file just before it calls nap().
    let mut text = String::new();
    let napping = eventually(LONG, || {
        text = http_get(&addr, "/stacks").map(|(_, body)| body).unwrap_or_default();
        text.matches("nap (").count() == 4
    });
    assert!(napping, "{text}");
    assert_eq!(http_get(&addr, "/stacks").map(|(status, _)| status), Some(200));
    for r in 0..4 {
        assert!(text.contains(&format!("rank {r} (local rank {r}, pid ")), "rank {r}:\n{text}");
    }
    assert!(text.contains("time.sleep(3600)"), "{text}");
    let (_, body) = http_get(&addr, "/stacks?format=json").expect("an answer");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v.as_array().map(Vec::len), Some(4), "{v}");
    assert_eq!(v[0]["threads"]["Ok"][0]["frames"][0]["function"], "nap", "{v}");
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) };
    assert!(agent.exit_code(LONG).is_some());
}

/// Without ptrace permission: one line says why and what to grant, `/stacks` says it per rank, hang
/// detection goes on (a verdict without frames), and the job is unaffected.
#[test]
fn without_ptrace_permission_one_line_says_why_and_the_job_goes_on() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut agent, addr) = sleepers(dir.path(), &[], true);
    let (_, text) = http_get(&addr, "/stacks").expect("an answer");
    assert_eq!(
        text.matches("no stack: reading its memory is not permitted (ptrace): grant the agent CAP_SYS_PTRACE").count(),
        4,
        "{text}"
    );
    let pids = children_of(agent.guard.pid());
    assert_eq!(pids.len(), 4, "{}", agent.log());
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) };
    assert_eq!(agent.exit_code(LONG), Some(143), "{}", agent.log());
}

/// The same, in a hang: the verdict still comes, naming where it cannot look.
#[test]
fn without_ptrace_permission_a_hang_is_still_judged() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let progress = dir.path().join("touch.py");
    std::fs::write(&progress, "import os, time\nfor _ in range(3):\n    os.utime(os.environ['MUSTER_PROGRESS_FILE'])\n    time.sleep(0.1)\ntime.sleep(3600)\n").expect("script");
    let mut cmd = std::process::Command::new("setpriv");
    cmd.arg("--bounding-set=-sys_ptrace")
        .arg(env!("CARGO_BIN_EXE_muster"))
        .env("PATH", path_with_venv())
        .args(["--standalone", "--nproc-per-node=2", "--hang-timeout=2", "--on-hang=report"])
        .arg(format!("--log-dir={}", dir.path().join("logs").display()))
        .arg("--no-python")
        .arg(python())
        .arg("-c")
        .arg("import ctypes, runpy, sys; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); runpy.run_path(sys.argv[1])")
        .arg(&progress);
    let mut agent = Agent::spawn(&mut cmd);
    // The two ranks are not tied by a collective: which of them stopped first is theirs to say.
    let judged = eventually(LONG, || agent.log().contains("WARN hang: "));
    assert!(judged, "{}", agent.log());
    let log = agent.log();
    assert_eq!(log.matches("cannot read the workers' Python stacks").count(), 1, "{log}");
    assert!(log.contains("unknown (ptrace not permitted)"), "{log}");
    assert_eq!(children_of(agent.guard.pid()).len(), 2, "{log}");
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) };
    assert_eq!(agent.exit_code(LONG), Some(143), "{}", agent.log());
}

/// `--stacks-on-failure`: a worker fails; the others' stacks at that moment are kept.
#[test]
fn stacks_on_failure_keeps_where_the_survivors_were() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("fail.py");
    std::fs::write(
        &script,
        // Rank 0 fails once both others are asleep in wait_for_peers (each wrote its pid just before it).
        "import os, sys, time\n\ndef wait_for_peers():\n    time.sleep(3600)\n\nout = os.environ['OUT']\nrank = int(os.environ['RANK'])\n\
         def asleep(r):\n    try:\n        pid = open(os.path.join(out, str(r))).read()\n        return pid and open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0] == 'S'\n    except FileNotFoundError:\n        return False\n\
         if rank == 0:\n    while not all(asleep(r) for r in (1, 2)):\n        time.sleep(0.05)\n    sys.exit(1)\n\
         with open(os.path.join(out, f'.{rank}'), 'w') as f:\n    f.write(str(os.getpid()))\nos.rename(os.path.join(out, f'.{rank}'), os.path.join(out, str(rank)))\nwait_for_peers()\n",
    )
    .expect("script");
    let logs = dir.path().join("logs");
    let out = run(
        muster()
            .env("OUT", dir.path())
            .args(["--standalone", "--nproc-per-node=3", "--stacks-on-failure", "--shutdown-timeout=5"])
            .arg(format!("--log-dir={}", logs.display()))
            .arg(&script),
        LONG,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let run_dir = std::fs::read_dir(&logs).expect("logs").flatten().next().expect("run dir").path();
    let stacks = run_dir.join("attempt_0").join("stacks");
    for r in 1..3 {
        let text = std::fs::read_to_string(stacks.join(format!("rank_{r}.txt")))
            .unwrap_or_else(|e| panic!("rank {r}: {e}\n{}", out.stderr));
        assert!(text.contains("wait_for_peers (") && text.contains("time.sleep(3600)"), "{text}");
    }
    assert!(!stacks.join("rank_0.txt").exists(), "the failed worker is gone; only the survivors are read");
}

/// torch's file timer counts as progress: a worker that takes timers, then stops taking them, is judged.
#[test]
fn file_timer_requests_are_progress() {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("timed.py");
    std::fs::write(
        &script,
        "import os, time\nfrom torch.distributed.elastic.timer import FileTimerClient, configure, expires\n\
         configure(FileTimerClient(os.environ['TORCHELASTIC_TIMER_FILE']))\n\
         for _ in range(5):\n    with expires(after=600):\n        time.sleep(0.1)\n\n\
         def after_the_timers():\n    time.sleep(3600)\n\nafter_the_timers()\n",
    )
    .expect("script");
    let mut cmd = muster();
    cmd.env("TORCHELASTIC_ENABLE_FILE_TIMER", "1")
        .args(["--standalone", "--nproc-per-node=1", "--hang-timeout=2", "--on-hang=report"])
        .arg(format!("--log-dir={}", dir.path().join("logs").display()))
        .arg(&script);
    let mut agent = Agent::spawn(&mut cmd);
    let judged = eventually(LONG, || agent.log().contains("hang: job-wide: no rank made progress since "));
    assert!(judged, "{}", agent.log());
    assert!(agent.log().contains("every rank in after_the_timers ("), "{}", agent.log());
    // SAFETY: kill(2) of a process this test started.
    unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) };
    assert_eq!(agent.exit_code(LONG), Some(143), "{}", agent.log());
}

/// Rank 1 blocks in `wait` (`tests/fixtures/blocked_wait.py`), then rank 0 in the same: the verdict line and
/// `hang_report.json`, and the place each rank's summary in the report names.
fn blocked_in(wait: &str) -> (String, serde_json::Value) {
    python();
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = dir.path().join("logs");
    let out = run(
        muster()
            .args(["--standalone", "--nproc-per-node=2", "--hang-timeout=3", "--max-restarts=0"])
            .arg(format!("--log-dir={}", logs.display()))
            .arg(fixture("blocked_wait.py"))
            .arg(wait)
            .arg(dir.path()),
        LONG,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let line = verdict_line(&out.stderr).unwrap_or_else(|| panic!("no verdict:\n{}", out.stderr));
    let run_dir = std::fs::read_dir(&logs).expect("logs").flatten().next().expect("run dir").path();
    let report = std::fs::read_to_string(run_dir.join("hang_report.json")).expect("hang_report.json");
    let report: serde_json::Value = serde_json::from_str(&report).expect("json");
    assert_eq!(report[0]["verdict"]["line"], line.as_str(), "{report}");
    assert_eq!(report[0]["verdict"]["suspects"], serde_json::json!([1]), "{report}");
    (line, report)
}

/// A wait in the standard library, called from the fixture's `function` at `code`: the verdict names that
/// frame, with the one it is blocked in (threading's) after it, for the culprit and for the rank that waits;
/// so does each rank's summary in the report.
fn a_standard_library_wait_is_named_by_the_scripts_frame(wait: &str, function: &str, code: &str) {
    let (line, report) = blocked_in(wait);
    let n = fixture_line("blocked_wait.py", code);
    let rank = |r: u64| report[0]["ranks"].as_array().and_then(|a| a.iter().find(|s| s["rank"] == r)).expect("rank");
    for r in [0, 1] {
        let own = &rank(r)["own_frame"];
        assert_eq!((&own["function"], &own["file"], &own["line"]), (&function.into(), &"blocked_wait.py".into(), &n.into()), "{report}");
        assert_eq!(rank(r)["frames"][0]["file"], "threading.py", "{report}");
    }
    // Where each is blocked, from the report: `threading.py`, its line and function.
    let below = |r: u64| {
        let f = &rank(r)["frames"][0];
        (f["file"].as_str().unwrap_or_default().to_string(), f["line"].clone(), f["function"].as_str().unwrap_or_default().to_string())
    };
    let (file, at, inner) = below(1);
    let culprit = format!("main thread in blocked_wait.py:{n} {function} ({code}) → {file}:{at} {inner}; ");
    assert!(line.starts_with("hang: rank 1 (node ") && line.contains(&culprit), "{line}");
    let (file, at, inner) = below(0);
    let waiter = format!("; the other rank waits in {function} (blocked_wait.py:{n}) → {inner} ({file}:{at}) since ");
    assert!(line.contains(&waiter), "{line}");
}

#[test]
fn a_rank_blocked_in_event_wait_is_named_by_the_scripts_frame() {
    a_standard_library_wait_is_named_by_the_scripts_frame("event", "event", "threading.Event().wait()");
}

#[test]
fn a_rank_blocked_in_queue_get_is_named_by_the_scripts_frame() {
    a_standard_library_wait_is_named_by_the_scripts_frame("queue", "get", "queue.Queue().get()");
}

#[test]
fn a_rank_blocked_in_thread_join_is_named_by_the_scripts_frame() {
    a_standard_library_wait_is_named_by_the_scripts_frame("join", "join", "helper.join()");
}

#[test]
fn a_rank_blocked_in_future_result_is_named_by_the_scripts_frame() {
    a_standard_library_wait_is_named_by_the_scripts_frame("future", "result", "concurrent.futures.Future().result()");
}

/// A wait in the script's own frame (a C call below it): that frame alone, as the line always was.
fn a_wait_in_the_scripts_own_frame_is_named_alone(wait: &str, code: &str) {
    let (line, report) = blocked_in(wait);
    let n = fixture_line("blocked_wait.py", code);
    let culprit = format!("main thread in blocked_wait.py:{n} {wait} ({code}); the other rank waits in {wait} (blocked_wait.py:{n}) since ");
    assert!(line.starts_with("hang: rank 1 (node ") && line.contains(&culprit), "{line}");
    assert!(!line.contains('→'), "{line}");
    for r in report[0]["ranks"].as_array().expect("ranks") {
        assert_eq!(r["frames"][0]["function"], wait, "{report}");
        assert!(r.get("own_frame").is_none(), "{report}");
    }
}

#[test]
fn a_rank_blocked_in_time_sleep_is_named_by_its_own_frame_alone() {
    a_wait_in_the_scripts_own_frame_is_named_alone("sleep", "time.sleep(3600)");
}

#[test]
fn a_rank_blocked_in_os_read_is_named_by_its_own_frame_alone() {
    a_wait_in_the_scripts_own_frame_is_named_alone("read", "os.read(r, 1)");
}
