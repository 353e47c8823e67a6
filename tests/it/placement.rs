//! The placement plan is applied to real workers: each worker's own CPU affinity (read back from
//! /proc/self/status) and CUDA_VISIBLE_DEVICES match what `muster plan` prints for the same job.
//!
//! The fake GPUs sit on a sysfs tree generated for the CPUs this test may actually use, so the kernel accepts
//! the affinity (a fixture describing another machine's CPUs could not be applied here).

use crate::common;

use common::fake_nvml;

use std::path::Path;
use std::time::Duration;

use common::*;

/// CPUs this process may run on.
fn allowed_cpus() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    parse_cpulist(&list)
}

fn parse_cpulist(s: &str) -> Vec<u32> {
    s.split(',')
        .filter(|r| !r.is_empty())
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => (a.trim().parse().unwrap()..=b.trim().parse().unwrap()).collect::<Vec<u32>>(),
            None => vec![r.trim().parse().unwrap()],
        })
        .collect()
}

/// One NUMA node with `cpus` (one core each, no SMT) and `gpus` GPUs on it.
fn machine(dir: &Path, cpus: &[u32], gpus: usize) -> Vec<(&'static str, String)> {
    let sys = dir.join("sys");
    let list = cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let node = sys.join("devices/system/node/node0");
    std::fs::create_dir_all(&node).unwrap();
    std::fs::write(node.join("cpulist"), format!("{list}\n")).unwrap();
    for cpu in cpus {
        let topo = sys.join(format!("devices/system/cpu/cpu{cpu}/topology"));
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("physical_package_id"), "0\n").unwrap();
        std::fs::write(topo.join("thread_siblings_list"), format!("{cpu}\n")).unwrap();
    }
    let mut list_gpus = Vec::new();
    for i in 0..gpus {
        let bus = 0x18 + i * 0x10;
        let pci = sys.join(format!("bus/pci/devices/0000:{bus:02x}:00.0"));
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("numa_node"), "0\n").unwrap();
        list_gpus.push(serde_json::json!({
            "uuid": format!("GPU-c{i:07}-0000-0000-0000-000000000000"),
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": format!("00000000:{bus:02x}:00.0"),
            "memory_total": 85_899_345_920u64,
            "numa_node": 0,
            "cpu_affinity": cpus,
        }));
    }
    let topology: Vec<Vec<&str>> = (0..gpus).map(|i| (0..gpus).map(|j| if i == j { "X" } else { "NV18" }).collect()).collect();
    let config = dir.join("nvml.json");
    let cfg = serde_json::json!({"driver_version": "570.86.15", "gpus": list_gpus, "topology": topology});
    std::fs::write(&config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    std::fs::write(dir.join("events"), "").unwrap();
    vec![
        ("MUSTER_NVML_LIBRARY", fake_nvml::library().display().to_string()),
        ("FAKE_NVML_CONFIG", config.display().to_string()),
        ("FAKE_NVML_EVENTS_FILE", dir.join("events").display().to_string()),
        ("MUSTER_SYSFS_ROOT", sys.display().to_string()),
    ]
}

#[test]
fn workers_run_where_the_plan_says() {
    let dir = tempfile::tempdir().unwrap();
    let cpus: Vec<u32> = allowed_cpus().into_iter().take(2).collect();
    let nproc = cpus.len();
    let env = machine(dir.path(), &cpus, 4);
    let nproc_flag = format!("--nproc-per-node={nproc}");

    let plan = run(
        muster().args(["plan", &nproc_flag, "--numa-binding=exclusive", "--format=json"]).envs(env.clone()),
        Duration::from_secs(60),
    );
    assert!(plan.status.success(), "{}", plan.stderr);
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();

    let script = dir.path().join("where.py");
    std::fs::write(
        &script,
        "import os\nallowed = [l.split(':', 1)[1].strip() for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0]\n\
         line = ' '.join(['WHERE', os.environ['LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'], allowed])\n\
         os.write(1, (line + '\\n').encode())  # one write: workers share the agent's stdout\n",
    )
    .unwrap();
    let out = run(muster().args([&nproc_flag, "--numa-binding=exclusive"]).arg(&script).envs(env), Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<Vec<&str>> =
        out.stdout.lines().filter(|l| l.starts_with("WHERE ")).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.len(), nproc, "{}", out.stdout);
    let visible = plan["visible_devices"].as_str().unwrap();
    let mut seen_cpus = Vec::new();
    for line in &lines {
        let rank: usize = line[1].parse().unwrap();
        assert_eq!(line[2], visible, "every worker sees the same ordered device list");
        assert_eq!(line[3], "PCI_BUS_ID");
        let planned: Vec<u32> =
            plan["ranks"][rank]["cpus"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap() as u32).collect();
        assert_eq!(parse_cpulist(line[4]), planned, "rank {rank}'s affinity is the planned CPU set");
        seen_cpus.extend(planned);
    }
    let distinct: std::collections::BTreeSet<u32> = seen_cpus.iter().copied().collect();
    assert_eq!(distinct.len(), seen_cpus.len(), "exclusive mode: disjoint CPU sets");
}

