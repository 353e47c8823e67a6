//! Attacks on a running job from the cluster network, as issue 11 found them: a plain torch `TCPStore`
//! client (what anyone who can reach the rendezvous port can run, `tests/fixtures/store_attacker.py`) tries
//! to close the job, evict a node, churn the rounds, corrupt the seal and the assignments and read what the
//! job is; an agent with a wrong job token tries to join. Each attempt fails on the attacker's side, and the
//! job, two agents training `examples/train.py` over gloo through `init_process_group("env://")`, trains to
//! its last step with no restart spent. What is and is not protected: docs/security.md.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::{Agent, AgentArgs, LONG};
use common::*;
use muster::store::remote::RemoteStore;
use muster::store::{Store, StoreError};

const TOKEN: &str = "the-job-token-of-the-attacks-test";

/// What the host agent logs for each connection its store closed for naming muster's keys.
const REFUSAL: &str = "names muster's rendezvous keys, which only the job's agents may use";

/// A two-agent c10d job, one worker each, training `examples/train.py`; the workers wait before their last
/// step while the hold file exists, so the test attacks a job that is certainly still running.
struct Job {
    dir: tempfile::TempDir,
    run_id: String,
    token: Option<&'static str>,
}

impl Job {
    fn new(token: Option<&'static str>) -> Job {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hold"), "").unwrap();
        Job { dir, run_id: format!("attacks{}", std::process::id()), token }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn args(&self, endpoint: &str, conf: &str) -> Vec<String> {
        let mut args = AgentArgs::c10d(2, endpoint)
            .nproc(1)
            .conf(conf)
            .run_id(&self.run_id)
            .opts(["--local-addr=127.0.0.1", "--max-restarts=3", "--shutdown-timeout=5"])
            .script(example("train.py"));
        for (flag, file) in [("--result", "result.json"), ("--ckpt-dir", "ckpt"), ("--hold-file", "hold")] {
            args = args.arg(flag).arg(self.path(file));
        }
        args.build()
    }

    fn agent(&self, node: &str, endpoint: &str, conf: &str, token: Option<&str>) -> Agent {
        let envs: Vec<(&str, String)> = token.map(|t| ("MUSTER_RDZV_TOKEN", t.to_string())).into_iter().collect();
        Agent::start_with_env(node, &self.args(endpoint, conf), &envs)
    }

    /// The host agent (port 0: the OS picks) and the second agent, once both workers are training.
    fn start(&self) -> (Agent, Agent, u16) {
        let host = self.agent("a", "127.0.0.1:0", "is_host=1", self.token);
        let port = host.hosted_port();
        let other = self.agent("b", &format!("127.0.0.1:{port}"), "read_timeout=60", self.token);
        // Rank 0 checkpoints every 5 steps: the first checkpoint says the gloo job is training.
        let training = eventually(LONG, || self.path("ckpt/checkpoint.pt").exists());
        assert!(training, "the job did not start training: {}\n{}", host.log(), other.log());
        (host, other, port)
    }

    /// Lets the workers take their last step, then checks both agents succeeded and the job trained to its
    /// end in its first start: no restart counted and none resumed from a checkpoint.
    fn finish(&self, mut agents: [Agent; 2]) {
        std::fs::remove_file(self.path("hold")).unwrap();
        for a in &mut agents {
            assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
        }
        let text = std::fs::read_to_string(self.path("result.json")).expect("rank 0 writes its result");
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!((&r["steps"], &r["world_size"]), (&40.into(), &2.into()), "{r}");
        assert_eq!(r["restart_count"], 0, "a restart was spent: {r}");
        assert_eq!(r["resumed_from"], serde_json::Value::Null, "the workers were restarted: {r}");
    }
}

/// An agent's node id in the rendezvous (`<--local-addr>_<pid>_0`), as its `alive/` key names it.
fn node_id(agent: &Agent) -> String {
    format!("127.0.0.1_{}_0", agent.guard.pid())
}

/// Runs the attacker against `port` for the keys of `run_id` and of `nodes`; returns its JSON lines.
fn attack(port: u16, run_id: &str, nodes: &[String]) -> Vec<serde_json::Value> {
    let mut cmd = Command::new(python());
    cmd.arg(fixture("store_attacker.py")).arg(port.to_string()).arg(run_id).args(nodes);
    let out = run(cmd.env("TORCH_CPP_LOG_LEVEL", "ERROR"), LONG);
    assert!(out.status.success(), "the attacker itself failed: {}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// Every attack was refused on the attacker's side; torch's own key space still serves it; listing shows
/// none of the job's keys, its run id or its script. Returns how many attacks were made.
fn assert_all_refused(report: &[serde_json::Value], run_id: &str) -> usize {
    let attacks: Vec<&serde_json::Value> = report.iter().filter(|r| r.get("attack").is_some()).collect();
    for kind in ["close", "evict", "churn", "garbage", "read"] {
        assert!(attacks.iter().any(|a| a["attack"] == kind), "no {kind} attack was made: {report:?}");
    }
    for a in &attacks {
        assert_eq!(a["refused"], true, "the store served an attack: {a}");
    }
    let plain = report.iter().find_map(|r| r.get("plain")).expect("the plain key's line");
    assert_eq!(plain, "served", "torch's own key space is open to any client");
    let listing = report.iter().find(|r| r.get("list_keys").is_some()).expect("the listing's line");
    let keys: Vec<&str> = listing["list_keys"].as_array().unwrap().iter().filter_map(|k| k.as_str()).collect();
    assert_eq!(keys.len(), 1, "only the attacker's own key is listed: {keys:?}");
    assert!(keys[0].ends_with("attacker/plain"), "{keys:?}");
    for secret in ["muster", run_id, "train.py", "hold", "result.json"] {
        assert!(keys.iter().all(|k| !k.contains(secret)), "LIST_KEYS reveals {secret:?}: {keys:?}");
    }
    assert_eq!(listing["num_keys"], 1, "num_keys counts muster's keys: {listing}");
    attacks.len()
}

/// The attacks against a running job, with or without a job token: without one, muster's keys are still
/// the agents' alone (the connections that said HELLO).
fn attacks_leave_the_job_running(token: Option<&'static str>) {
    let job = Job::new(token);
    let (host, other, port) = job.start();
    let report = attack(port, &job.run_id, &[node_id(&host), node_id(&other)]);
    let attacks = assert_all_refused(&report, &job.run_id);
    // The store refused each one (and so acted on none) before the job is let go.
    let refused = eventually(LONG, || host.log().matches(REFUSAL).count() >= attacks);
    assert!(refused, "the host did not log {attacks} refusals: {}", host.log());
    if token.is_some() {
        an_agent_with_a_wrong_token_is_refused_with_one_line(&job, port);
    }
    job.finish([host, other]);
}

/// Exit 2: a wrong token is the user's input, as wrong on every retry as a bad flag, so a wrapper that
/// retries failed agents (exit 1) should not retry it.
fn an_agent_with_a_wrong_token_is_refused_with_one_line(job: &Job, port: u16) {
    let mut intruder = job.agent("c", &format!("127.0.0.1:{port}"), "read_timeout=60", Some("not-the-token"));
    assert_eq!(intruder.exit_code(LONG), Some(2), "{}", intruder.log());
    let log = intruder.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("error") || l.contains(" ERROR ")).collect();
    assert_eq!(errors.len(), 1, "one error line: {log}");
    assert!(errors[0].contains("wrong or missing job token") && errors[0].contains("MUSTER_RDZV_TOKEN"), "{log}");
    assert!(!log.contains("rdzv_store="), "the intruder got as far as its banner: {log}");
}

#[test]
fn a_torch_client_cannot_close_evict_churn_or_corrupt_a_job_without_a_token() {
    attacks_leave_the_job_running(None);
}

#[test]
fn with_a_token_neither_a_torch_client_nor_an_agent_with_a_wrong_token_disturbs_the_job() {
    attacks_leave_the_job_running(Some(TOKEN));
}


/// `muster store` holds a token too (`--token-file`, else `MUSTER_RDZV_TOKEN`): agents without it are
/// refused, torch clients keep torch's key space only, and an empty token file is bad input.
#[test]
fn muster_store_serves_muster_keys_only_to_agents_holding_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let mut cmd = muster();
    cmd.args(["store", "--host", "127.0.0.1", "--port", "0", "--token-file"]).arg(&file);
    let mut store = Guard::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::null()));
    let lines = lines_of(store.0.stdout.take().expect("stdout"));
    let listening = lines.recv_timeout(LONG).expect("the store's listening line");
    let addr: SocketAddr = listening.rsplit(' ').next().and_then(|a| a.parse().ok()).expect(&listening);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let timeout = Duration::from_secs(10);
        match RemoteStore::connect(addr, b"not-the-token", timeout, timeout).await {
            Err(StoreError::WrongToken { .. }) => {}
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("an agent with a wrong token was served"),
        }
        let agent = RemoteStore::connect(addr, TOKEN.as_bytes(), timeout, timeout).await.expect("the right token");
        agent.set("muster/job/fingerprint", b"secret script").await.unwrap();
        assert_eq!(agent.get("muster/job/fingerprint").await.unwrap().as_deref(), Some(&b"secret script"[..]));
    });
    assert_all_refused(&attack(addr.port(), "job", &["node0_1_0".into()]), "job");

    std::fs::write(&file, "\n").unwrap();
    let out = run(muster().args(["store", "--port", "0", "--token-file"]).arg(&file), LONG);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("--token-file") && out.stderr.contains("empty"), "{}", out.stderr);
}
