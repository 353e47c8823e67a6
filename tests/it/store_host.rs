//! A c10d job whose agents end one way or another, above all the agent that hosts the rendezvous store:
//! every other agent learns it at once and ends with the documented code and line (a closed job, a host
//! stopped by a signal: that signal's code), ends because the store went with its host (exit 3), or
//! re-forms without the node. Three agents
//! (`--nnodes 2:3`, one light worker each, `a` hosts the store); each way to end is played on the host and
//! on a member. Each test plays its scenario `MUSTER_STORE_HOST_RUNS` times (default 1;
//! `scripts/stress/store-host.sh`) and prints one `STOREHOST |` row with the time from the ending to the
//! last member's exit (or to the re-formed group).

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::gpus::FakeNode;
use common::repeat::play;
use common::*;

const NODES: [&str; 3] = ["a", "b", "c"];
const HOST: usize = 0;
const MEMBER: usize = 1;

/// How a node's agent ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Every worker exits 0.
    Success,
    /// Its worker fails with no restart allowed (`--max-restarts 0`).
    Failure,
    /// Its worker fails a second time with `--max-restarts 1`.
    RestartsSpent,
    /// Its worker fails a second time with `--job-max-restarts 1`: the job's budget is spent.
    BudgetSpent,
    /// XID 79 on its GPU: it drains (exit 75).
    Drain,
    /// SIGTERM to its agent.
    Signal,
    /// SIGKILL to its agent.
    Killed,
}

impl Ending {
    fn options(self) -> &'static [&'static str] {
        match self {
            Ending::Failure => &["--max-restarts=0"],
            Ending::RestartsSpent => &["--max-restarts=1"],
            Ending::BudgetSpent => &["--max-restarts=3", "--job-max-restarts=1"],
            _ => &["--max-restarts=3"],
        }
    }
}

/// What the agents end with: the ended node's code, the others' code and a line every other agent logs
/// (`None`: the others re-form without the node and finish the job with 0).
struct Expected {
    own: Option<i32>,
    others: Option<(i32, &'static str)>,
}

fn expected(ending: Ending, on: usize) -> Expected {
    let host_ended = "the rendezvous store's host ended: node";
    let failed = "the job failed on another node and is closed for good: node";
    let stopped = "the job was stopped: node";
    let own = match ending {
        Ending::Success => Some(0),
        Ending::Failure | Ending::RestartsSpent => Some(1),
        Ending::BudgetSpent => Some(5),
        Ending::Drain => Some(75),
        Ending::Signal => Some(143),
        Ending::Killed => None,
    };
    let others = match (ending, on) {
        (Ending::Success, _) => Some((0, "")),
        (Ending::Failure | Ending::RestartsSpent, _) => Some((4, failed)),
        (Ending::BudgetSpent, _) => Some((5, "over its budget (--job-max-restarts 1)")),
        (Ending::Signal, HOST) => Some((143, stopped)),
        (Ending::Drain | Ending::Killed, HOST) => Some((3, host_ended)),
        (Ending::Drain | Ending::Signal | Ending::Killed, _) => None,
    };
    Expected { own, others }
}

struct Job {
    dir: tempfile::TempDir,
    gpus: Vec<FakeNode>,
    agents: Vec<Agent>,
}

/// A run that failed shows what every agent said.
impl Drop for Job {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (name, agent) in NODES.iter().zip(&self.agents) {
                eprintln!("--- agent {name}:\n{}", agent.log());
            }
        }
    }
}

