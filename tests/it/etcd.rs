//! The etcd rendezvous with real agents, real torch workers and a real etcd cluster on loopback: no node is
//! special, training does not depend on etcd while the group is healthy, and bad settings fail at once.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use std::time::Duration;

use common::cluster::*;
use common::etcd::EtcdCluster;
use common::*;

/// Agents of one etcd job; `script` and `script_args` are what every agent runs.
struct Job {
    dir: tempfile::TempDir,
    endpoints: String,
    run_id: String,
}

impl Job {
    fn new(etcd: &EtcdCluster) -> Job {
        Job { dir: tempfile::tempdir().unwrap(), endpoints: etcd.endpoints(), run_id: format!("etcd{}", std::process::id()) }
    }

    fn args(&self, nnodes: &str, conf: &str, script: &Path, script_args: &[String]) -> Vec<String> {
        AgentArgs::rdzv("etcd", nnodes, &self.endpoints)
            .nproc(2)
            .run_id(&self.run_id)
            .conf(format!("keep_alive_interval=1,keep_alive_max_attempt=3,{conf}"))
            .opts(["--max-restarts=0", "--shutdown-timeout=5"])
            .script(script)
            .args(script_args)
            .build()
    }

    /// An agent running the test worker (tests/fixtures/elastic_worker.py), which records its starts.
    fn worker_agent(&self, node: &str, nnodes: &str, conf: &str) -> Agent {
        let out = vec![self.path().display().to_string()];
        Agent::start(node, &self.args(nnodes, conf, &fixture("elastic_worker.py"), &out))
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn finish(&self) {
        std::fs::write(self.path().join("finish"), "").unwrap();
    }
}

/// `wait_world`, showing the agents' logs if the world does not come.
fn world_of(job: &Job, world: u32, count: usize, agents: &[&Agent]) -> Vec<Start> {
    let ready = || starts(job.path()).iter().filter(|s| s.world_size == world).count() >= count;
    if !eventually(LONG, ready) {
        let logs: Vec<String> = agents.iter().map(|a| a.log()).collect();
        panic!("no world of {world} with {count} workers; starts {:?}; logs:\n{}", starts(job.path()), logs.join("\n---\n"));
    }
    wait_world(job.path(), world, count)
}

/// What the agent said beyond its INFO lines.
fn said(log: &str) -> Vec<&str> {
    log.lines().filter(|l| !l.trim().is_empty() && !l.contains(" INFO ")).collect()
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Three agents × two workers train examples/train.py; the etcd leader is killed mid-run: every request
/// fails over to a survivor and the job finishes in its first round, no worker restarted.
#[test]
fn the_etcd_leader_killed_mid_run_the_job_finishes_without_a_restart() {
    let etcd = EtcdCluster::start(3, false);
    let job = Job::new(&etcd);
    let hold = job.path().join("hold");
    std::fs::write(&hold, "").unwrap();
    let ckpt = job.path().join("ckpt");
    let result = job.path().join("result.json");
    let train_args = |r: &PathBuf| {
        vec![
            "--steps=20".into(),
            "--ckpt-every=5".into(),
            format!("--ckpt-dir={}", ckpt.display()),
            format!("--hold-file={}", hold.display()),
            format!("--result={}", r.display()),
        ]
    };
    let args = job.args("3", "last_call_timeout=5", &example("train.py"), &train_args(&result));
    let mut agents: Vec<Agent> = ["a", "b", "c"].iter().map(|n| Agent::start(n, &args)).collect();
    // Mid-run: rank 0 has checkpointed, and every worker waits at the last step while `hold` exists.
    assert!(eventually(LONG, || ckpt.join("checkpoint.pt").exists()), "{}", agents[0].log());
    let leader = etcd.wait_leader(Duration::from_secs(10));
    etcd.kill(&leader);
    let new_leader = etcd.wait_leader(Duration::from_secs(30));
    assert_ne!(new_leader, leader);
    // A write through the survivors is what the agents need next: the exit barrier and the close.
    std::fs::remove_file(&hold).unwrap();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
        assert_eq!(count(&a.log(), "re-forming"), 0, "{}", a.log());
    }
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!((r["world_size"].as_i64(), r["restart_count"].as_i64(), r["steps"].as_i64()), (Some(6), Some(0), Some(20)), "{r}");
}

/// The agent that joined first (group rank 0, the store's host under c10d) is killed: the other two re-form
/// without it once its lease ends, spending no restart; a fourth agent joins later and the group scales up.
#[test]
fn the_first_agent_killed_the_others_reform_and_a_fourth_scales_the_group_up() {
    let etcd = EtcdCluster::start(3, false);
    let job = Job::new(&etcd);
    let conf = "last_call_timeout=3";
    let first = job.worker_agent("a", "2:4", conf);
    // Registered in etcd before the others start, so it joins first.
    assert!(eventually(LONG, || first.log().contains("rdzv_backend=etcd")), "{}", first.log());
    let mut others = vec![first, job.worker_agent("b", "2:4", conf), job.worker_agent("c", "2:4", conf)];
    let three = wait_world(job.path(), 6, 6);
    // Group rank 0: the node that serves the workers' store (and would host the rendezvous under c10d).
    let host = three.iter().find(|s| s.group_rank == 0).map(|s| s.node.clone()).expect("a group rank 0");
    let index = ["a", "b", "c"].iter().position(|n| *n == host).expect("a known node");
    let victims: Vec<i32> = three.iter().filter(|s| s.node == host).map(|s| s.pid).collect();
    others.remove(index).kill9();
    let two = world_of(&job, 4, 4, &others.iter().collect::<Vec<_>>());
    assert!(two.iter().all(|s| s.node != host && s.restart_count == 0), "{two:?}");
    assert!(victims.iter().all(|p| !alive(*p)), "the killed agent's workers outlived it");
    others.push(job.worker_agent("d", "2:4", conf));
    let joined = || starts(job.path()).iter().filter(|s| s.node == "d").count() == 2;
    assert!(eventually(LONG, joined), "the fourth agent never started its workers: {}", others[2].log());
    let scaled: Vec<Start> = world_of(&job, 6, 12, &others.iter().collect::<Vec<_>>()).into_iter().skip(6).collect();
    assert!(scaled.iter().filter(|s| s.node == "d").count() == 2, "{scaled:?}");
    assert!(scaled.iter().all(|s| s.restart_count == 0), "a membership change spent a restart: {scaled:?}");
    job.finish();
    for a in &mut others {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

/// Every etcd member stopped for 20 s while the job is healthy: the workers keep running, each agent says
/// the outage once and its end once; a peer killed during the outage is handled when etcd is back.
#[test]
fn an_etcd_outage_leaves_training_running_and_a_peer_lost_meanwhile_is_handled_after() {
    let etcd = EtcdCluster::start(3, false);
    let job = Job::new(&etcd);
    let conf = "last_call_timeout=3";
    let mut agents: Vec<Agent> = ["a", "b", "c"].iter().map(|n| job.worker_agent(n, "2:3", conf)).collect();
    let world = world_of(&job, 6, 6, &agents.iter().collect::<Vec<_>>());
    etcd.stop_all();
    // The outage itself: a length of time is the scenario, not a wait for an event.
    std::thread::sleep(Duration::from_secs(10));
    let victim = agents.remove(2);
    victim.kill9();
    std::thread::sleep(Duration::from_secs(10));
    let survivors: Vec<i32> = world.iter().filter(|s| s.node != "c").map(|s| s.pid).collect();
    let logs = || agents.iter().map(|a| a.log()).collect::<Vec<_>>().join("\n---\n");
    assert!(survivors.iter().all(|p| alive(*p)), "a worker ended during the etcd outage: {world:?}\n{}", logs());
    assert!(agents.iter().all(|a| a.guard.0.id() > 0 && alive(a.guard.pid())));
    etcd.start_all();
    let after = world_of(&job, 4, 4, &agents.iter().collect::<Vec<_>>());
    assert!(after.iter().all(|s| s.node != "c" && s.restart_count == 0), "{after:?}");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
        let log = a.log();
        assert_eq!(count(&log, "etcd does not answer"), 1, "the outage is said once: {log}");
        assert!(count(&log, "etcd answers again") >= 1, "{log}");
        // Until etcd is back: what follows is the re-formation without the lost peer.
        let outage = log.lines().take_while(|l| !l.contains("etcd answers again"));
        // The start's own warnings (threads, a short keep-alive window, one machine's loopback) are not the outage's.
        let at_start = ["OMP_NUM_THREADS", "keep-alive window", "resolves to loopback"];
        let warnings: Vec<&str> =
            outage.filter(|l| l.contains(" WARN ") && !at_start.iter().any(|s| l.contains(s))).collect();
        assert_eq!(warnings.len(), 1, "one warning for the whole outage: {warnings:#?}");
    }
}

/// Every live member SIGSTOPped for 12 s with a 3 s lease TTL: nobody can evict anybody through a frozen
/// etcd, so nobody fences; when it resumes (revoking every lease, or electing with leases renewed) every
/// agent is heard again within a window: no worker is restarted.
#[test]
fn a_frozen_etcd_restarts_no_worker() {
    let etcd = EtcdCluster::start(3, false);
    let job = Job::new(&etcd);
    let mut agents: Vec<Agent> = ["a", "b"].iter().map(|n| job.worker_agent(n, "2", "last_call_timeout=1")).collect();
    let world = world_of(&job, 4, 4, &agents.iter().collect::<Vec<_>>());
    etcd.freeze_all();
    // The freeze itself: a length of time is the scenario.
    std::thread::sleep(Duration::from_secs(12));
    etcd.thaw_all();
    let logs = |agents: &[Agent]| agents.iter().map(|a| a.log()).collect::<Vec<_>>().join("\n---\n");
    let back = eventually(LONG, || agents.iter().all(|a| a.log().contains("etcd answers again")));
    assert!(back, "etcd never answered again: {}", logs(&agents));
    // A peer wrongly judged lost would be re-formed without within a window (3 s) of etcd answering: watch
    // for that for three windows.
    let restarted = || starts(job.path()).len() > world.len() || agents.iter().any(|a| a.log().contains("re-forming"));
    assert!(!eventually(Duration::from_secs(9), restarted), "a worker restarted: {:?}\n{}", starts(job.path()), logs(&agents));
    assert!(world.iter().all(|s| alive(s.pid)), "a worker ended: {world:?}");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
        assert!(!a.log().contains("fenced"), "nobody fences through a frozen store: {}", a.log());
    }
}

/// The etcd leader killed (and brought back) 20 times under 1 s x 3 keep-alive: a heartbeat lost with a
/// dying leader, or waiting on an election, never gets a healthy node evicted. `MUSTER_LEADER_KILLS=N`
/// changes the count.
#[test]
fn the_etcd_leader_killed_20_times_evicts_no_healthy_node() {
    let kills: usize = std::env::var("MUSTER_LEADER_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let etcd = EtcdCluster::start(3, false);
    let job = Job::new(&etcd);
    let mut agents: Vec<Agent> = ["a", "b", "c"].iter().map(|n| job.worker_agent(n, "3", "last_call_timeout=1")).collect();
    let world = world_of(&job, 6, 6, &agents.iter().collect::<Vec<_>>());
    for _ in 0..kills {
        let leader = etcd.wait_leader(LONG);
        etcd.kill(&leader);
        etcd.wait_leader(LONG);
        etcd.start_all();
    }
    let logs = agents.iter().map(|a| a.log()).collect::<Vec<_>>().join("\n---\n");
    assert_eq!(starts(job.path()).len(), world.len(), "a node was evicted and the group re-formed:\n{logs}");
    assert!(world.iter().all(|s| alive(s.pid)), "a worker ended: {world:?}\n{logs}");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

/// A bad etcd at start: one line in words, the documented code, no worker started; an endpoint where nothing
/// listens fails within a few seconds, whatever `join_timeout`.
#[test]
fn an_unreachable_or_wrong_etcd_or_missing_cacert_fails_at_once_with_one_line() {
    let etcd = EtcdCluster::start(1, false);
    let dir = tempfile::tempdir().unwrap();
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // An HTTP/1.1 server is not etcd (etcd's own peer port would not do: it serves the gRPC API too).
    let http = http1_server();
    let refused = format!("no etcd member answered /etcdserverpb.Maintenance/Status in time: http://127.0.0.1:{nothing} \
         refused the connection (nothing listens there); check that etcd is running");
    let cases: [(String, &str, &str, i32); 4] = [
        (format!("127.0.0.1:{nothing}"), "join_timeout=2", "no etcd member answered", 3),
        // Longer than the outage's warning takes: still the one line, once nothing has listened for a moment.
        (format!("127.0.0.1:{nothing}"), "join_timeout=600", &refused, 3),
        (http, "join_timeout=10", "is not etcd's v3 gRPC API", 2),
        (etcd.endpoints(), "protocol=https", "needs cacert=PATH", 2),
    ];
    for (endpoint, conf, needle, code) in cases {
        let mut a = Agent::start(
            "a",
            &AgentArgs::rdzv("etcd", 1, &endpoint)
                .conf(conf)
                .script(fixture("elastic_worker.py"))
                .arg(dir.path())
                .build(),
        );
        let got = a.exit_code(LONG);
        let log = a.log();
        let lines = said(&log);
        assert_eq!(lines.len(), 1, "{endpoint} {conf}: {log}");
        assert!(lines[0].contains(needle), "{endpoint} {conf}: {log}");
        // In words: no library's Debug rendering (`tonic::transport::Error(...)`, `source: ...`).
        assert!(!lines[0].contains("Error(") && !lines[0].contains("source:"), "{endpoint} {conf}: {log}");
        assert_eq!(got, Some(code), "{endpoint} {conf}: {log}");
        assert!(!dir.path().join("starts").exists(), "no worker may start");
    }
}

/// A server that answers every connection with an HTTP/1.1 error, as a web server given HTTP/2 does.
fn http1_server() -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    addr.to_string()
}

/// Nothing listens at the etcd endpoint: the agent ends within seconds, whatever `join_timeout`, with one line
/// naming the endpoint, what it answered and what to check (exit 3). An endpoint that takes connections but
/// never answers (its host up, etcd hung) is waited for: said once, with what to check, until a signal ends
/// the wait (143).
#[test]
fn an_unreachable_etcd_is_named_once_with_what_to_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nothing = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    // Connections complete in the kernel's backlog; nothing ever reads or answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_port = silent.local_addr().expect("addr").port();
    let check = "check that etcd is running and that --rdzv-endpoint names its client port";
    for (port, said) in [(nothing, "refused the connection (nothing listens there)"), (silent_port, "etcd does not answer: ")] {
        let endpoint = format!("127.0.0.1:{port}");
        let args = AgentArgs::rdzv("etcd", 1, &endpoint).conf("join_timeout=600").script(fixture("elastic_worker.py")).arg(dir.path()).build();
        let mut a = Agent::start("a", &args);
        let waited = port == silent_port;
        if waited {
            assert!(eventually(LONG, || a.log().contains(&endpoint)), "the agent never named the endpoint:\n{}", a.log());
            // SAFETY: plain kill(2) of a process this test started.
            assert_eq!(unsafe { libc::kill(a.guard.pid(), libc::SIGTERM) }, 0);
        }
        let got = a.exit_code(LONG);
        let log = a.log();
        assert_eq!(got, Some(if waited { 143 } else { 3 }), "{endpoint}: {log}");
        let named: Vec<&str> = log.lines().filter(|l| l.contains(&endpoint)).collect();
        assert_eq!(named.len(), 1, "{endpoint}: the endpoint is named once:\n{log}");
        assert!(named[0].contains(said) && named[0].contains(check), "{endpoint}: {log}");
        assert_eq!(count(&log, check), 1, "{endpoint}: what to check is said once:\n{log}");
        assert!(!dir.path().join("starts").exists(), "no worker may start");
    }
    drop(silent);
}

/// etcd with a self-signed CA and `--client-cert-auth`: muster joins with `protocol=https` and the cert keys;
/// without the client certificate it fails with one line naming it.
#[test]
fn tls_with_client_certificates() {
    let etcd = EtcdCluster::start(1, true);
    let dir = tempfile::tempdir().unwrap();
    let tls = etcd.tls().expect("tls paths");
    let run = |conf: String| {
        let mut a = Agent::start(
            "a",
            &AgentArgs::rdzv("etcd", 1, etcd.endpoints())
                .nproc(1)
                .conf(conf)
                .script(fixture("elastic_worker.py"))
                .arg(dir.path())
                .build(),
        );
        (a.exit_code(LONG), a.log())
    };
    let without = format!("protocol=https,cacert={}", tls.ca.display());
    let (code, log) = run(without);
    assert_eq!(code, Some(2), "{log}");
    let lines = said(&log);
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains("client certificate") && lines[0].contains("cert="), "{log}");
    std::fs::write(dir.path().join("finish"), "").unwrap();
    let (code, log) = run(etcd.tls_rdzv_conf());
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(starts(dir.path()).len(), 1, "{log}");
}

