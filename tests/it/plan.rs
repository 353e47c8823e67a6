//! `muster plan` end to end: the real binary, NVML served by the fake library from the GPU fixtures, and the
//! fixtures' fake sysfs trees (2 sockets × 8 cores × 2 threads; node0 = 0-7,16-23, node1 = 8-15,24-31).

use crate::common;
use common::fake_nvml;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

struct Box8 {
    config: &'static str,
    sysfs: &'static str,
}

const PCIE: Box8 = Box8 { config: "pcie-8gpu.json", sysfs: "sysfs-pcie" };
const HGX: Box8 = Box8 { config: "hgx-h100.json", sysfs: "sysfs-hgx" };

/// Runs `muster plan ARGS` on `machine` with extra environment `env`; (exit code, stdout, stderr).
fn plan(machine: &Box8, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::muster();
    cmd.arg("plan")
        .args(args)
        .env("MUSTER_NVML_LIBRARY", fake_nvml::library())
        .env("FAKE_NVML_CONFIG", fake_nvml::fixture(machine.config))
        .env("FAKE_NVML_EVENTS_FILE", dir.path().join("events"))
        .env("MUSTER_SYSFS_ROOT", fake_nvml::fixture(machine.sysfs));
    // The test host's own GPU selection must not leak in.
    // Nor its launch context (docs/contexts.md).
    for var in ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_JOBID"]
        .into_iter()
        .chain(["MASTER_ADDR", "VC_TASK_INDEX", "VK_TASK_INDEX", "JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"])
    {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::run(&mut cmd, Duration::from_secs(60));
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

fn plan_json(machine: &Box8, args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut all = vec!["--format", "json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = plan(machine, &all, env);
    assert_eq!(code, 0, "muster plan {args:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn ranks(p: &Value) -> &Vec<Value> {
    p["ranks"].as_array().expect("ranks")
}

fn gpus(p: &Value) -> Vec<u64> {
    ranks(p).iter().map(|r| r["gpu_index"].as_u64().expect("gpu_index")).collect()
}

fn cpus(r: &Value) -> Vec<u32> {
    r["cpus"].as_array().expect("cpus").iter().map(|c| c.as_u64().expect("cpu") as u32).collect()
}

fn node_cpus(node: u64) -> BTreeSet<u32> {
    match node {
        0 => (0..8).chain(16..24).collect(),
        1 => (8..16).chain(24..32).collect(),
        n => panic!("no NUMA node {n} in the fixtures"),
    }
}

/// The PCIe fixture's switches (NVML indices): A and B on socket 0, C and D on socket 1.
const SWITCHES: [[u64; 2]; 4] = [[0, 4], [1, 5], [2, 6], [3, 7]];

fn switch_of(gpu: u64) -> usize {
    SWITCHES.iter().position(|s| s.contains(&gpu)).expect("gpu on a switch")
}

#[test]
fn pcie_ranks_fill_one_socket_with_switch_mates_adjacent() {
    let p = plan_json(&PCIE, &["--numa-binding", "node"], &[]);
    let order = gpus(&p);
    assert_eq!(order.len(), 8);
    // Ranks 0-3 are socket 0's GPUs (switches A and B), 4-7 socket 1's.
    assert!(order[..4].iter().all(|g| switch_of(*g) < 2), "{order:?}");
    assert!(order[4..].iter().all(|g| switch_of(*g) >= 2), "{order:?}");
    // Ranks (0,1), (2,3), ... are switch pairs.
    for (i, pair) in order.chunks(2).enumerate() {
        assert_eq!(switch_of(pair[0]), switch_of(pair[1]), "{order:?}");
        assert_eq!(ranks(&p)[2 * i + 1]["link_to_previous"], "PIX");
    }
    assert_eq!(order, [0, 4, 1, 5, 2, 6, 3, 7]);
    assert_eq!(p["visible_devices"], "0,4,1,5,2,6,3,7");
    for r in ranks(&p) {
        let node = r["numa_node"].as_u64().expect("numa_node");
        assert_eq!(node, if switch_of(r["gpu_index"].as_u64().unwrap()) < 2 { 0 } else { 1 });
        assert_eq!(cpus(r).into_iter().collect::<BTreeSet<_>>(), node_cpus(node), "rank {}", r["local_rank"]);
    }
}

#[test]
fn pcie_exclusive_gives_disjoint_physical_cores_on_the_gpu_node() {
    let p = plan_json(&PCIE, &["--numa-binding", "exclusive"], &[]);
    let mut seen = BTreeSet::new();
    for r in ranks(&p) {
        let cpus = cpus(r);
        let node = node_cpus(r["numa_node"].as_u64().expect("numa_node"));
        assert_eq!(cpus.len(), 4, "2 whole cores each: {r}");
        for c in &cpus {
            assert!(node.contains(c), "cpu {c} off the GPU's node: {r}");
            // Whole cores: every CPU's SMT sibling (c ± 16) comes with it.
            assert!(cpus.contains(&((c + 16) % 32)), "cpu {c} without its sibling: {r}");
            assert!(seen.insert(*c), "cpu {c} given to two ranks");
        }
    }
    assert_eq!(seen.len(), 32);
}

#[test]
fn inherited_cuda_visible_devices_are_kept_and_reordered() {
    let p = plan_json(&PCIE, &["--numa-binding", "node"], &[("CUDA_VISIBLE_DEVICES", "5,2,7,1")]);
    assert_eq!(gpus(&p), [1, 5, 2, 7]);
    assert_eq!(p["visible_devices"], "1,5,2,7");
    assert_eq!(ranks(&p)[1]["link_to_previous"], "PIX");
    for r in ranks(&p) {
        let node = r["numa_node"].as_u64().expect("numa_node");
        assert!(cpus(r).iter().all(|c| node_cpus(node).contains(c)), "{r}");
    }

    // By UUID: the plan names GPUs by UUID too.
    let uuids = "GPU-55555555-0000-4000-8000-000000000200,GPU-11111111";
    let p = plan_json(&PCIE, &[], &[("CUDA_VISIBLE_DEVICES", uuids)]);
    assert_eq!(gpus(&p), [1, 5]);
    assert_eq!(
        p["visible_devices"],
        "GPU-11111111-0000-4000-8000-000000000200,GPU-55555555-0000-4000-8000-000000000200"
    );
}

#[test]
fn gpus_flag_selects_and_reorders() {
    let p = plan_json(&PCIE, &["--gpus", "5,2,7,1", "--nproc-per-node", "4"], &[]);
    assert_eq!(gpus(&p), [1, 5, 2, 7]);
    assert_eq!(p["visible_devices"], "1,5,2,7");

    let p = plan_json(&PCIE, &["--gpus", "7,3", "--virtual-local-rank"], &[]);
    assert_eq!(gpus(&p), [3, 7]);
    let own: Vec<&str> = ranks(&p).iter().map(|r| r["visible_devices"].as_str().expect("own device")).collect();
    assert_eq!(own, ["3", "7"]);

    let (code, _, stderr) = plan(&PCIE, &["--gpus", "0,9"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("'--gpus'") && stderr.contains("no GPU 9"), "{stderr}");
}

#[test]
fn too_many_workers_is_a_clear_error() {
    let (code, stdout, stderr) = plan(&PCIE, &["--nproc-per-node", "5"], &[("CUDA_VISIBLE_DEVICES", "5,2,7,1")]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--nproc-per-node 5")
            && stderr.contains("5 workers per node but only 4 usable GPUs")
            && stderr.contains("CUDA_VISIBLE_DEVICES=5,2,7,1"),
        "{stderr}"
    );

    let (code, _, stderr) = plan(&PCIE, &["--nproc-per-node", "9"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("9 workers per node but only 8 usable GPUs"), "{stderr}");

    let (code, _, stderr) = plan(&PCIE, &["--numa-binding", "sideways"], &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--numa-binding"), "{stderr}");
}

#[test]
fn hgx_exclusive_puts_ranks_zero_to_three_on_node_zero() {
    let p = plan_json(&HGX, &["--numa-binding", "exclusive"], &[]);
    assert_eq!(gpus(&p), [0, 1, 2, 3, 4, 5, 6, 7]);
    for r in &ranks(&p)[1..] {
        assert_eq!(r["link_to_previous"], "NV18", "{r}");
    }
    let mut seen = BTreeSet::new();
    for (i, r) in ranks(&p).iter().enumerate() {
        let node = if i < 4 { 0 } else { 1 };
        assert_eq!(r["numa_node"], node, "{r}");
        let cpus = cpus(r);
        assert!(cpus.iter().all(|c| node_cpus(node).contains(c) && seen.insert(*c)), "{r}");
    }
    assert_eq!(cpus(&ranks(&p)[0]), [0, 1, 16, 17]);
}

#[test]
fn table_output() {
    let (code, stdout, stderr) = plan(&PCIE, &["--numa-binding", "node", "--nproc-per-node", "2"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("CUDA_VISIBLE_DEVICES=0,4,1,5,2,6,3,7"), "{stdout}");
    assert!(stdout.contains("0-7,16-23") && stdout.contains("n/a"), "{stdout}");
}

#[test]
fn the_launch_context_is_shown_as_the_agent_would_take_it() {
    let slurm = [
        ("SLURM_JOB_ID", "812"),
        ("SLURM_STEP_ID", "3"),
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "1"),
        ("SLURM_STEP_GPUS", "2,3"),
        ("SLURM_JOB_NODELIST", "gpu[007-008]"),
    ];
    let (code, stdout, stderr) = plan(&PCIE, &[], &slurm);
    assert_eq!(code, 0, "{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        "launch context slurm: nnodes=2 (SLURM_NNODES) node_rank=1 (SLURM_NODEID) rdzv_endpoint=gpu007:21003 \
         (SLURM_JOB_NODELIST) rdzv_id=812.3 (SLURM_JOB_ID.SLURM_STEP_ID)"
    );
    assert!(stdout.contains("2 of 8 GPUs usable (SLURM_STEP_GPUS=2,3)"), "{stdout}");
    let p = plan_json(&PCIE, &[], &slurm);
    assert!(p["context"].as_str().is_some_and(|c| c.starts_with("slurm: nnodes=2")), "{p}");
    assert!(plan_json(&PCIE, &[], &[])["context"].is_null());
}

/// `muster plan` where NVML cannot be loaded, or loads and reports no GPU (args, env); (code, stdout, stderr).
fn plan_without_gpus(no_gpu: &str, args: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::muster();
    cmd.arg("plan").args(args);
    if no_gpu == "no driver" {
        cmd.env("MUSTER_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    } else {
        let config = dir.path().join("nvml.json");
        std::fs::write(&config, r#"{"gpus": []}"#).expect("config");
        cmd.env("MUSTER_NVML_LIBRARY", fake_nvml::library()).env("FAKE_NVML_CONFIG", &config);
    }
    let out = common::run(&mut cmd, Duration::from_secs(30));
    (out.status.code().unwrap_or(-1), out.stdout, out.stderr)
}

#[test]
fn a_host_without_gpus_gets_a_plan_without_gpus() {
    for no_gpu in ["no driver", "no GPU"] {
        let (code, stdout, stderr) = plan_without_gpus(no_gpu, &["--nproc-per-node", "3"]);
        assert_eq!(code, 0, "{no_gpu}: {stdout}{stderr}");
        assert!(stdout.starts_with("no GPU placement: "), "{no_gpu}: {stdout}");
        assert!(stdout.contains("CUDA_VISIBLE_DEVICES not set"), "{stdout}");
        let rows: Vec<Vec<&str>> = stdout.lines().skip(3).map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows.len(), 3, "{stdout}");
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(r[..6], [i.to_string().as_str(), "-", "-", "-", "-", "-"], "{stdout}");
            assert!(r[7] == "(inherited)", "the CPUs workers inherit are shown: {stdout}");
        }

        let (code, stdout, stderr) = plan_without_gpus(no_gpu, &["--format", "json"]);
        assert_eq!(code, 0, "{stderr}");
        let p: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
        assert_eq!(ranks(&p).len(), 1, "the launcher's default, one worker: {p}");
        assert!(ranks(&p)[0]["gpu_index"].is_null() && !cpus(&ranks(&p)[0]).is_empty(), "{p}");

        for bad in [&["--nproc-per-node", "gpu"][..], &["--numa-binding", "node"], &["--gpus", "0"]] {
            let (code, _, stderr) = plan_without_gpus(no_gpu, bad);
            assert_eq!((code, stderr.lines().count()), (2, 1), "{bad:?}: {stderr}");
            assert!(stderr.contains(bad[0]), "{stderr}");
        }
    }
}

#[test]
fn a_lost_gpu_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(fake_nvml::fixture(PCIE.config)).expect("fixture");
    let mut config: Value = serde_json::from_str(&text).expect("fixture JSON");
    config["gpus"][2]["lost"] = Value::Bool(true);
    config["events_file"] = Value::Null;
    let path = dir.path().join("lost.json");
    std::fs::write(&path, config.to_string()).expect("config");
    let mut cmd = common::muster();
    cmd.args(["plan"])
        .env("MUSTER_NVML_LIBRARY", fake_nvml::library())
        .env("FAKE_NVML_CONFIG", &path)
        .env("MUSTER_SYSFS_ROOT", fake_nvml::fixture(PCIE.sysfs));
    let out = common::run(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1), "{}{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("GPU 2 fell off the bus"), "{}", out.stderr);
}
