//! Several agents as separate processes on 127.0.0.1: elastic rendezvous, dead peers, joiners, restarts.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::cluster::*;
use common::*;

struct Job {
    dir: tempfile::TempDir,
    script: PathBuf,
    run_id: String,
    /// Set for every agent on top of the test's environment.
    envs: Vec<(&'static str, String)>,
}

impl Job {
    fn new() -> Job {
        Job {
            dir: tempfile::tempdir().unwrap(),
            script: fixture("elastic_worker.py"),
            run_id: format!("job{}", std::process::id()),
            envs: Vec::new(),
        }
    }

    fn args(&self, nnodes: &str, nproc: u32, endpoint: &str, conf: &str, extra: &[&str]) -> Vec<String> {
        AgentArgs::c10d(nnodes, endpoint)
            .nproc(nproc)
            .conf(conf)
            .run_id(&self.run_id)
            .opt("--shutdown-timeout=5")
            .opts(extra)
            .script(&self.script)
            .arg(self.dir.path())
            .build()
    }

    /// Starts the agent that hosts the store (port 0: the OS picks), then the others on its port.
    fn start(&self, nodes: &[&str], nnodes: &str, nproc: u32, conf: &str, extra: &[&str]) -> Vec<Agent> {
        let host_args = self.args(nnodes, nproc, "127.0.0.1:0", &format!("is_host=1,{conf}"), extra);
        let host = Agent::start_with_env(nodes[0], &host_args, &self.envs);
        let port = host.hosted_port();
        let mut agents = vec![host];
        for node in &nodes[1..] {
            agents.push(self.join(node, port, nnodes, nproc, conf, extra));
        }
        agents
    }

    fn join(&self, node: &str, port: u16, nnodes: &str, nproc: u32, conf: &str, extra: &[&str]) -> Agent {
        Agent::start_with_env(node, &self.args(nnodes, nproc, &format!("127.0.0.1:{port}"), conf, extra), &self.envs)
    }

    fn finish(&self) {
        std::fs::write(self.dir.path().join("finish"), "").unwrap();
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn group_rank_of(starts: &[Start], node: &str) -> u32 {
    starts.iter().find(|s| s.node == node).map(|s| s.group_rank).unwrap_or_else(|| panic!("{node} not in {starts:?}"))
}

#[test]
fn three_agents_form_one_world_with_torchrun_ranks() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b", "c"], "2:3", 2, "last_call_timeout=5", &[]);
    let world = wait_world(job.path(), 6, 6);
    assert_eq!(world.len(), 6, "{world:?}");
    let mut group_ranks: Vec<u32> = world.iter().map(|s| s.group_rank).collect();
    group_ranks.sort();
    group_ranks.dedup();
    assert_eq!(group_ranks, [0, 1, 2]);
    for s in &world {
        assert_eq!(s.rank, s.group_rank * 2 + s.local_rank, "torchrun's RANK = GROUP_RANK * nproc + LOCAL_RANK: {s:?}");
        assert_eq!(s.restart_count, 0);
    }
    let mut ranks: Vec<u32> = world.iter().map(|s| s.rank).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3, 4, 5]);
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

#[test]
fn two_agents_train_a_real_job() {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let args = |endpoint: &str, conf: &str| -> Vec<String> {
        AgentArgs::c10d(2, endpoint)
            .nproc(2)
            .conf(conf)
            .run_id(format!("train{}", std::process::id()))
            .script(example("train.py"))
            .arg("--result")
            .arg(&result)
            .arg("--ckpt-dir")
            .arg(dir.path().join("ckpt"))
            .build()
    };
    let mut a = Agent::start("a", &args("127.0.0.1:0", "is_host=1"));
    let port = a.hosted_port();
    let mut b = Agent::start("b", &args(&format!("127.0.0.1:{port}"), "read_timeout=60"));
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!(r["world_size"], 4, "{r}");
    assert_eq!(r["steps"], 40, "{r}");
}

#[test]
fn kill_9_of_an_agent_reforms_the_survivors_without_spending_a_restart() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b", "c"], "2:3", 1, "last_call_timeout=5", &["--max-restarts=0"]);
    let before = wait_world(job.path(), 3, 3);
    // A non-host node dies (killing the host is the store-host test's case): the one ranked last of b and c.
    let last = ["b", "c"].into_iter().max_by_key(|n| group_rank_of(&before, n)).unwrap();
    let index = ["a", "b", "c"].iter().position(|n| *n == last).unwrap();
    let victim: Vec<i32> = before.iter().filter(|s| s.node == last).map(|s| s.pid).collect();
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agents[index].guard.pid(), libc::SIGKILL) };
    let gone = eventually(Duration::from_secs(1), || victim.iter().all(|p| !alive(*p)));
    assert!(gone, "workers of the killed agent outlived it by 1 s: {victim:?}");
    let after = wait_world(job.path(), 2, 2);
    assert!(after.iter().all(|s| s.restart_count == 0), "a peer's death spent a restart: {after:?}");
    // Survivors keep their relative order, compacted to 0..n.
    let mut survivors: Vec<&str> = ["a", "b", "c"].into_iter().filter(|n| *n != last).collect();
    survivors.sort_by_key(|n| group_rank_of(&before, n));
    for (rank, node) in survivors.iter().enumerate() {
        assert_eq!(group_rank_of(&after, node), rank as u32, "{node}: ranks before {before:?}, after {after:?}");
    }
    job.finish();
    agents.remove(index);
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

