//! GPU health with the fake `libnvidia-ml.so` (`fake-nvml/`), loaded through muster's real NVML code path:
//! faults injected while agents run, and what each one does to the job.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::cluster::*;
use common::gpus::FakeNode;
use common::*;

fn agent_args(nnodes: &str, nproc: &str, endpoint: &str, conf: &str, extra: &[&str], dir: &Path) -> Vec<String> {
    AgentArgs::c10d(nnodes, endpoint)
        .nproc(nproc)
        .conf(conf)
        .run_id(format!("gpu{}", std::process::id()))
        .opt("--shutdown-timeout=5")
        .opts(extra)
        .script(fixture("elastic_worker.py"))
        .arg(dir)
        .build()
}

#[test]
fn xid_79_drains_the_node_and_the_other_reforms_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (a_gpus, b_gpus) = (FakeNode::new(dir.path(), "a", 4, &[]), FakeNode::new(dir.path(), "b", 4, &[]));
    // A heartbeat timeout would take minutes: re-forming within the test's wait proves it was not needed.
    let conf = "last_call_timeout=3,keep_alive_interval=60";
    let hook_out = dir.path().join("hook.env");
    let hook = format!("env | grep '^MUSTER_FAULT_' > {}", hook_out.display());
    let mut a = Agent::start_with_env(
        "a",
        &agent_args("1:2", "gpu", "127.0.0.1:0", &format!("is_host=1,{conf}"), &[], dir.path()),
        &a_gpus.env(),
    );
    let port = a.hosted_port();
    let mut b = Agent::start_with_env(
        "b",
        &agent_args("1:2", "gpu", &format!("127.0.0.1:{port}"), conf, &["--on-node-fault", &hook], dir.path()),
        &b_gpus.env(),
    );
    let world = wait_world(dir.path(), 8, 8);
    let b_workers: Vec<i32> = world.iter().filter(|s| s.node == "b").map(|s| s.pid).collect();
    assert_eq!(b_workers.len(), 4, "nproc gpu = 4 fake GPUs");
    b_gpus.inject(2, "xid 2 79");
    let stopped = eventually(Duration::from_secs(1), || b_workers.iter().all(|p| !alive(*p)));
    assert!(stopped, "B's workers still run 1 s after XID 79");
    assert_eq!(b.exit_code(LONG), Some(75), "the documented unhealthy-node code: {}", b.log());
    let hook_env = std::fs::read_to_string(&hook_out).expect("the hook ran");
    assert!(hook_env.contains("MUSTER_FAULT_XID=79"), "{hook_env}");
    assert!(hook_env.contains("MUSTER_FAULT_GPU_UUID=GPU-b0000002-0000-0000-0000-000000000000"), "{hook_env}");
    assert!(hook_env.contains("MUSTER_FAULT_HOSTNAME="), "{hook_env}");
    let alone = wait_world(dir.path(), 4, 4);
    assert!(alone.iter().all(|s| s.node == "a" && s.restart_count == 0), "{alone:?}");
    std::fs::write(dir.path().join("finish"), "").unwrap();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
}

#[test]
fn xid_13_restarts_the_group_and_spends_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 2, &[]);
    let mut a = Agent::start_with_env(
        "a",
        &agent_args("1", "2", "127.0.0.1:0", "is_host=1", &["--max-restarts=1"], dir.path()),
        &gpus.env(),
    );
    wait_world(dir.path(), 2, 2);
    gpus.inject(1, "xid 1 13");
    let restarted = eventually(LONG, || starts(dir.path()).iter().filter(|s| s.restart_count == 1).count() == 2);
    assert!(restarted, "no group restart after XID 13: {:?}\n{}", starts(dir.path()), a.log());
    std::fs::write(dir.path().join("finish"), "").unwrap();
    assert_eq!(a.exit_code(LONG), Some(0), "the node stays: {}", a.log());
}

#[test]
fn an_xid_whose_worker_dies_first_restarts_the_group_on_the_same_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::with(dir.path(), "a", 2, &[], true);
    let mut a = Agent::start_with_env(
        "a",
        &agent_args("1", "2", "127.0.0.1:0", "is_host=1", &["--max-restarts=3"], dir.path()),
        &gpus.env(),
    );
    let first = wait_world(dir.path(), 2, 2);
    let victim = first.iter().find(|s| s.local_rank == 1).expect("local rank 1").pid;
    // CUDA kills the context (the worker) a little before the driver's XID reaches NVML.
    gpus.inject(1, "xid 1 13 kill=-30");
    let restarted = eventually(LONG, || starts(dir.path()).iter().filter(|s| s.restart_count > 0).count() >= 2);
    assert!(restarted, "no group restart: {:?}\n{}", starts(dir.path()), a.log());
    let status = std::fs::read_to_string(&gpus.status).unwrap();
    assert!(status.contains(&format!("killed 1 pids=[{victim}]")), "the fake killed the worker on GPU 1: {status}");
    assert!(!alive(victim));
    // The dead workers no longer hold their GPUs: the pre-spawn check let the new ones start there.
    assert!(starts(dir.path()).iter().all(|s| s.visible == "0,1"), "{:?}", starts(dir.path()));
    std::fs::write(dir.path().join("finish"), "").unwrap();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
}

