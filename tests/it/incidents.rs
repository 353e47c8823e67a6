//! Incidents shaped like real hardware, played on the fake NVML (workers attached to their GPUs, faults that
//! kill them just before or after the event, companion XIDs, stalled NVML calls) with three or four agents on
//! loopback. Node `b` takes the fault; `a` hosts the store; `c` (and `d`) are bystanders.
//!
//! Each test plays its incident `MUSTER_INCIDENT_RUNS` times (default 1; `scripts/stress/incidents.sh --runs
//! 20`), prints one `INCIDENT |` row (runs, unexpected outcomes, the documented result, time to re-form) and
//! fails if any run ended otherwise. The workers are `tests/fixtures/incident_worker.py` (no torch), so a run
//! takes seconds.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::gpus::FakeNode;
use common::*;

/// Plays `scenario` `MUSTER_INCIDENT_RUNS` times; each run returns its time to re-form (or to the decisive
/// event).
fn play(name: &str, expected: &str, scenario: impl Fn() -> Duration + std::panic::RefUnwindSafe) {
    common::repeat::play("INCIDENT", "MUSTER_INCIDENT_RUNS", name, expected, scenario);
}

/// One node's agent and its fake GPUs.
struct Node {
    name: &'static str,
    gpus: FakeNode,
    agent: Option<Agent>,
}

struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    port: u16,
    run_id: String,
    /// `--rdzv-conf` for every agent (the host adds `is_host=1`).
    conf: String,
}

const TWO_GPUS: usize = 2;

/// A run that failed shows what every agent said: the outcome alone rarely tells why.
impl Drop for Cluster {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for node in &self.nodes {
            if let Some(agent) = &node.agent {
                eprintln!("--- agent {}:\n{}", node.name, agent.log());
            }
        }
    }
}

