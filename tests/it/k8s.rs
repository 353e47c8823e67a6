//! The Kubernetes rendezvous with real agents, real torch workers and a real kube-apiserver on loopback (in
//! front of its own etcd): a DDP job trains and resumes, no pod is special, the control plane's restart restarts nothing, a service account
//! without the Role fails at once, two jobs share a namespace without seeing each other, a finished job
//! leaves no object behind but its lemon memory, and `muster status --forget` deletes a dead job's.

use crate::common;

use std::path::Path;

use common::apiserver::{KubeServer, User};
use common::cluster::*;
use common::*;

/// Agents of one job on the API server, signed in as `user` with its kubeconfig.
struct Job {
    dir: tempfile::TempDir,
    kubeconfig: String,
    run_id: String,
}

impl Job {
    fn new(server: &KubeServer, user: User, run_id: &str) -> Job {
        let kubeconfig = server.kubeconfig(user).display().to_string();
        Job { dir: tempfile::tempdir().unwrap(), kubeconfig, run_id: format!("{run_id}{}", std::process::id()) }
    }

    /// An agent of two workers on the API server, short keep-alive windows.
    fn args(&self, nnodes: &str) -> AgentArgs {
        AgentArgs::rdzv("k8s", nnodes, &self.kubeconfig)
            .nproc(2)
            .run_id(&self.run_id)
            .conf("keep_alive_interval=1,keep_alive_max_attempt=3,last_call_timeout=3")
    }

    /// An agent running the test worker (tests/fixtures/elastic_worker.py), which records its starts.
    fn agent(&self, node: &str, nnodes: &str) -> Agent {
        self.agent_with_env(node, nnodes, &[])
    }

