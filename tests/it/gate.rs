//! The health gate before every join: a failing check drains the node before it joins (exit 75, the hook
//! with the check's name), a healthy node passes the default checks (every other test).

use crate::common;

use common::cluster::*;
use common::gate::{expect_gate_failed, expect_link_drop, hooked_node};
use common::*;

/// `/dev/shm` cannot hold what `--gate-shm-min` asks per worker: the shm check fails, no worker starts,
/// the hook gets the check's name, exit 75.
#[test]
fn a_failing_check_drains_the_node_before_any_worker_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut agent = Agent::start("a", &hooked_node(dir.path(), 2, &["--gate-shm-min=999999999"]));
    let env = expect_gate_failed(&mut agent, dir.path(), "shm", "/dev/shm has");
    assert!(env.contains("MUSTER_FAULT_DETAIL=health check 'shm' failed"), "{env}");
}

/// `muster doctor` prints the gate as a table, every default check ok on this machine.
#[test]
fn doctor_prints_the_health_gate_as_a_table() {
    let out = run(muster().args(["doctor", "--listen=0", "--gate-checks=storage,shm,network"]), LONG);
    for check in ["storage", "shm", "network"] {
        assert!(out.stdout.lines().any(|l| l.starts_with(check) && l.contains(" ok ")), "{check}: {}", out.stdout);
    }
}

/// A FUSE file system (`tests/fixtures/stall_fs.py`) mounted at `mount`, served from `backing`; unmounted
/// (lazily, whatever state its daemon is in) and its daemon killed when dropped.
struct StallFs {
    daemon: Guard,
    mount: std::path::PathBuf,
}

impl StallFs {
    fn mount(backing: &std::path::Path, mount: &std::path::Path) -> StallFs {
        let mut cmd = std::process::Command::new(python());
        cmd.arg(fixture("stall_fs.py")).arg(backing).arg(mount);
        let fs = StallFs { daemon: Guard::spawn(&mut cmd), mount: mount.to_path_buf() };
        let shown = mount.display().to_string();
        let mounted = eventually(LONG, || {
            std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(&shown)))
        });
        assert!(mounted, "the FUSE daemon did not mount {shown} (fusepy and fuse3 come with scripts/test.sh)");
        fs
    }

    /// SIGSTOP: from now on every call under the mount blocks in the kernel, as on a cut-off NFS server.
    fn stall(&self) {
        // SAFETY: plain kill(2) of a process this test started.
        assert_eq!(unsafe { libc::kill(self.daemon.pid(), libc::SIGSTOP) }, 0);
    }
}

impl Drop for StallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("fusermount").arg("-u").arg("-z").arg(&self.mount).status();
        // SAFETY: plain kill(2) of a process this test started.
        unsafe {
            libc::kill(self.daemon.pid(), libc::SIGCONT);
            libc::kill(self.daemon.pid(), libc::SIGKILL);
        }
    }
}

/// A c10d job of light workers (tests/fixtures/incident_worker.py) writing to `dir`; agent `a` hosts the store.
struct LightJob<'a> {
    dir: &'a std::path::Path,
    run_id: String,
    nnodes: &'static str,
    nproc: u32,
    last_call_s: u32,
}

impl LightJob<'_> {
    /// Agent `node`'s arguments, with `extra` options.
    fn args(&self, node: &str, endpoint: &str, extra: &[String]) -> Vec<String> {
        let host = if node == "a" { "is_host=1," } else { "" };
        AgentArgs::c10d(self.nnodes, endpoint)
            .nproc(self.nproc)
            .conf(format!("{host}last_call_timeout={}", self.last_call_s))
            .run_id(&self.run_id)
            .opt("--max-restarts=2")
            .opts(extra)
            .script(fixture("incident_worker.py"))
            .arg(self.dir)
            .build()
    }
}