/// A third agent for `--nnodes 1:2` waits as a hot spare (the group is full) and takes the place of a node
/// that is lost; the job goes on at two nodes. (NVIDIA's launcher closes the rendezvous and ends the job.)
#[test]
fn a_third_agent_for_two_nodes_waits_as_a_spare_and_replaces_a_lost_node() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b"], "1:2", 1, "last_call_timeout=1", &[]);
    let first = wait_world(job.path(), 2, 2);
    let port = agents[0].hosted_port();
    agents.push(job.join("c", port, "1:2", 1, "last_call_timeout=1", &[]));
    let spare = eventually(LONG, || agents[2].log().contains("waiting for the next one"));
    assert!(spare, "c does not wait as a spare: {}", agents[2].log());
    assert!(starts(job.path()).iter().all(|s| s.node != "c"), "the spare started a worker in a full group");
    let b_workers: Vec<i32> = first.iter().filter(|s| s.node == "b").map(|s| s.pid).collect();
    agents[1].kill9();
    assert!(eventually(Duration::from_secs(5), || b_workers.iter().all(|p| !alive(*p))), "b's workers outlived it");
    let after = wait_world(job.path(), 2, 4);
    let nodes: Vec<&str> = after.iter().skip(2).map(|s| s.node.as_str()).collect();
    assert!(nodes.contains(&"a") && nodes.contains(&"c"), "the spare did not take b's place: {after:?}");
    job.finish();
    agents.remove(1);
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