    fn agent_with_env(&self, node: &str, nnodes: &str, envs: &[(&str, String)]) -> Agent {
        let args = self
            .args(nnodes)
            .opts(["--max-restarts=0", "--shutdown-timeout=5"])
            .script(fixture("elastic_worker.py"))
            .arg(self.path())
            .build();
        Agent::start_with_env(node, &args, envs)
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn finish(&self) {
        std::fs::write(self.path().join("finish"), "").unwrap();
    }
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Two agents × two workers; b is SIGKILLed: a re-forms alone without spending a restart once b's heartbeats
/// stop, and a new agent c joining scales the group back to four, again without a restart.
#[test]
fn an_agent_killed_the_other_reforms_and_a_new_one_joins_without_a_restart() {
    let server = KubeServer::start();
    let job = Job::new(&server, User::Agent, "k8skill");
    let (a, b) = (job.agent("a", "1:2"), job.agent("b", "1:2"));
    let four = wait_world(job.path(), 4, 4);
    let lost: Vec<i32> = four.iter().filter(|s| s.node == "b").map(|s| s.pid).collect();
    b.kill9();
    let alone: Vec<Start> = wait_world(job.path(), 2, 2);
    assert!(alone.iter().all(|s| s.node == "a" && s.restart_count == 0), "{alone:?}\n{}", a.log());
    assert!(lost.iter().all(|p| !alive(*p)), "the killed agent's workers outlived it");
    let mut agents = vec![a, job.agent("c", "1:2")];
    let joined = || starts(job.path()).iter().filter(|s| s.node == "c").count() == 2;
    assert!(eventually(LONG, joined), "c never started its workers: {}", agents[1].log());
    let again: Vec<Start> = starts(job.path()).into_iter().filter(|s| s.world_size == 4).skip(4).collect();
    assert!(again.iter().all(|s| s.restart_count == 0), "a membership change spent a restart: {again:?}");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
    // The job's objects went with it, but the incidents of the node killed (its lemon memory).
    let left = server.keys();
    let prefix = format!("muster/{}/", job.run_id);
    assert!(left.iter().all(|k| k.starts_with(&format!("{prefix}culprits/"))), "left behind: {left:?}");
}

/// A DDP job as users write one (examples/train.py: DistributedDataParallel, checkpoints) on the API
/// server: 2 agents × 2 workers train; a worker's crash on b spends b's one restart, and the four ranks
/// resume from the checkpoint.
#[test]
fn a_ddp_job_trains_and_resumes_from_its_checkpoint_after_a_crash() {
    let server = KubeServer::start();
    let job = Job::new(&server, User::Agent, "k8sddp");
    let (result, ckpt) = (job.path().join("result.json"), job.path().join("ckpt"));
    let agent = |node: &str| {
        let train = ["--crash-at-step", "12", "--crash-rank", "3", "--ckpt-every", "5"];
        let args = job.args("2").ranked(node).opt("--max-restarts=1").script(example("train.py"));
        let args = args.arg("--result").arg(&result).arg("--ckpt-dir").arg(&ckpt).args(train).build();
        Agent::start(node, &args)
    };
    let mut agents = [agent("a"), agent("b")];
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
    let logs = format!("--- a:\n{}\n--- b:\n{}", agents[0].log(), agents[1].log());
    let text = std::fs::read_to_string(&result).unwrap_or_else(|e| panic!("no result ({e})\n{logs}"));
    let r: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!((r["steps"].as_i64(), r["world_size"].as_i64()), (Some(40), Some(4)), "{r}\n{logs}");
    assert_eq!(r["resumed_from"], 10, "{r}\n{logs}");
    assert!(r["final_loss"].as_f64().is_some_and(f64::is_finite), "{r}");
    // a's workers may see the crash in gloo before a sees b's round: then a spends its restart too.
    let b = agents[1].log();
    assert_eq!(count(&b, "failed (exitcode: 1) local_rank: 1"), 1, "{logs}");
    assert_eq!(count(&b, "recovered from worker failure"), 1, "{logs}");
}

/// The API server SIGKILLed and started again mid-training: the workers keep running (no worker starts
/// again), each agent says the outage at most once, and the job finishes.
#[test]
fn the_api_server_restarted_mid_training_restarts_nothing() {
    let server = KubeServer::start();
    let job = Job::new(&server, User::Agent, "k8srestart");
    let mut agents = vec![job.agent("a", "2"), job.agent("b", "2")];
    let world = wait_world(job.path(), 4, 4);
    server.restart();
    // Heartbeats go through the restarted server again before anything ends.
    let beats_again = || agents.iter().all(|a| count(&a.log(), "answers again") >= count(&a.log(), "does not answer"));
    assert!(eventually(LONG, beats_again), "{}", agents[0].log());
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
        let log = a.log();
        assert_eq!(count(&log, "re-forming"), 0, "{log}");
        assert!(count(&log, "does not answer") <= 1, "the outage is said once: {log}");
    }
    assert_eq!(starts(job.path()).len(), world.len(), "a worker started again: {:?}", starts(job.path()));
}

/// A service account the Role was not bound to: one line naming the verb, the resource and the namespace,
/// exit 2, no worker started.
#[test]
fn a_service_account_without_the_role_fails_at_start_with_one_line() {
    let server = KubeServer::start();
    let job = Job::new(&server, User::Nobody, "k8sdenied");
    let mut agent = job.agent("a", "1");
    assert_eq!(agent.exit_code(LONG), Some(2), "{}", agent.log());
    let log = agent.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("muster: error:")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("leases.coordination.k8s.io") && errors[0].contains("namespace default"), "{log}");
    assert!(starts(job.path()).is_empty(), "a worker started: {log}");
}

