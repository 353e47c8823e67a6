//! muster on a real two-node Slurm (`scripts/slurm/cluster.sh`, which `scripts/test.sh` starts and stops):
//! `srun` with no rendezvous flags, and preemption as Slurm does it (`scancel --signal=USR1`, then `scancel`:
//! SIGCONT + SIGTERM to every process of the step, SIGKILL after KillWait).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(180);

/// One job at a time: every step's agents take the context's default endpoint, the first node's port 29400,
/// and here both nodes are one machine, so a concurrent job's agents would share (and outlive, or not) the
/// store one of them hosts.
static ONE_JOB: Mutex<()> = Mutex::new(());

fn one_job() -> MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The cluster's config; the test fails (never skips) without a running cluster.
fn slurm_conf() -> PathBuf {
    let conf = std::env::var_os("SLURM_CONF").map(PathBuf::from).expect(
        "SLURM_CONF is not set: run the tests through scripts/test.sh, which installs Slurm (ensure_slurm in \
         scripts/lib.sh) and starts a two-node cluster (scripts/slurm/cluster.sh start DIR)",
    );
    assert!(conf.is_file(), "SLURM_CONF={} is missing: start the cluster with scripts/slurm/cluster.sh", conf.display());
    conf
}

/// A Slurm client command (`srun`, `sbatch`, `scancel`, ...) for the test cluster.
fn slurm(tool: &str) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("SLURM_CONF", slurm_conf()).env("PATH", path_with_venv());
    cmd
}

/// `srun` over both nodes, one agent each, with a job name the test can find it by.
fn srun(name: &str) -> Command {
    let mut cmd = slurm("srun");
    cmd.args(["-N2", "--ntasks-per-node=1", "-J", name]);
    cmd.arg(env!("CARGO_BIN_EXE_muster"));
    cmd
}

fn job_name(what: &str) -> String {
    format!("muster-{what}-{}", std::process::id())
}

/// The id of the running job named `name`, once it runs.
fn job_id(name: &str) -> String {
    let mut id = String::new();
    let found = eventually(Duration::from_secs(60), || {
        let out = slurm("squeue").args(["-h", "-n", name, "-t", "RUNNING", "-o", "%i"]).output();
        id = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
        !id.is_empty()
    });
    assert!(found, "job {name} never ran");
    id
}

fn scancel(args: &[&str]) {
    let out = slurm("scancel").args(args).output().expect("scancel runs");
    assert!(out.status.success(), "scancel {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn wait_ready(dir: &Path, ranks: u32) {
    let all = || (0..ranks).all(|r| dir.join(format!("{r}.ready")).exists());
    assert!(eventually(LONG, all), "the workers never became ready in {}", dir.display());
}

/// The signals rank `r` received, in order (worker.py's `signals` mode).
fn signals(dir: &Path, r: u32) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(format!("{r}.signals"))).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

/// PIDs of live processes whose command line names `dir` (the agents, their guards and workers do).
fn processes_naming(dir: &Path) -> Vec<i32> {
    let needle = dir.as_os_str().as_encoded_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.windows(needle.len()).any(|w| w == needle) && alive(*pid)
        })
        .collect()
}

fn assert_nothing_left(dir: &Path) {
    let gone = eventually(Duration::from_secs(20), || processes_naming(dir).is_empty());
    assert!(gone, "processes of the step are left: {:?}", processes_naming(dir));
}