/// With `--warm-spares`, the survivors' new workers are the spares (torch already imported), in the smaller
/// world; the killed agent's spares die with it.
#[test]
fn with_warm_spares_the_survivors_of_a_kill_9_restart_from_spares() {
    let mut job = Job::new();
    let spares_dir = tempfile::tempdir().unwrap();
    job.envs.push(("MUSTER_TEST_WARM_DIR", spares_dir.path().display().to_string()));
    let warm = ["--warm-spares=torch.distributed,warm_marker", "--warm-spares-delay=0"];
    let mut agents = job.start(&["a", "b"], "1:2", 2, "last_call_timeout=5", &warm);
    let before = wait_world(job.path(), 4, 4);
    let spares = || -> Vec<i32> {
        std::fs::read_dir(spares_dir.path())
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().strip_prefix("spare-").and_then(|p| p.parse().ok()))
            .collect()
    };
    assert!(eventually(LONG, || spares().len() == 4), "each agent starts two spares: {:?}", spares());
    let idle = spares();
    let victim: Vec<i32> = before.iter().filter(|s| s.node == "b").map(|s| s.pid).collect();
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agents[1].guard.pid(), libc::SIGKILL) };
    let after = wait_world(job.path(), 2, 2);
    assert!(after.iter().all(|s| s.node == "a" && idle.contains(&s.pid)), "survivors started from spares: {after:?}, spares {idle:?}");
    let b_spares: Vec<i32> = idle.iter().copied().filter(|p| !after.iter().any(|s| s.pid == *p)).collect();
    let gone = eventually(Duration::from_secs(1), || victim.iter().chain(&b_spares).all(|p| !alive(*p)));
    assert!(gone, "the killed agent's workers or spares outlived it: {victim:?} {b_spares:?}");
    job.finish();
    assert_eq!(agents[0].exit_code(LONG), Some(0), "{}", agents[0].log());
}

#[test]
fn a_worker_crash_restarts_every_node_and_spends_only_its_own_restart() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b"], "2", 1, "last_call_timeout=5", &["--max-restarts=1"]);
    let before = wait_world(job.path(), 2, 2);
    std::fs::write(job.path().join("crash-b"), "").unwrap();
    let ok = eventually(LONG, || starts(job.path()).len() >= 4);
    assert!(ok, "the group was not restarted: {:?}", starts(job.path()));
    wait_world(job.path(), 2, 4);
    let second: Vec<Start> = starts(job.path()).into_iter().skip(2).collect();
    for s in &second {
        let expected = if s.node == "b" { 1 } else { 0 };
        assert_eq!(s.restart_count, expected, "{s:?}");
        assert_eq!(s.group_rank, group_rank_of(&before, &s.node), "group ranks are stable across a restart");
    }
    // b's crash is a failure; a's worker, stopped for the re-formation, is not.
    let (a, b) = (agents[0].log(), agents[1].log());
    assert!(b.contains("WARN failed (exitcode: 1) local_rank: 0"), "{b}");
    assert!(a.contains("INFO stopped for the re-formation (exitcode: -15) local_rank: 0"), "{a}");
    assert!(!a.contains("failed (exitcode"), "{a}");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

#[test]
fn a_late_agent_scales_the_group_up_in_one_restart() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b", "c"], "2:4", 1, "last_call_timeout=2", &[]);
    wait_world(job.path(), 3, 3);
    let port = agents[0].hosted_port();
    agents.push(job.join("d", port, "2:4", 1, "last_call_timeout=2", &[]));
    let world = wait_world(job.path(), 4, 4);
    assert_eq!(world.len(), 4, "{world:?}");
    let worlds: Vec<u32> = starts(job.path()).iter().map(|s| s.world_size).collect();
    assert_eq!(worlds.iter().filter(|w| **w == 3).count(), 3, "one round of three, then one of four: {worlds:?}");
    assert_eq!(worlds.len(), 7, "exactly one re-formation: {worlds:?}");
    assert_eq!(group_rank_of(&world, "d"), 3, "the newcomer is appended");
    // The three first nodes' workers were stopped on purpose: said as what it is, not as a failure.
    for a in &agents[..3] {
        let log = a.log();
        assert_eq!(log.matches("INFO stopped for the re-formation (exitcode: -15) local_rank: 0 (pid: ").count(), 1, "{log}");
        assert!(!log.contains("failed (exitcode"), "{log}");
    }
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