impl Job {
    /// Three agents, `a` hosting the store, each with one fake GPU and one worker, training.
    fn start(ending: Ending) -> Job {
        let dir = tempfile::tempdir().expect("tempdir");
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let run_id = format!("sh{}x{run}", std::process::id());
        let gpus: Vec<FakeNode> = NODES.iter().map(|name| FakeNode::new(dir.path(), name, 1, &[])).collect();
        let mut job = Job { dir, gpus, agents: Vec::new() };
        let mut port = 0;
        for (i, name) in NODES.iter().enumerate() {
            let conf = if i == HOST { "is_host=1,last_call_timeout=1" } else { "last_call_timeout=1" };
            let hook = format!("touch {}/hook-{name}", job.path().display());
            let args = AgentArgs::c10d("2:3", format!("127.0.0.1:{port}"))
                .nproc(1)
                .conf(conf)
                .run_id(&run_id)
                .opts(["--shutdown-timeout=5", "--on-node-fault", &hook])
                .opts(ending.options())
                .script(fixture("incident_worker.py"))
                .arg(job.path())
                .build();
            let agent = Agent::start_with_env(name, &args, &job.gpus[i].env());
            if i == HOST {
                port = agent.hosted_port();
            }
            job.agents.push(agent);
        }
        wait_world(job.path(), 3, 3);
        job
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.path().join(name), "").expect("write a control file");
    }

    /// Ends node `on` as `ending` says; returns when the ending was set off.
    fn end(&mut self, ending: Ending, on: usize) -> Instant {
        let crash = format!("crash-{}", NODES[on]);
        if matches!(ending, Ending::RestartsSpent | Ending::BudgetSpent) {
            // The first failure spends the one restart allowed: the group re-forms (a second world of 3) first.
            self.touch(&crash);
            wait_world(self.path(), 3, 6);
        }
        let at = Instant::now();
        match ending {
            Ending::Success => self.touch("finish"),
            Ending::Failure | Ending::RestartsSpent | Ending::BudgetSpent => self.touch(&crash),
            Ending::Drain => self.gpus[on].inject(0, "xid 0 79"),
            // SAFETY: plain kill(2) of an agent this test started.
            Ending::Signal => drop(unsafe { libc::kill(self.agents[on].guard.pid(), libc::SIGTERM) }),
            Ending::Killed => self.agents[on].kill9(),
        };
        at
    }
}

/// One run: ends node `on`, checks every agent's code and line, that no worker started after the ending
/// of a closed job and that none outlives its agent; returns the time from the ending to the last
/// member's exit (or to the group re-formed without the node).
fn scenario(ending: Ending, on: usize) -> Duration {
    let mut job = Job::start(ending);
    let at = job.end(ending, on);
    let started = starts(job.path()).len();
    let want = expected(ending, on);
    let own = job.agents[on].exit_code(LONG);
    assert_eq!(own, want.own, "{} ended as {ending:?}: {}", NODES[on], job.agents[on].log());
    let took = match want.others {
        Some((code, line)) => {
            for i in (0..NODES.len()).filter(|i| *i != on) {
                let agent = &mut job.agents[i];
                assert_eq!(agent.exit_code(LONG), Some(code), "{} after {ending:?} on {}: {}", NODES[i], NODES[on], agent.log());
                assert!(agent.log().contains(line), "{} does not say '{line}': {}", NODES[i], agent.log());
            }
            let took = at.elapsed();
            assert_eq!(starts(job.path()).len(), started, "a worker started after the job ended: {:?}", starts(job.path()));
            took
        }
        None => {
            wait_world(job.path(), 2, 2);
            let took = at.elapsed();
            job.touch("finish");
            for i in (0..NODES.len()).filter(|i| *i != on) {
                let agent = &mut job.agents[i];
                assert_eq!(agent.exit_code(LONG), Some(0), "{} after {ending:?} on {}: {}", NODES[i], NODES[on], agent.log());
            }
            took
        }
    };
    let pids: Vec<i32> = starts(job.path()).iter().map(|s| s.pid).collect();
    assert!(eventually(Duration::from_secs(5), || pids.iter().all(|p| !alive(*p))), "workers outlive their agents: {pids:?}");
    took
}

fn play_ending(ending: Ending, on: usize) {
    let want = expected(ending, on);
    // A node killed by a signal has no exit code.
    let own = want.own.map_or_else(|| "killed".to_string(), |c| format!("exits {c}"));
    let documented = match want.others {
        Some((code, _)) => format!("{} {own}, the others {code}", NODES[on]),
        None => format!("{} {own}, the others re-form", NODES[on]),
    };
    let name = format!("{ending:?} on the {}", if on == HOST { "host" } else { "member" });
    play("STOREHOST", "MUSTER_STORE_HOST_RUNS", &name, &documented, || scenario(ending, on));
}

#[test]
fn a_job_that_succeeds_ends_every_agent_with_0() {
    play_ending(Ending::Success, HOST);
}