/// Three nodes; b's `--gate-path` is a FUSE mount whose daemon then stops, and b's worker crashes: the
/// gate before b's rejoin finds the mount not answering within `--gate-timeout`, b drains (exit 75, the
/// hook with `storage`), its agent not held by the blocked probe, and a and c re-form without it.
#[test]
fn a_file_system_that_stops_answering_drains_the_node_and_the_others_reform() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (backing, mount) = (dir.path().join("backing"), dir.path().join("mnt"));
    std::fs::create_dir_all(&backing).expect("backing dir");
    std::fs::create_dir_all(&mount).expect("mount point");
    let fs = StallFs::mount(&backing, &mount);
    let job = LightJob { dir: dir.path(), run_id: format!("gate{}", std::process::id()), nnodes: "2:3", nproc: 1, last_call_s: 1 };
    let hook_out = dir.path().join("hook.env");
    let args = |node: &str, endpoint: &str, extra: &[String]| job.args(node, endpoint, extra);
    let mut a = Agent::start("a", &args("a", "127.0.0.1:0", &[]));
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let hook = format!("env | grep '^MUSTER_FAULT_' > {}", hook_out.display());
    let b_extra = [format!("--gate-path={}", mount.display()), "--gate-timeout=2".into(), "--on-node-fault".into(), hook];
    let mut b = Agent::start("b", &args("b", &endpoint, &b_extra));
    let mut c = Agent::start("c", &args("c", &endpoint, &[]));
    wait_world(dir.path(), 3, 3);

    fs.stall();
    std::fs::write(dir.path().join("crash-b"), "").expect("crash b");
    assert_eq!(b.exit_code(LONG), Some(75), "{}", b.log());
    let log = b.log();
    assert!(log.contains("health check 'storage' failed: it did not finish within 2s"), "{log}");
    let env = std::fs::read_to_string(&hook_out).expect("the hook ran");
    assert!(env.contains("MUSTER_FAULT_KIND=storage"), "{env}");
    let world = wait_world(dir.path(), 2, 2);
    assert!(world.iter().all(|s| s.node != "b"), "a and c re-form without b: {world:?}");
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
    assert_eq!(c.exit_code(LONG), Some(0), "{}", c.log());
    drop(fs);
}

/// Two nodes (`--nnodes 1:2`, a last call of 600 s); b's `--gate-path` goes away, then b's worker crashes:
/// b opens the next round (counting itself), its gate before the rejoin fails and it drains (exit 75). The
/// round it was counted in expects one node fewer: a, already in it, is sealed at once instead of after the
/// last call, and its workers run again in a world of 2 (a shrink waits for nobody).
#[test]
fn a_node_that_drains_at_its_gate_is_not_waited_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gone = dir.path().join("scratch");
    std::fs::create_dir_all(&gone).expect("gate path");
    let job = LightJob { dir: dir.path(), run_id: format!("shrink{}", std::process::id()), nnodes: "1:2", nproc: 2, last_call_s: 600 };
    let args = |node: &str, endpoint: &str, extra: &[String]| job.args(node, endpoint, extra);
    let mut a = Agent::start("a", &args("a", "127.0.0.1:0", &[]));
    let endpoint = format!("127.0.0.1:{}", a.hosted_port());
    let mut b = Agent::start("b", &args("b", &endpoint, &[format!("--gate-path={}", gone.display())]));
    wait_world(dir.path(), 4, 4);

    std::fs::remove_dir(&gone).expect("remove the gate path");
    std::fs::write(dir.path().join("crash-b"), "").expect("crash b");
    assert_eq!(b.exit_code(LONG), Some(75), "{}", b.log());
    assert!(b.log().contains("health check 'storage' failed"), "{}", b.log());
    let world = wait_world(dir.path(), 2, 2);
    assert!(world.iter().all(|s| s.node == "a"), "a re-forms alone: {world:?}");
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    assert_eq!(a.exit_code(LONG), Some(0), "{}", a.log());
}

/// `/dev/shm` a 16 MiB tmpfs (a container's small default), in a mount namespace of the agent's own: with
/// the default `--gate-shm-min` the shm check fails before the first join (exit 75, the hook with `shm`).
#[test]
fn a_small_dev_shm_fails_the_default_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = hooked_node(dir.path(), 2, &[]);
    let program = muster().get_program().to_owned();
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm && exec \"$@\"", "sh"])
        .arg(program)
        .args(&args)
        .env("PATH", path_with_venv())
        .env("MUSTER_TEST_NODE", "a");
    let mut agent = Agent::spawn(&mut cmd);
    expect_gate_failed(&mut agent, dir.path(), "shm", "/dev/shm has 16 MiB free, 2 worker(s) want 256 MiB");
}

/// One agent of two workers on two fake GPUs with `gates`, GPU 1 in the state `line` leaves it in before the
/// agent starts; returns the agent and the directory its workers and hook write to.
fn on_fake_gpus(line: &str, opts: &[&str]) -> (Agent, tempfile::TempDir, common::gpus::FakeNode) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = common::gpus::FakeNode::new(dir.path(), "a", 2, &[]);
    if !line.is_empty() {
        gpus.write(line);
    }
    let agent = Agent::start_with_env("a", &hooked_node(dir.path(), 2, opts), &gpus.env());
    (agent, dir, gpus)
}

