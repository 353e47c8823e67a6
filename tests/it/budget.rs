//! The job-wide restart budget (`--job-max-restarts N[/WINDOW]`): restarts counted in the rendezvous store
//! over every node, a replaced one too, ending every agent with exit code 5 once the job is over it. Two
//! agents of two incident workers each (no torch: a crash is one worker's exit 1, no collective to break).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;

/// The documented exit code of a job over its restart budget.
const OVER_BUDGET: i32 = 5;

struct Job {
    dir: tempfile::TempDir,
    run_id: String,
    port: u16,
    budget: &'static str,
}

impl Job {
    fn new(budget: &'static str) -> Job {
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = tempfile::tempdir().expect("tempdir");
        Job { dir, run_id: format!("budget{}x{run}", std::process::id()), port: 0, budget }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Node `name` (`a` hosts the store) with ten restarts of its own: only the job's budget can end it.
    fn agent(&mut self, name: &str) -> Agent {
        let conf = if name == "a" { "is_host=1,last_call_timeout=1" } else { "last_call_timeout=1" };
        let args = AgentArgs::c10d("2:2", format!("127.0.0.1:{}", self.port))
            .nproc(2)
            .conf(conf)
            .run_id(&self.run_id)
            .opts(["--max-restarts=10", &format!("--job-max-restarts={}", self.budget)])
            .script(fixture("incident_worker.py"))
            .arg(self.path())
            .build();
        let agent = Agent::start(name, &args);
        if name == "a" {
            self.port = agent.hosted_port();
        }
        agent
    }

    /// Node `name`'s local rank 0 exits 1 once; returns once `ready` workers in all have started since the
    /// job began (each round of this job is a world of 4).
    fn crash(&self, name: &str, ready: usize) {
        std::fs::write(self.path().join(format!("crash-{name}")), "").expect("write crash");
        wait_world(self.path(), 4, ready);
    }

    fn status(&self) -> String {
        let endpoint = format!("127.0.0.1:{}", self.port);
        let out = run(muster().args(["status", "--rdzv-endpoint", &endpoint, "--rdzv-id", &self.run_id]), LONG);
        assert_eq!(out.status.code(), Some(0), "muster status: {}", out.stderr);
        out.stdout
    }
}

/// Ends with the budget's code and says its line once.
fn expect_over_budget(name: &str, agent: &mut Agent, line: &str) {
    let code = agent.exit_code(LONG);
    let log = agent.log();
    assert_eq!(code, Some(OVER_BUDGET), "{name} did not end over the budget:\n{log}");
    // What it says beyond its INFO lines.
    let said: Vec<&str> = log.lines().filter(|l| l.contains("over its budget") && !l.contains(" INFO ")).collect();
    assert_eq!(said.len(), 1, "{name} says it once: {said:?}\n{log}");
    assert!(said[0].contains(line) && said[0].contains("do not requeue"), "{name}: {}", said[0]);
    let reforming = log.lines().find(|l| l.contains("Closed") && l.contains("re-forming"));
    assert_eq!(reforming, None, "{name}: a closed job is not re-formed");
}

/// A budget of 2: a crash on a, a crash on b, b SIGKILLed and replaced by a fresh agent (its own count
/// 0), then a crash on the replacement: the third restart of the job ends it on every node with code 5.
#[test]
fn a_job_budget_of_2_ends_every_node_at_the_third_restart_across_a_replaced_node() {
    let mut job = Job::new("2");
    let mut a = job.agent("a");
    let mut b = job.agent("b");
    wait_world(job.path(), 4, 4);
    job.crash("a", 8);
    job.crash("b", 12);
    assert!(job.status().contains("job restarts: 2 in all, 2 counting against --job-max-restarts 2: 0 left"), "{}", job.status());
    b.kill9();
    assert_eq!(b.exit_code(LONG), None, "b was SIGKILLed");
    let mut b2 = job.agent("b2");
    wait_world(job.path(), 4, 16);
    let replaced: Vec<Start> = starts(job.path()).into_iter().filter(|s| s.node == "b2").collect();
    assert!(replaced.iter().all(|s| s.restart_count == 0), "the replacement starts with its own count at 0: {replaced:?}");
    std::fs::write(job.path().join("crash-b2"), "").expect("write crash");
    let line = "the job restarted 3 times, over its budget (--job-max-restarts 2)";
    expect_over_budget("b2", &mut b2, line);
    expect_over_budget("a", &mut a, line);
    assert_eq!(starts(job.path()).len(), 16, "no worker started after the budget was spent");
    let workers = starts(job.path());
    assert!(eventually(LONG, || workers.iter().all(|s| !alive(s.pid))), "a worker outlived its agent: {workers:?}");
}

/// A budget of 2 within 10 s: a restart, another 6 s later, and a third once the first is over 10 s old:
/// two count, so the job goes on. A fourth at once is the third within 10 s: the job ends.
#[test]
fn a_window_lets_a_restart_after_it_pass_and_counts_the_recent_ones() {
    let mut job = Job::new("2/10s");
    let mut a = job.agent("a");
    let mut b = job.agent("b");
    wait_world(job.path(), 4, 4);
    job.crash("a", 8);
    // The first restart was recorded before its workers started, so at most now; the second after the
    // 6 s wait. The waits themselves are the scenario: a window is a length of time.
    let first = Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    job.crash("b", 12);
    std::thread::sleep((first + Duration::from_secs(11)).saturating_duration_since(Instant::now()));
    job.crash("a", 16);
    let status = job.status();
    assert!(
        status.contains("job restarts: 2 in all, 2 counting against --job-max-restarts 2/10s: 0 left"),
        "the first restart aged out and was deleted: {status}"
    );
    std::fs::write(job.path().join("crash-b"), "").expect("write crash");
    let line = "the job restarted 3 times within 10s, over its budget (--job-max-restarts 2/10s)";
    expect_over_budget("b", &mut b, line);
    expect_over_budget("a", &mut a, line);
}