#[test]
fn a_mismatched_agent_is_refused_and_the_job_is_unharmed() {
    let job = Job::new();
    let mut agents = job.start(&["a", "b"], "2:3", 1, "last_call_timeout=1", &[]);
    wait_world(job.path(), 2, 2);
    let port = agents[0].hosted_port();
    let mut other = Agent::start(
        "c",
        &AgentArgs::c10d("2:3", format!("127.0.0.1:{port}"))
            .nproc(2)
            .run_id(&job.run_id)
            .script(fixture("dump_env.py"))
            .arg(job.path())
            .build(),
    );
    assert_eq!(other.exit_code(LONG), Some(1), "{}", other.log());
    let log = other.log();
    assert!(log.contains("does not match the running job"), "{log}");
    assert!(log.contains("dump_env.py") && log.contains("elastic_worker.py"), "names the scripts: {log}");
    assert!(log.contains("--nproc-per-node 2 (the job uses 1)"), "names the nproc difference: {log}");
    assert_eq!(starts(job.path()).len(), 2, "the running job was disturbed");
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

#[test]
fn an_unreachable_endpoint_fails_clearly_after_join_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Port 1 on loopback: nothing listens there.
    let mut a = Agent::start(
        "a",
        &AgentArgs::c10d(2, "127.0.0.1:1")
            .conf("is_host=0,join_timeout=2")
            .script(fixture("elastic_worker.py"))
            .arg(dir.path())
            .build(),
    );
    assert_eq!(a.exit_code(LONG), Some(3), "the rendezvous did not complete: {}", a.log());
    let log = a.log();
    assert!(log.contains("127.0.0.1:1") && log.contains("could not reach the store"), "{log}");
    assert!(!dir.path().join("starts").exists(), "no worker may start");
}

#[test]
fn static_rendezvous_uses_node_ranks_and_the_master_port() {
    let dir = tempfile::tempdir().unwrap();
    // Static needs a port known to every node in advance, as with torchrun's --master-port.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let args = |rank: u32| -> Vec<String> {
        vec![
            "--nnodes=2".into(),
            "--nproc-per-node=2".into(),
            "--rdzv-backend=static".into(),
            format!("--node-rank={rank}"),
            "--master-addr=127.0.0.1".into(),
            format!("--master-port={port}"),
            fixture("elastic_worker.py").display().to_string(),
            dir.path().display().to_string(),
        ]
    };
    // Node 1 first: it waits for node 0, which hosts the store on the master port.
    let mut b = Agent::start("b", &args(1));
    let mut a = Agent::start("a", &args(0));
    let world = wait_world(dir.path(), 4, 4);
    for s in &world {
        assert_eq!(s.group_rank, if s.node == "a" { 0 } else { 1 }, "GROUP_RANK is --node-rank: {s:?}");
        assert_eq!(s.rank, s.group_rank * 2 + s.local_rank);
    }
    std::fs::write(dir.path().join("finish"), "").unwrap();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
}

#[test]
fn a_stopped_agent_is_evicted_by_heartbeat_and_the_others_reform() {
    let job = Job::new();
    let conf = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2";
    let mut agents = job.start(&["a", "b", "c"], "2:3", 1, conf, &[]);
    wait_world(job.path(), 3, 3);
    // SIGSTOP: the agent hangs with its store connection open, so only missing heartbeats reveal it.
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agents[2].guard.pid(), libc::SIGSTOP) };
    let after = wait_world(job.path(), 2, 2);
    assert!(after.iter().all(|s| s.node != "c" && s.restart_count == 0), "{after:?}");
    // SAFETY: plain kill(2).
    unsafe { libc::kill(agents[2].guard.pid(), libc::SIGKILL) };
    job.finish();
    for a in &mut agents[..2] {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}

#[test]
fn a_node_that_finishes_first_waits_for_the_others_without_disturbing_them() {
    let job = Job::new();
    let conf = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2";
    let mut agents = job.start(&["a", "b"], "1:2", 1, conf, &[]);
    wait_world(job.path(), 2, 2);
    std::fs::write(job.path().join("finish-a"), "").unwrap();
    // Longer than the heartbeat eviction window: a finished node in the exit barrier must stay "alive".
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(starts(job.path()).len(), 2, "the still-running node restarted: {:?}", starts(job.path()));
    job.finish();
    for a in &mut agents {
        assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    }
}