impl Cluster {
    fn new(names: &[&'static str], attach: bool, busy_on_b: &[(usize, u32)]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let nodes = names
            .iter()
            .map(|name| {
                let busy = if *name == "b" { busy_on_b } else { &[] };
                Node { name, gpus: FakeNode::with(dir.path(), name, TWO_GPUS, busy, attach), agent: None }
            })
            .collect();
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let conf = "last_call_timeout=1".to_string();
        Cluster { dir, nodes, port: 0, run_id: format!("inc{}x{run}", std::process::id()), conf }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    fn agent(&mut self, name: &str) -> &mut Agent {
        let node = self.nodes.iter_mut().find(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"));
        node.agent.as_mut().unwrap_or_else(|| panic!("{name} was not started"))
    }

    /// Starts `name`'s agent; `a` hosts the store.
    fn start(&mut self, name: &str, nnodes: &str, nproc: &str, extra: &[&str]) {
        let hosting = name == "a";
        let endpoint = format!("127.0.0.1:{}", self.port);
        let conf = if hosting { format!("is_host=1,{}", self.conf) } else { self.conf.clone() };
        let hook = format!("touch {}/hook-{name}", self.path().display());
        let args = AgentArgs::c10d(nnodes, endpoint)
            .nproc(nproc)
            .conf(conf)
            .run_id(&self.run_id)
            .opts(["--max-restarts=3", "--shutdown-timeout=5", "--on-node-fault", &hook])
            .opts(extra)
            .script(fixture("incident_worker.py"))
            .arg(self.path())
            .build();
        let env = self.node(name).gpus.env();
        let agent = Agent::start_with_env(name, &args, &env);
        if hosting {
            self.port = agent.hosted_port();
        }
        if let Some(node) = self.nodes.iter_mut().find(|n| n.name == name) {
            node.agent = Some(agent);
        }
    }

    fn hook_ran(&self, name: &str) -> bool {
        self.path().join(format!("hook-{name}")).exists()
    }

    /// Asks every worker to finish and checks the named agents exit 0.
    fn finish(&mut self, names: &[&str]) {
        std::fs::write(self.path().join("finish"), "").expect("write finish");
        for name in names {
            let agent = self.agent(name);
            assert_eq!(agent.exit_code(LONG), Some(0), "{name} did not finish cleanly:\n{}", agent.log());
        }
    }

    /// Node `name` drains: exit 75 with its hook run.
    fn expect_drained(&mut self, name: &str) {
        let code = self.agent(name).exit_code(LONG);
        let log = self.agent(name).log();
        assert_eq!(code, Some(75), "{name} was not drained:\n{log}");
        assert!(self.hook_ran(name), "{name}'s --on-node-fault hook did not run:\n{log}");
    }

    /// The survivors `a` and `c` re-formed to a world of 4 without spending a restart.
    fn expect_survivors_reform(&self) {
        let world = wait_world(self.path(), 4, 4);
        assert!(
            world.iter().all(|s| (s.node == "a" || s.node == "c") && s.restart_count == 0),
            "the survivors' new world: {world:?}"
        );
    }

    /// Injects `line` on b's GPU `gpu`; b drains and a+c re-form: returns how long that took.
    fn drain_b(&mut self, gpu: usize, line: &str) -> Duration {
        let t0 = Instant::now();
        self.node("b").gpus.inject(gpu, line);
        self.expect_drained("b");
        self.expect_survivors_reform();
        t0.elapsed()
    }

    /// No worker of `name` ever started without the GPUs it was placed on.
    fn expect_placed_always(&self, name: &str) {
        let unplaced: Vec<Start> = starts(self.path()).into_iter().filter(|s| s.node == name && s.visible == "-").collect();
        assert!(unplaced.is_empty(), "{name} started workers without CUDA_VISIBLE_DEVICES: {unplaced:?}");
    }
}

/// Three nodes of two workers each, running.
fn three(nproc: &str, b_extra: &[&str], attach: bool) -> Cluster {
    let mut cluster = Cluster::new(&["a", "b", "c"], attach, &[]);
    cluster.start("a", "2:3", nproc, &[]);
    cluster.start("b", "2:3", nproc, b_extra);
    cluster.start("c", "2:3", nproc, &[]);
    wait_world(cluster.path(), 6, 6);
    cluster
}

/// XID 79 on b's GPU 1, its worker SIGKILLed `kill` ms around the event (`-30`: before, `+30`: after).
fn xid79(nproc: &str, kill: &str) -> Duration {
    let mut cluster = three(nproc, &[], true);
    let took = cluster.drain_b(1, &format!("lost 1 kill={kill}"));
    cluster.expect_placed_always("b");
    // The death came first, but the node drains: no worker may start in between.
    let b = starts(cluster.path()).into_iter().filter(|s| s.node == "b").count();
    assert_eq!(b, 2, "b started workers between its worker's death and the drain");
    cluster.finish(&["a", "c"]);
    took
}

const DRAINED: &str = "b exits 75, hook run; a+c re-form to world 4, no restart spent";

/// With `--nproc-per-node gpu` (the count read from NVML, which now fails on the lost GPU) and a fixed count;
/// the worker dying 30 ms before the event and 30 ms after.
#[test]
fn xid79_with_its_workers_death_30ms_around_the_event() {
    for (nproc, kill, name) in [
        ("gpu", "-30", "XID 79, worker dies 30 ms before (--nproc-per-node gpu)"),
        ("gpu", "+30", "XID 79, worker dies 30 ms after (--nproc-per-node gpu)"),
        ("2", "-30", "XID 79, worker dies 30 ms before (--nproc-per-node 2)"),
        ("2", "+30", "XID 79, worker dies 30 ms after (--nproc-per-node 2)"),
    ] {
        play(name, DRAINED, move || xid79(nproc, kill));
    }
}

/// Four nodes, `--nnodes 3:4`, `--on-gpu-fault exclude`: b's worker on GPU 1 dies and the driver raises XID 79
/// on that GPU `after` ms later. The death alone would restart b's group (through a new round, as the others
/// re-form too); the XID makes it drain, and no worker of b may start in between.
fn xid79_after_its_workers_death(nproc: &str, after: u32) -> Duration {
    let mut cluster = Cluster::new(&["a", "b", "c", "d"], true, &[]);
    let events = cluster.path().join("b.events");
    for name in ["a", "b", "c", "d"] {
        let log = format!("--event-log={}", events.display());
        let extra: &[&str] = if name == "b" { &["--on-gpu-fault=exclude", &log] } else { &["--on-gpu-fault=exclude"] };
        cluster.start(name, "3:4", nproc, extra);
    }
    wait_world(cluster.path(), 8, 8);
    let t0 = Instant::now();
    cluster.node("b").gpus.inject(1, &format!("xid 1 79 kill=-{after}"));
    cluster.expect_drained("b");
    let world = wait_world(cluster.path(), 6, 6);
    let took = t0.elapsed();
    assert!(world.iter().all(|s| s.node != "b" && s.restart_count == 0), "the survivors' new world: {world:?}");
    let log = cluster.agent("b").log();
    assert!(log.contains("XID 79"), "b drained for another reason:\n{log}");
    // A worker spawned and killed at once may never write its start: b's own transitions say whether it
    // started any (a start ends in `running`).
    let text = std::fs::read_to_string(&events).expect("b's event log");
    let phases: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["name"] == "muster.agent.transition")
        .map(|e| e["to"].as_str().unwrap_or("?").to_string())
        .collect();
    assert_eq!(phases.iter().filter(|p| *p == "running").count(), 1, "b started workers after the death: {phases:?}\n{log}");
    assert_eq!(phases.last().map(String::as_str), Some("drained"), "{phases:?}");
    let b = starts(cluster.path()).into_iter().filter(|s| s.node == "b").count();
    assert_eq!(b, 2, "b started workers between its worker's death and the drain:\n{log}");
    cluster.finish(&["a", "c", "d"]);
    took
}

#[test]
fn xid79_tens_of_ms_after_its_workers_death_starts_no_worker() {
    for (nproc, after, name) in [
        ("2", 15, "XID 79 15 ms after its worker's death, 4 nodes (--nproc-per-node 2)"),
        ("gpu", 27, "XID 79 27 ms after its worker's death, 4 nodes (--nproc-per-node gpu)"),
    ] {
        play(name, "b starts no worker, exits 75, hook run; a+c+d re-form to world 6", move || {
            xid79_after_its_workers_death(nproc, after)
        });
    }
}

#[test]
fn xid13_with_its_workers_crash_spends_one_restart() {
    for (kill, name) in [
        ("+5", "XID 13 with its worker's crash (5 ms after)"),
        ("-10", "XID 13, its worker dies 10 ms before"),
        ("-30", "XID 13, its worker dies 30 ms before"),
    ] {
        play(name, "b spends 1 restart; world 6 again; all exit 0", move || xid13(kill));
    }
}

/// XID 13 on b's GPU 1, its worker killed `kill` ms around the event: one incident, one restart.
fn xid13(kill: &str) -> Duration {
    let mut cluster = three("2", &[], true);
    let t0 = Instant::now();
    cluster.node("b").gpus.inject(1, &format!("xid 1 13 kill={kill}"));
    wait_world(cluster.path(), 6, 12);
    let took = t0.elapsed();
    let b: Vec<Start> = starts(cluster.path()).into_iter().filter(|s| s.node == "b").collect();
    assert_eq!(b.iter().filter(|s| s.restart_count == 1).count(), 2, "b restarted once: {b:?}");
    assert!(b.iter().all(|s| s.restart_count <= 1), "one incident spent two restarts: {b:?}");
    let others = starts(cluster.path()).into_iter().filter(|s| s.node != "b");
    assert!(others.into_iter().all(|s| s.restart_count == 0), "a re-formation spent a restart elsewhere");
    cluster.finish(&["a", "b", "c"]);
    took
}

/// A DBE on b's GPU 1 with the driver's XID 48 20 ms later, under `--on-gpu-fault exclude`: b continues on
/// GPU 0 alone.
fn exclude_gpu1() -> (Cluster, Duration) {
    let cluster = three("gpu", &["--on-gpu-fault=exclude"], true);
    let t0 = Instant::now();
    cluster.node("b").gpus.inject(1, "dbe 1 kill=+5 companion=48@20");
    let world = wait_world(cluster.path(), 5, 5);
    let took = t0.elapsed();
    let on_b: Vec<&Start> = world.iter().filter(|s| s.node == "b").collect();
    assert_eq!(on_b.len(), 1, "b continues with one worker: {world:?}");
    assert_eq!(on_b[0].visible, "0", "GPU 1 is excluded: {world:?}");
    assert!(world.iter().all(|s| s.restart_count == 0), "excluding spends no restart: {world:?}");
    (cluster, took)
}

#[test]
fn dbe_and_xid48_with_exclude_continues_on_fewer_gpus() {
    play("DBE + XID 48, --on-gpu-fault exclude", "b continues on 1 GPU, world 5, no restart; all exit 0", || {
        let (mut cluster, took) = exclude_gpu1();
        let status = std::fs::read_to_string(&cluster.node("b").gpus.status).unwrap_or_default();
        assert!(status.contains("event 1 0x8 48"), "the companion XID 48 was not played: {status}");
        cluster.finish(&["a", "b", "c"]);
        assert!(!cluster.hook_ran("b"), "b was drained");
        took
    });
}

#[test]
fn xid79_on_an_excluded_gpu_is_ignored() {
    play("XID 79 on an excluded GPU", "ignored: b keeps its worker; all exit 0", || {
        let (mut cluster, _) = exclude_gpu1();
        let t0 = Instant::now();
        cluster.node("b").gpus.write("lost 1");
        let log_says = eventually(LONG, || cluster.agent("b").log().contains("ignored: GPU excluded"));
        assert!(log_says, "b did not report the fault as ignored:\n{}", cluster.agent("b").log());
        let took = t0.elapsed();
        let after = starts(cluster.path()).len();
        assert_eq!(after, 6 + 5, "nothing restarted: {:?}", starts(cluster.path()));
        cluster.finish(&["a", "b", "c"]);
        assert!(!cluster.hook_ran("b"));
        took
    });
}

#[test]
fn a_fault_during_rendezvous_drains() {
    play("XID 79 during rendezvous", "b exits 75, hook run, never starts; a+c+d form world 6", || {
        let mut cluster = Cluster::new(&["a", "b", "c", "d"], true, &[]);
        cluster.start("a", "3", "2", &[]);
        cluster.start("b", "3", "2", &[]);
        let registered = eventually(LONG, || cluster.node("b").gpus.registered(0));
        assert!(registered, "b's watcher never started:\n{}", cluster.agent("b").log());
        let t0 = Instant::now();
        cluster.node("b").gpus.write("lost 0");
        cluster.expect_drained("b");
        let took = t0.elapsed();
        cluster.start("c", "3", "2", &[]);
        cluster.start("d", "3", "2", &[]);
        let world = wait_world(cluster.path(), 6, 6);
        assert!(world.iter().all(|s| s.node != "b"), "{world:?}");
        cluster.finish(&["a", "c", "d"]);
        took
    });
}

#[test]
fn a_fault_during_start_drains() {
    play("XID 79 while starting (GPU check waiting)", DRAINED, || {
        // A foreign process on b's GPU 0 holds b in the pre-spawn check.
        let mut cluster = Cluster::new(&["a", "b", "c"], true, &[(0, 4242)]);
        cluster.start("a", "2:3", "2", &[]);
        cluster.start("b", "2:3", "2", &["--gpu-wait-timeout=120"]);
        cluster.start("c", "2:3", "2", &[]);
        let waiting = eventually(LONG, || cluster.agent("b").log().contains("waiting before starting workers"));
        assert!(waiting, "b never waited in the GPU check:\n{}", cluster.agent("b").log());
        let took = cluster.drain_b(0, "lost 0");
        assert!(starts(cluster.path()).iter().all(|s| s.node != "b"), "b started workers on a lost GPU");
        cluster.finish(&["a", "c"]);
        took
    });
}

#[test]
fn a_fault_while_stopping_drains() {
    play("XID 79 while the group stops (worker ignores SIGTERM)", DRAINED, || {
        let mut cluster = three("2", &[], true);
        std::fs::write(cluster.path().join("ignore-term-b"), "").expect("write");
        // The restarted group must be the one that ignores SIGTERM: crash, wait for the restart, crash again.
        std::fs::write(cluster.path().join("crash-b"), "").expect("write");
        wait_world(cluster.path(), 6, 12);
        std::fs::write(cluster.path().join("crash-b"), "").expect("write");
        let stopping = eventually(LONG, || cluster.agent("b").log().matches("closing signal SIGTERM").count() >= 2);
        assert!(stopping, "b never stopped its group:\n{}", cluster.agent("b").log());
        let took = cluster.drain_b(1, "lost 1");
        cluster.finish(&["a", "c"]);
        took
    });
}

#[test]
fn a_lost_gpu_whose_nvml_calls_stall_drains() {
    play("XID 79, NVML calls on the GPU stall 10 s", DRAINED, || {
        let mut cluster = three("2", &[], true);
        let took = cluster.drain_b(1, "lost 1 stall=10000 kill=-30");
        cluster.expect_placed_always("b");
        cluster.finish(&["a", "c"]);
        took
    });
}

/// Stops b's agent for `pause`, SIGKILLs its workers meanwhile, then lets it go on: it rejoins (or, evicted by
/// the heartbeat timeout, joins the next round) and the job finishes with every node.
fn paused(pause: Duration) -> Duration {
    let mut cluster = three("2", &[], false);
    let b = cluster.agent("b").guard.pid();
    let workers: Vec<i32> = starts(cluster.path()).iter().filter(|s| s.node == "b").map(|s| s.pid).collect();
    // SAFETY: plain kill(2) calls on processes this test started.
    unsafe {
        libc::kill(b, libc::SIGSTOP);
        for w in &workers {
            libc::kill(*w, libc::SIGKILL);
        }
    }
    // The pause itself is the incident (a GC pause, a swap storm, a debugger), not a wait for an event.
    std::thread::sleep(pause);
    let t0 = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(b, libc::SIGCONT) };
    let world = eventually(LONG, || {
        let all = starts(cluster.path());
        let last_b = all.iter().rposition(|s| s.node == "b" && !workers.contains(&s.pid));
        last_b.is_some() && all.iter().filter(|s| s.world_size == 6).count() >= 12
    });
    assert!(world, "b never rejoined a world of 6: {:?}\n{}", starts(cluster.path()), cluster.agent("b").log());
    wait_world(cluster.path(), 6, 12);
    let took = t0.elapsed();
    cluster.finish(&["a", "b", "c"]);
    took
}

#[test]
fn an_agent_paused_8s_while_its_workers_die_rejoins() {
    play("agent SIGSTOPped 8 s, its workers SIGKILLed", "b rejoins; world 6 again; all exit 0", || {
        paused(Duration::from_secs(8))
    });
}

#[test]
fn an_agent_paused_25s_while_its_workers_die_joins_the_next_round() {
    play("agent SIGSTOPped 25 s (evicted), its workers SIGKILLed", "b joins the next round; world 6; all exit 0", || {
        paused(Duration::from_secs(25))
    });
}

#[test]
fn a_joiner_that_fills_max_reforms_at_once() {
    play("a joiner brings the group to MAX (last_call_timeout=600)", "re-forms to world 6 at once; all exit 0", || {
        // Only the MAX rule can re-form this group within the test's wait: the last call is 10 minutes.
        let mut cluster = Cluster::new(&["a", "b", "c"], false, &[]);
        cluster.conf = "last_call_timeout=600".into();
        for name in ["a", "b", "c"] {
            cluster.start(name, "2:3", "2", &[]);
        }
        wait_world(cluster.path(), 6, 6);
        cluster.agent("c").guard.0.kill().expect("kill c");
        wait_world(cluster.path(), 4, 4);
        let t0 = Instant::now();
        cluster.start("c", "2:3", "2", &[]);
        wait_world(cluster.path(), 6, 12);
        let took = t0.elapsed();
        cluster.finish(&["a", "b", "c"]);
        took
    });
}

#[test]
fn a_joiner_with_another_nnodes_is_refused_naming_both() {
    let mut cluster = Cluster::new(&["a", "b", "c"], false, &[]);
    cluster.start("a", "2:3", "2", &[]);
    cluster.start("b", "2:3", "2", &[]);
    wait_world(cluster.path(), 4, 4);
    cluster.start("c", "2:4", "2", &[]);
    assert_eq!(cluster.agent("c").exit_code(LONG), Some(1), "{}", cluster.agent("c").log());
    let log = cluster.agent("c").log();
    let line = log.lines().last().unwrap_or_default();
    assert!(line.contains("--nnodes 2:4") && line.contains("2:3"), "one line naming both values: {log}");
    cluster.finish(&["a", "b"]);
}