#[test]
fn virtual_local_rank_gives_each_worker_its_own_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let env = machine(dir.path(), &allowed_cpus()[..1], 2);
    let script = dir.path().join("v.py");
    std::fs::write(
        &script,
        "import os\nos.write(1, ' '.join(['V', os.environ['RANK'], os.environ['LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES']]).encode() + b'\\n')\n",
    )
        .unwrap();
    let out = run(muster().args(["--nproc-per-node=2", "--virtual-local-rank"]).arg(&script).envs(env), Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let mut lines: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("V ")).collect();
    lines.sort();
    assert_eq!(lines, ["V 0 0 0", "V 1 0 1"], "LOCAL_RANK=0 and one GPU per worker, as torchrun: {}", out.stderr);
}

#[test]
fn too_many_workers_for_the_usable_gpus_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let env = machine(dir.path(), &allowed_cpus()[..1], 2);
    let out = run(muster().args(["--nproc-per-node=3", "--gpus=0,1", "--no-python", "true"]).envs(env), Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    let line = out.stderr.lines().last().unwrap_or_default();
    assert!(line.contains("--nproc-per-node") && line.contains('3') && line.contains('2'), "{line}");
}

/// The HGX fixture's GPUs (NV18 all-to-all, GPUs 0-3 on NUMA 0, 4-7 on NUMA 1) on a sysfs tree whose two NUMA
/// nodes are two CPUs this test may use.
#[test]
fn an_hgx_job_with_exclusive_binding_runs_each_rank_on_its_gpus_node() {
    let dir = tempfile::tempdir().unwrap();
    let cpus: Vec<u32> = allowed_cpus().into_iter().take(2).collect();
    assert_eq!(cpus.len(), 2, "this test needs two CPUs");
    let sys = dir.path().join("sys");
    let fixture_path = fixture("gpu/hgx-h100.json");
    let hgx: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fixture_path).unwrap()).unwrap();
    for (node, cpu) in cpus.iter().enumerate() {
        let n = sys.join(format!("devices/system/node/node{node}"));
        std::fs::create_dir_all(&n).unwrap();
        std::fs::write(n.join("cpulist"), format!("{cpu}\n")).unwrap();
        let topo = sys.join(format!("devices/system/cpu/cpu{cpu}/topology"));
        std::fs::create_dir_all(&topo).unwrap();
        std::fs::write(topo.join("physical_package_id"), format!("{node}\n")).unwrap();
        std::fs::write(topo.join("thread_siblings_list"), format!("{cpu}\n")).unwrap();
    }
    for gpu in hgx["gpus"].as_array().unwrap() {
        let bdf = gpu["pci_bus_id"].as_str().unwrap().to_lowercase().replacen("00000000:", "0000:", 1);
        let pci = sys.join(format!("bus/pci/devices/{bdf}"));
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(pci.join("numa_node"), format!("{}\n", gpu["numa_node"])).unwrap();
    }
    std::fs::write(dir.path().join("events"), "").unwrap();
    let env = vec![
        ("MUSTER_NVML_LIBRARY", fake_nvml::library().display().to_string()),
        ("FAKE_NVML_CONFIG", fixture_path.display().to_string()),
        ("FAKE_NVML_EVENTS_FILE", dir.path().join("events").display().to_string()),
        ("MUSTER_SYSFS_ROOT", sys.display().to_string()),
    ];
    let script = dir.path().join("where.py");
    std::fs::write(
        &script,
        "import os\nallowed = [l.split(':', 1)[1].strip() for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0]\n\
         os.write(1, ' '.join(['WHERE', os.environ['LOCAL_RANK'], os.environ['CUDA_VISIBLE_DEVICES'], allowed]).encode() + b'\\n')\n",
    )
    .unwrap();
    let flags = ["--nproc-per-node=2", "--gpus=0,4", "--numa-binding=exclusive"];
    let plan = run(muster().arg("plan").args(flags).arg("--format=json").envs(env.clone()), Duration::from_secs(60));
    assert!(plan.status.success(), "{}", plan.stderr);
    let plan: serde_json::Value = serde_json::from_str(&plan.stdout).unwrap();
    let out = run(muster().args(flags).arg(&script).envs(env), Duration::from_secs(60));
    assert!(out.status.success(), "{}", out.stderr);
    let mut lines: Vec<Vec<&str>> =
        out.stdout.lines().filter(|l| l.starts_with("WHERE ")).map(|l| l.split_whitespace().collect()).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    for (rank, line) in lines.iter().enumerate() {
        assert_eq!(line[1], rank.to_string());
        assert_eq!(line[2], plan["visible_devices"].as_str().unwrap(), "the same device list for every worker");
        assert_eq!(plan["ranks"][rank]["numa_node"], rank as u64, "rank {rank} got a GPU on NUMA node {rank}");
        assert_eq!(parse_cpulist(line[3]), [cpus[rank]], "rank {rank} runs on its GPU's node");
    }
}