/// Also with warm spares on both nodes: node a's spares fit its next workers (only the world changed) and are
/// used; node b's placement changed (GPU 1 gone), so its spares are discarded and its workers start cold.
#[test]
fn double_bit_ecc_with_exclude_continues_with_one_worker_fewer() {
    let dir = tempfile::tempdir().unwrap();
    let (a_gpus, b_gpus) = (FakeNode::new(dir.path(), "a", 4, &[]), FakeNode::new(dir.path(), "b", 4, &[]));
    let conf = "last_call_timeout=3";
    let warm = ["--warm-spares=json", "--warm-spares-delay=0"];
    let mut a = Agent::start_with_env(
        "a",
        &agent_args("2", "gpu", "127.0.0.1:0", &format!("is_host=1,{conf}"), &warm, dir.path()),
        &a_gpus.env(),
    );
    let port = a.hosted_port();
    let mut b = Agent::start_with_env(
        "b",
        &agent_args("2", "gpu", &format!("127.0.0.1:{port}"), conf, &["--on-gpu-fault=exclude", warm[0], warm[1]], dir.path()),
        &b_gpus.env(),
    );
    wait_world(dir.path(), 8, 8);
    b_gpus.inject(1, "dbe 1");
    let world = wait_world(dir.path(), 7, 7);
    let on_b: Vec<&Start> = world.iter().filter(|s| s.node == "b").collect();
    assert_eq!(on_b.len(), 3, "{world:?}");
    for s in &on_b {
        assert_eq!(s.visible, "0,2,3", "GPU 1 is no longer visible: {s:?}");
    }
    let mut ranks: Vec<u32> = world.iter().map(|s| s.rank).collect();
    ranks.sort();
    assert_eq!(ranks, (0..7).collect::<Vec<_>>(), "global ranks recomputed across nodes");
    assert!(world.iter().all(|s| s.restart_count == 0), "an excluded GPU spends no restart: {world:?}");
    std::fs::write(dir.path().join("finish"), "").unwrap();
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(b.exit_code(LONG), Some(0), "{}", b.log());
    assert!(a.log().contains("4 of 4 worker(s) started from warm spares"), "{}", a.log());
    assert!(!b.log().contains("started from warm spares"), "{}", b.log());
}

#[test]
fn no_nvml_library_runs_a_cpu_job_with_one_info_line() {
    let out = run(
        muster().args(["--nproc-per-node=1", "--no-python", "true"]).env("MUSTER_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"),
        LONG,
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stderr.matches("GPU health is off").count(), 1, "{}", out.stderr);
}

#[test]
fn a_foreign_process_on_a_gpu_delays_then_fails_the_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 2, &[(1, 4242)]);
    let out = run(
        muster()
            .args(["--nproc-per-node=2", "--gpu-wait-timeout=1"])
            .arg(fixture("elastic_worker.py"))
            .arg(dir.path())
            .envs(gpus.env()),
        LONG,
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let last = out.stderr.lines().last().unwrap_or_default();
    assert!(last.contains("process 4242") && last.contains("GPU 1"), "{last}");
    assert!(out.stderr.contains("waiting before starting workers"), "it waited first: {}", out.stderr);
    assert!(!dir.path().join("starts").exists(), "no worker may start");
}

#[test]
fn doctor_prints_the_inventory_and_fails_after_xid_79() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 2, &[]);
    let healthy = run(muster().args(["doctor", "--listen=1"]).envs(gpus.env()), LONG);
    assert_eq!(healthy.status.code(), Some(0), "{}{}", healthy.stdout, healthy.stderr);
    for uuid in ["GPU-a0000000-0000-0000-0000-000000000000", "GPU-a0000001-0000-0000-0000-000000000000"] {
        assert!(healthy.stdout.contains(uuid), "{}", healthy.stdout);
    }
    assert!(healthy.stdout.contains("570.86.15") && healthy.stdout.contains("verdict: OK"));
    std::fs::write(&gpus.status, "").unwrap(); // so `inject` waits for this run's registration
    let mut cmd = muster();
    cmd.args(["doctor", "--listen=5"]).envs(gpus.env()).stdout(std::process::Stdio::piped());
    let mut doctor = Guard::spawn(&mut cmd);
    gpus.inject(1, "xid 1 79");
    let status = doctor.wait_timeout(LONG).expect("doctor finished");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut doctor.0.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("XID 79") && out.contains("UNHEALTHY"), "{out}");
}