/// GPU 1 degraded in a way the fault watcher does not act on, or used by another job's process, before the
/// job starts: the gpu check fails the first join (exit 75, the hook with `gpu`, no worker started).
#[test]
fn a_degraded_gpu_fails_the_gpu_check() {
    let cases = [
        ("remap 1 pending", "GPU 1: a row remap is pending (it takes effect at the next GPU reset)"),
        ("retired 1 pending", "GPU 1: a page retirement is pending (it takes effect at the next GPU reset)"),
        ("clocks 1 0x40", "GPU 1: its clocks are slowed while it runs nothing (ThrottleReasons(HW_THERMAL_SLOWDOWN))"),
        ("clocks 1 0x80", "GPU 1: its clocks are slowed while it runs nothing (ThrottleReasons(HW_POWER_BRAKE_SLOWDOWN))"),
        ("nvlink 1 3 down", "GPU 1 has 17 NVLink(s) up, its peers 18"),
        ("process 1 4242 1048576", "GPU 1 is used by process 4242 (1 MiB), not this job's; GPUs no other job uses"),
    ];
    for (line, saw) in cases {
        let (mut agent, dir, _gpus) = on_fake_gpus(line, &["--gate-checks=gpu"]);
        let saw = if saw.contains("; ") { saw.to_string() } else { format!("{saw}; every GPU answering") };
        expect_gate_failed(&mut agent, dir.path(), "gpu", &saw);
    }
}

/// Every check on healthy fake GPUs passes: the job runs and finishes; a GPU only busy with its clock set by
/// the administrator (not a slowdown) is healthy too.
#[test]
fn healthy_gpus_pass_every_check() {
    let (mut agent, dir, _gpus) = on_fake_gpus("clocks 0 0x4", &["--gate-checks=all"]);
    let world = wait_world(dir.path(), 2, 2);
    assert_eq!(world.len(), 2, "{}", agent.log());
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
}

/// A double-bit ECC error on GPU 1 with `--on-gpu-fault exclude`: the node re-forms on GPU 0 alone, and the
/// gate before that rejoin leaves the excluded GPU (whose error it would fail) out.
#[test]
fn the_gpu_check_leaves_an_excluded_gpu_out() {
    let (mut agent, dir, gpus) = on_fake_gpus("", &["--gate-checks=gpu", "--on-gpu-fault=exclude"]);
    wait_world(dir.path(), 2, 2);
    gpus.inject(1, "dbe 1");
    let world = wait_world(dir.path(), 1, 1);
    assert_eq!(world.len(), 1, "{world:?}\n{}", agent.log());
    assert!(!agent.log().contains("health check"), "{}", agent.log());
    std::fs::write(dir.path().join("finish"), "").expect("finish");
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
}

/// An InfiniBand port (a sysfs tree in `$MUSTER_SYSFS_ROOT`) whose `link_downed` counter rises while the
/// workers run, the port ACTIVE again: by default the agent says so once and the workers train on; with
/// `--on-link-drop drain` the node drains (exit 75, the line, the hook with `network`, its workers gone).
#[test]
fn an_infiniband_link_that_flaps_while_training_is_reported_or_drains_the_node() {
    let saw = "InfiniBand mlx5_0 port 1 went down and up 1 time(s) (link_downed 0 → 1) while the workers ran";
    for drain in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let sysfs = tempfile::tempdir().expect("tempdir");
        let port = sysfs.path().join("class/infiniband/mlx5_0/ports/1");
        std::fs::create_dir_all(port.join("counters")).expect("mkdir");
        std::fs::write(port.join("state"), "4: ACTIVE\n").expect("state");
        std::fs::write(port.join("rate"), "200 Gb/sec (4X HDR)\n").expect("rate");
        std::fs::write(port.join("counters/link_downed"), "0\n").expect("counter");
        let opts: &[&str] = if drain { &["--on-link-drop=drain"] } else { &[] };
        let env = [("MUSTER_SYSFS_ROOT", sysfs.path().display().to_string())];
        let mut agent = Agent::start_with_env("a", &hooked_node(dir.path(), 2, opts), &env);
        let world = wait_world(dir.path(), 2, 2);
        std::fs::write(port.join("counters/link_downed"), "1\n").expect("counter");
        expect_link_drop(&mut agent, dir.path(), &world, saw, drain, || ());
    }
}
