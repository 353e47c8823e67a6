//! A node's fake GPUs for tests: the fake `libnvidia-ml.so` config, the file faults are injected through, and
//! the fake's status log (see fake-nvml/README.md).

use std::path::{Path, PathBuf};

use super::fake_nvml;
use super::*;

pub struct FakeNode {
    pub config: PathBuf,
    pub events: PathBuf,
    pub status: PathBuf,
}

impl FakeNode {
    /// `gpus` H100s; `busy` lists (gpu, pid) compute processes that are already there.
    pub fn new(dir: &Path, name: &str, gpus: usize, busy: &[(usize, u32)]) -> FakeNode {
        FakeNode::with(dir, name, gpus, busy, false)
    }

    /// As `new`; with `attach`, the fake lists each worker as a compute process on the GPU its environment
    /// binds it to (`CUDA_VISIBLE_DEVICES[LOCAL_RANK]`), as CUDA would.
    pub fn with(dir: &Path, name: &str, gpus: usize, busy: &[(usize, u32)], attach: bool) -> FakeNode {
        let node = FakeNode {
            config: dir.join(format!("{name}-nvml.json")),
            events: dir.join(format!("{name}-events")),
            status: dir.join(format!("{name}-status")),
        };
        let list: Vec<serde_json::Value> = (0..gpus)
            .map(|i| {
                let procs: Vec<serde_json::Value> = busy
                    .iter()
                    .filter(|(g, _)| *g == i)
                    .map(|(_, pid)| serde_json::json!({"pid": pid, "used_gpu_memory": 1_048_576}))
                    .collect();
                serde_json::json!({
                    "uuid": format!("GPU-{name}{i:07}-0000-0000-0000-000000000000"),
                    "name": "NVIDIA H100 80GB HBM3",
                    "pci_bus_id": format!("00000000:{:02x}:00.0", 0x18 + i * 0x10),
                    "memory_total": 85_899_345_920u64,
                    "numa_node": 0,
                    "cpu_affinity": [0, 1],
                    "supported_events": ["xid", "dbe", "sbe"],
                    "processes": procs,
                })
            })
            .collect();
        let topology: Vec<Vec<String>> =
            (0..gpus).map(|i| (0..gpus).map(|j| if i == j { "X".into() } else { "NV18".into() }).collect()).collect();
        let mut cfg = serde_json::json!({"driver_version": "570.86.15", "gpus": list, "topology": topology});
        if attach {
            cfg["attach_processes"] = serde_json::Value::Bool(true);
        }
        std::fs::write(&node.config, serde_json::to_vec_pretty(&cfg).expect("json")).expect("write the fake's config");
        std::fs::write(&node.events, "").expect("create the events file");
        node
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MUSTER_NVML_LIBRARY", fake_nvml::library().display().to_string()),
            ("FAKE_NVML_CONFIG", self.config.display().to_string()),
            ("FAKE_NVML_EVENTS_FILE", self.events.display().to_string()),
            ("FAKE_NVML_STATUS_FILE", self.status.display().to_string()),
        ]
    }

    /// Whether the agent's watcher has registered for events on `gpu`.
    pub fn registered(&self, gpu: usize) -> bool {
        std::fs::read_to_string(&self.status).unwrap_or_default().contains(&format!("registered {gpu} "))
    }

    /// Appends `line` to the events file now.
    pub fn write(&self, line: &str) {
        let mut events = std::fs::OpenOptions::new().append(true).open(&self.events).expect("open the events file");
        std::io::Write::write_all(&mut events, format!("{line}\n").as_bytes()).expect("write the events file");
    }

    /// Waits until the agent's watcher has registered for events on `gpu`, then injects `line`.
    pub fn inject(&self, gpu: usize, line: &str) {
        let ok = eventually(cluster::LONG, || self.registered(gpu));
        assert!(ok, "GPU {gpu} was never registered for events: {:?}", std::fs::read_to_string(&self.status));
        self.write(line);
    }
}