#[test]
fn the_watcher_keeps_the_policy_after_xid_79_and_reports_a_lost_gpu_once() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 2, &[]);
    let mut cmd = muster();
    cmd.args(["doctor", "--listen=8", "--xid-policy=79=ignore"]).envs(gpus.env()).stdout(std::process::Stdio::piped());
    let mut doctor = Guard::spawn(&mut cmd);
    // XID 79 leaves GPU 1 lost (the driver answers nothing more for it): the XID 13 after it never comes,
    // the watcher reads the loss once; GPU 0 is still watched.
    gpus.inject(1, "xid 1 79");
    gpus.inject(1, "xid 1 13");
    gpus.inject(0, "xid 0 13");
    let status = doctor.wait_timeout(LONG).expect("doctor finished");
    let mut out = String::new();
    std::io::Read::read_to_string(&mut doctor.0.stdout.take().unwrap(), &mut out).unwrap();
    let faults = |gpu: &str| -> Vec<String> { out.lines().filter(|l| l.starts_with(gpu)).map(str::to_string).collect() };
    let gpu1 = "fault: GPU 1 (GPU-a0000001-0000-0000-0000-000000000000)";
    assert_eq!(faults(gpu1), [format!("{gpu1}: XID 79 -> ignore"), format!("{gpu1}: GPU lost -> ignore")], "{out}");
    let gpu0 = "fault: GPU 0 (GPU-a0000000-0000-0000-0000-000000000000)";
    assert_eq!(faults(gpu0), [format!("{gpu0}: XID 13 -> restart")], "{out}");
    assert_eq!(status.code(), Some(0), "the policy ignores 79 and GPU lost: {out}");
}

#[test]
fn a_node_reboot_recovery_action_drains_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 2, &[]);
    let mut a = Agent::start_with_env("a", &agent_args("1", "2", "127.0.0.1:0", "is_host=1", &[], dir.path()), &gpus.env());
    wait_world(dir.path(), 2, 2);
    // No event: only the watcher's periodic read of field 230 can see it.
    gpus.inject(0, "recovery 0 2");
    assert_eq!(a.exit_code(LONG), Some(75), "{}", a.log());
    assert!(a.log().contains("driver recovery action 2"), "{}", a.log());
}

/// With hang detection on a GPU node, the workers get torch's NCCL flight recorder, dumping into the attempt
/// directory beside the stacks; a variable the user set is kept; without `--hang-timeout`, none is set.
#[test]
fn hang_detection_on_a_gpu_node_keeps_the_nccl_flight_recorder_with_the_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let gpus = FakeNode::new(dir.path(), "a", 1, &[]);
    let logs = dir.path().join("logs");
    let show = "echo TRACE=$TORCH_NCCL_TRACE_BUFFER_SIZE DUMP=$TORCH_NCCL_DUMP_ON_TIMEOUT FILE=$TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
    let job = |extra: &[&str], user: &[(&str, &str)]| {
        run(
            muster()
                .args(["--nproc-per-node=1", "--tee=3", "--no-python"])
                .arg(format!("--log-dir={}", logs.display()))
                .args(extra)
                .args(["sh", "-c", show])
                .envs(gpus.env())
                .envs(user.iter().copied()),
            LONG,
        )
    };
    let on = job(&["--hang-timeout=60"], &[("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")]);
    assert!(on.status.success(), "{}", on.stderr);
    let line = on.stdout.lines().find(|l| l.contains("TRACE=")).unwrap_or_else(|| panic!("{}", on.stdout));
    assert!(line.contains("TRACE=50 DUMP=1 FILE=") && line.contains("/attempt_0/nccl_trace_rank_"), "{line}");
    assert!(line.contains(&logs.display().to_string()), "{line}");
    let off = job(&[], &[]);
    assert!(off.status.success(), "{}", off.stderr);
    assert!(off.stdout.contains("TRACE= DUMP= FILE="), "{}", off.stdout);
}

/// The hook's exit status is its own even while the agent reaps a storm of adopted orphans: the hook leaves
/// 300 short-lived processes to the agent (a subshell's `&` orphans them) and exits 3 in the middle of it.
#[test]
fn a_failing_hook_is_reported_under_a_busy_zombie_reaper() {
    for run in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let gpus = FakeNode::new(dir.path(), "a", 1, &[]);
        let hook = "for i in $(seq 300); do (sleep 0.0$((i % 10)) &); done; exit 3";
        let mut a = Agent::start_with_env(
            "a",
            &agent_args("1:2", "gpu", "127.0.0.1:0", "is_host=1,last_call_timeout=1", &["--on-node-fault", hook], dir.path()),
            &gpus.env(),
        );
        let started = eventually(LONG, || starts(dir.path()).len() == 1);
        assert!(started, "run {run}: no worker started:\n{}", a.log());
        gpus.inject(0, "xid 0 79");
        assert_eq!(a.exit_code(LONG), Some(75), "run {run}: {}", a.log());
        let log = a.log();
        assert!(log.contains("failed: exit status: 3"), "run {run}: the hook's status was lost:\n{log}");
        assert!(!log.contains("cannot wait for the hook"), "run {run}:\n{log}");
    }
}