/// etcd with auth on: no user, a wrong password and a user without a role each fail at once with one line
/// (exit 2); the right user runs the job. The password comes from the environment only.
#[test]
fn etcd_auth_users_and_their_refusals() {
    let etcd = EtcdCluster::start(1, false);
    let etcdctl = |args: &[&str]| {
        let out = run(Command::new("etcdctl").env("ETCDCTL_API", "3").arg(format!("--endpoints={}", etcd.endpoints())).args(args), LONG);
        assert!(out.status.success(), "etcdctl {args:?}: {}", out.stderr);
    };
    etcdctl(&["user", "add", "root:rootpw"]);
    etcdctl(&["user", "grant-role", "root", "root"]);
    etcdctl(&["user", "add", "--user=root:rootpw", "bob:bobpw"]);
    etcdctl(&["auth", "enable"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("finish"), "").unwrap();
    let agent = |user: Option<(&str, &str)>, run_id: &str| {
        let envs: Vec<(&str, String)> = match user {
            Some((u, p)) => vec![("MUSTER_ETCD_USER", u.to_string()), ("MUSTER_ETCD_PASSWORD", p.to_string())],
            None => vec![],
        };
        let args = AgentArgs::rdzv("etcd", 1, etcd.endpoints())
            .nproc(1)
            .run_id(run_id)
            .script(fixture("elastic_worker.py"))
            .arg(dir.path())
            .build();
        let mut a = Agent::start_with_env("a", &args, &envs);
        (a.exit_code(LONG), a.log())
    };
    for (user, needle) in [(None, "needs a user"), (Some(("root", "wrong")), "authentication failed"), (Some(("bob", "bobpw")), "may not read")] {
        let (code, log) = agent(user, "refused");
        assert_eq!(code, Some(2), "{user:?}: {log}");
        let lines = said(&log);
        assert!(lines.len() == 1 && lines[0].contains(needle), "{user:?}: {log}");
    }
    assert!(starts(dir.path()).is_empty(), "a refused agent started a worker");
    let (code, log) = agent(Some(("root", "rootpw")), "allowed");
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(starts(dir.path()).len(), 1, "{log}");
}