#[test]
fn srun_trains_with_no_rendezvous_flags() {
    let _one = one_job();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let out = run(
        srun(&job_name("train"))
            .args(["--nproc-per-node", "2"])
            .arg(example("train.py"))
            .args(["--steps", "20", "--ckpt-dir"])
            .arg(&ckpt),
        LONG,
    );
    assert_eq!(out.status.code(), Some(0), "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("done: steps=20 world_size=4 loss="), "{}\n{}", out.stdout, out.stderr);
    // The banner says where each filled value came from.
    assert!(out.stderr.contains("launch context slurm"), "{}", out.stderr);
}

#[test]
fn group_rank_is_slurm_nodeid_and_the_run_id_is_job_dot_step() {
    let _one = one_job();
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        srun(&job_name("env")).args(["--nproc-per-node", "2"]).arg(fixture("dump_env.py")).arg(dir.path()),
        LONG,
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    let mut ranks = Vec::new();
    for r in 0..4 {
        let text = std::fs::read_to_string(dir.path().join(format!("{r}.json"))).expect("every rank dumps its env");
        let env: serde_json::Value = serde_json::from_str(&text).expect("json");
        let var = |k: &str| env[k].as_str().unwrap_or_else(|| panic!("rank {r}: no {k} in {env}")).to_string();
        assert_eq!(var("GROUP_RANK"), var("SLURM_NODEID"), "rank {r}");
        assert_eq!(var("TORCHELASTIC_RUN_ID"), format!("{}.{}", var("SLURM_JOB_ID"), var("SLURM_STEP_ID")), "rank {r}");
        assert_eq!(var("WORLD_SIZE"), "4", "rank {r}");
        ranks.push(var("RANK"));
    }
    assert_eq!(ranks, ["0", "1", "2", "3"]);
}

#[test]
fn scancel_usr1_then_scancel_reach_the_workers_in_order_and_the_step_exits_143() {
    let _one = one_job();
    let dir = tempfile::tempdir().unwrap();
    let name = job_name("preempt");
    let mut cmd = srun(&name);
    cmd.args(["--nproc-per-node", "2"]).arg(fixture("worker.py")).arg(dir.path()).arg("signals");
    let stderr = std::fs::File::create(dir.path().join("srun.err")).unwrap();
    let mut step = Guard::spawn(cmd.stdout(Stdio::null()).stderr(stderr));
    wait_ready(dir.path(), 4);
    let job = job_id(&name);
    // Slurm's warning reaches every process of the step: the workers, and the agents, which must survive it.
    scancel(&["--signal=USR1", &job]);
    let warned = || (0..4).all(|r| signals(dir.path(), r).iter().any(|s| s == "SIGUSR1"));
    assert!(eventually(LONG, warned), "not every worker got SIGUSR1");
    scancel(&[&job]);
    let status = step.wait_timeout(LONG).expect("srun ends after scancel");
    let log = std::fs::read_to_string(dir.path().join("srun.err")).unwrap_or_default();
    assert_eq!(status.code(), Some(143), "{log}");
    for task in 0..2 {
        assert!(log.contains(&format!("task {task}: Exited with exit code 143")), "each agent exits 143: {log}");
    }
    for r in 0..4 {
        let got = signals(dir.path(), r);
        let at = |name: &str| got.iter().position(|s| s == name);
        assert!(matches!((at("SIGUSR1"), at("SIGTERM")), (Some(u), Some(t)) if u < t), "rank {r}: {got:?}");
    }
    assert_eq!(log.matches("it is not in --signals-to-handle, so it is not forwarded").count(), 2, "{log}");
    assert!(!log.contains("orphan guard process"), "the guards survived the warning: {log}");
    assert_nothing_left(dir.path());
}

/// `scancel` signals every process of the step at once, so workers that die of the SIGTERM (Python's
/// default) may be gone before their agent handles its own: each agent still ends 143 (preempted, requeue),
/// never 1 (a worker failure) or 4 (closed). `MUSTER_SCANCEL_RUNS=N` repeats it (scripts/stress).
#[test]
fn scancel_with_workers_dying_of_sigterm_ends_143_on_every_agent() {
    let runs: usize = std::env::var("MUSTER_SCANCEL_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let _one = one_job();
    let mut codes = Vec::new();
    for run in 0..runs {
        let dir = tempfile::tempdir().unwrap();
        let name = job_name(&format!("scancel{run}"));
        let mut cmd = srun(&name);
        cmd.args(["--nproc-per-node", "2"]).arg(fixture("worker.py")).arg(dir.path()).arg("sleep");
        let stderr = std::fs::File::create(dir.path().join("srun.err")).unwrap();
        let mut step = Guard::spawn(cmd.stdout(Stdio::null()).stderr(stderr));
        wait_ready(dir.path(), 4);
        scancel(&[&job_id(&name)]);
        let status = step.wait_timeout(LONG).expect("srun ends after scancel");
        let log = std::fs::read_to_string(dir.path().join("srun.err")).unwrap_or_default();
        let exited = (0..2).filter(|t| log.contains(&format!("task {t}: Exited with exit code 143"))).count();
        codes.push((status.code(), exited));
        assert_eq!((status.code(), exited), (Some(143), 2), "run {run}: each agent exits 143: {log}");
        assert_nothing_left(dir.path());
    }
    eprintln!("SCANCEL | {runs} runs | every agent 143: {} of {runs}", codes.iter().filter(|c| **c == (Some(143), 2)).count());
}

/// `sbatch --signal=B:USR1@T` warns the batch shell alone: a listed SIGUSR1 is forwarded, once, and the
/// workers go on until `scancel`.
#[test]
fn a_batch_warning_is_forwarded_when_listed_and_scancel_ends_the_job_with_143() {
    let _one = one_job();
    let dir = tempfile::tempdir().unwrap();
    let name = job_name("batch");
    let muster_cmd = format!(
        "exec {} --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --nproc-per-node 2 {} {} signals",
        env!("CARGO_BIN_EXE_muster"),
        fixture("worker.py").display(),
        dir.path().display()
    );
    let log = dir.path().join("batch.log");
    let out = slurm("sbatch")
        .args(["--parsable", "-N1", "-J", &name, "-o"])
        .arg(&log)
        .args(["--wrap", &muster_cmd])
        .output()
        .expect("sbatch runs");
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_ready(dir.path(), 2);
    // What Slurm does at T seconds before the end with B:USR1.
    scancel(&["--batch", "--signal=USR1", &job]);
    let warned = || (0..2).all(|r| signals(dir.path(), r) == ["SIGUSR1"]);
    assert!(eventually(LONG, warned), "{:?} {:?}", signals(dir.path(), 0), signals(dir.path(), 1));
    scancel(&[&job]);
    // Out of the queue (COMPLETING is still in it) once every process of the job has ended.
    let gone = eventually(LONG, || {
        let out = slurm("squeue").args(["-h", "-j", &job]).output();
        out.map(|o| o.status.success() && o.stdout.is_empty()).unwrap_or(false)
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(gone, "job {job} did not end: {text}");
    let out = slurm("scontrol").args(["show", "job", &job]).output().expect("scontrol runs");
    let state = String::from_utf8_lossy(&out.stdout);
    assert!(state.contains("ExitCode=143:0"), "the batch shell (muster) exits 143: {state}\n{text}");
    for r in 0..2 {
        // SIGCONT comes with SIGTERM; Python runs the lower-numbered handler first, so it may not be seen.
        let got: Vec<String> = signals(dir.path(), r).into_iter().filter(|s| s != "SIGCONT").collect();
        assert_eq!(got, ["SIGUSR1", "SIGTERM"], "rank {r}: {text}");
    }
    assert_nothing_left(dir.path());
}