/// A second job (another id) in the same namespace runs beside the first: neither sees the other's members,
/// and the first's workers neither restart nor change world.
#[test]
fn a_second_job_in_the_namespace_does_not_disturb_the_first() {
    let server = KubeServer::start();
    let first = Job::new(&server, User::Agent, "k8sfirst");
    let mut agents = vec![first.agent("a", "2"), first.agent("b", "2")];
    let world = wait_world(first.path(), 4, 4);
    // `muster status` reads the job from the API server as from any store.
    let status = run(
        muster().args(["status", "--rdzv-backend", "k8s", "--rdzv-endpoint", &first.kubeconfig, "--rdzv-id", &first.run_id])
            .args(["--format", "json"]),
        LONG,
    );
    let shown: serde_json::Value = serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", status.stdout, status.stderr));
    let members = shown["nodes"].as_array().map_or(0, |n| n.iter().filter(|r| !r["group_rank"].is_null()).count());
    assert_eq!(members, 2, "{shown}");
    let second = Job::new(&server, User::Agent, "k8ssecond");
    let mut other = second.agent("c", "1");
    wait_world(second.path(), 2, 2);
    second.finish();
    assert_eq!(other.exit_code(LONG), Some(0), "{}", other.log());
    first.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
    assert_eq!(starts(first.path()), world, "the first job's workers started again");
}

/// Agents in pods a Job made (`POD_NAME`): every Lease of theirs left when they are SIGKILLed is the Job's
/// (the cluster's garbage collector would delete it with the Job) but the lemon memory. `muster status
/// --forget`: refused in one line (exit 2) while the job's agents beat, nothing deleted; once they are all
/// SIGKILLed (no last agent to clean up) and their heartbeats are stale, it deletes the job's Leases, and
/// the job is gone.
#[test]
fn status_forget_deletes_a_dead_jobs_leases_and_refuses_a_running_one() {
    let server = KubeServer::start();
    server.create(&fixture("job-pods.yaml"));
    let job = Job::new(&server, User::Agent, "k8sforget");
    let in_pod = |pod: &str| [("POD_NAME", pod.to_string())];
    let agents = vec![job.agent_with_env("a", "2", &in_pod("trainer-a")), job.agent_with_env("b", "2", &in_pod("trainer-b"))];
    wait_world(job.path(), 4, 4);
    let status = |forget: bool| {
        let mut cmd = muster();
        cmd.args(["status", "--rdzv-backend", "k8s", "--rdzv-endpoint", &job.kubeconfig, "--rdzv-id", &job.run_id]);
        if forget {
            cmd.arg("--forget");
        }
        run(&mut cmd, LONG)
    };
    let refused = status(true);
    assert_eq!(refused.status.code(), Some(2), "{}{}", refused.stdout, refused.stderr);
    let lines: Vec<&str> = refused.stderr.lines().collect();
    assert!(lines.len() == 1 && lines[0].contains("is running") && lines[0].contains("--forget"), "{}", refused.stderr);
    let before = server.keys();
    assert!(before.iter().any(|k| k.ends_with("/fingerprint")), "{before:?}");
    for a in &agents {
        a.kill9();
    }
    let owners = server.owners();
    let culprits = format!("muster/{}/culprits/", job.run_id);
    let unowned: Vec<&(String, String)> = owners.iter().filter(|(k, o)| !k.starts_with(&culprits) && o != "Job/trainer" && !o.starts_with("Lease/")).collect();
    assert!(unowned.is_empty(), "not the Job's: {unowned:?}");
    assert!(owners.iter().any(|(k, o)| k.ends_with("/fingerprint") && o == "Job/trainer"), "{owners:?}");
    let mut forgotten = None;
    assert!(eventually(LONG, || {
        let out = status(true);
        let done = out.status.success();
        forgotten = Some(out);
        done
    }), "{:?}", forgotten.map(|o| o.stderr));
    let out = forgotten.expect("an answer");
    assert!(out.stdout.starts_with(&format!("forgot job {}: ", job.run_id)), "{}", out.stdout);
    assert_eq!(server.keys(), Vec::<String>::new(), "no Lease of the job is left");
    let gone = status(false);
    assert_eq!(gone.status.code(), Some(1), "{}", gone.stderr);
    assert!(gone.stderr.contains(&format!("no job '{}'", job.run_id)), "{}", gone.stderr);
}