#[test]
fn a_host_that_fails_for_good_keeps_serving_until_every_member_read_why() {
    play_ending(Ending::Failure, HOST);
}

#[test]
fn a_host_out_of_restarts_ends_every_member_with_4_and_its_line() {
    play_ending(Ending::RestartsSpent, HOST);
}

#[test]
fn a_host_that_spends_the_job_budget_ends_every_agent_with_5_and_one_line() {
    play_ending(Ending::BudgetSpent, HOST);
}

#[test]
fn a_draining_host_ends_every_member_with_3_saying_the_store_host_ended() {
    play_ending(Ending::Drain, HOST);
}

#[test]
fn a_host_stopped_by_a_signal_ends_every_member_with_its_code() {
    play_ending(Ending::Signal, HOST);
}

#[test]
fn a_killed_host_ends_every_member_with_3_at_once_and_leaves_no_orphan() {
    play_ending(Ending::Killed, HOST);
}

#[test]
fn a_member_that_fails_for_good_ends_every_agent_with_its_line() {
    play_ending(Ending::Failure, MEMBER);
}

#[test]
fn a_member_out_of_restarts_ends_every_agent_with_4() {
    play_ending(Ending::RestartsSpent, MEMBER);
}

#[test]
fn a_member_that_spends_the_job_budget_ends_every_agent_with_5() {
    play_ending(Ending::BudgetSpent, MEMBER);
}

#[test]
fn a_draining_member_leaves_and_the_others_reform() {
    play_ending(Ending::Drain, MEMBER);
}

#[test]
fn a_member_stopped_by_a_signal_leaves_and_the_others_reform() {
    play_ending(Ending::Signal, MEMBER);
}

#[test]
fn a_killed_member_is_lost_and_the_others_reform() {
    play_ending(Ending::Killed, MEMBER);
}

/// An external `muster store` that ends: the training nodes are healthy, so their workers keep training and
/// each agent says so once; the first re-formation (a worker crash) ends its agent with 3 after one liveness
/// window (W = 3 s here), not after read_timeout (60 s); an agent that needs no re-formation finishes.
#[test]
fn an_external_store_that_ends_leaves_the_workers_training_until_a_reformation_needs_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = muster();
    cmd.args(["store", "--host", "127.0.0.1", "--port", "0"]).stdout(std::process::Stdio::piped());
    let mut store = Guard::spawn(cmd.stderr(std::process::Stdio::null()));
    let stdout = lines_of(store.0.stdout.take().expect("stdout"));
    let listening = stdout.recv_timeout(LONG).expect("muster store says where it listens");
    let endpoint = listening.rsplit(' ').next().expect("an address").to_string();
    let args = AgentArgs::c10d("2", &endpoint)
        .nproc(1)
        .conf("is_host=0,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3")
        .run_id(format!("ext{}", std::process::id()))
        .opts(["--shutdown-timeout=5", "--max-restarts=3"])
        .script(fixture("incident_worker.py"))
        .arg(dir.path())
        .build();
    let mut agents: Vec<Agent> = ["b", "c"].iter().map(|n| Agent::start(n, &args)).collect();
    let world = wait_world(dir.path(), 2, 2);
    // SAFETY: plain kill(2) of a process this test started.
    unsafe { libc::kill(store.pid(), libc::SIGKILL) };
    let said = "refuses connections: its process ended; the workers keep training";
    assert!(eventually(LONG, || agents.iter().all(|a| a.log().contains(said))), "not said: {}", agents[0].log());
    assert!(world.iter().all(|s| alive(s.pid)), "a worker was stopped although training needs no store");
    std::fs::write(dir.path().join("crash-b"), "").expect("crash b's worker");
    let b = &mut agents[0];
    assert_eq!(b.exit_code(LONG), Some(3), "{}", b.log());
    assert!(b.log().contains("has refused connections for 3s (its process ended) and this node needs it to re-form"), "{}", b.log());
    assert_eq!(b.log().matches(said).count(), 1, "said more than once: {}", b.log());
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    let c = &mut agents[1];
    assert_eq!(c.exit_code(LONG), Some(0), "{}", c.log());
    assert_eq!(starts(dir.path()).len(), 2, "a worker started without the store: {:?}", starts(dir.path()));
}
