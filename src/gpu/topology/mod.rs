//! Topology-aware placement: which GPU each local rank gets, and which CPUs it may run on.
//!
//! This file holds the machine as data ([`Topology`]: GPUs, their links, the CPUs). Three layers around it,
//! so that everything with a decision in it is pure and unit-tested:
//! - `read.rs`, [`read`]: the machine read into a [`Topology`]: per GPU its CPU-side NUMA node (sysfs, as
//!   torch reads it), pairwise links (NVML common ancestor plus active NVLinks), and the CPU topology from
//!   sysfs (CPU lists parsed by `cpulist.rs`);
//! - `select.rs`, [`select_gpus`]: which GPUs this agent may use (inherited `CUDA_VISIBLE_DEVICES`, Slurm, the
//!   container runtime, `--gpus`, minus excluded ones);
//! - `plan.rs`, [`plan`]: a greedy nearest-neighbour chain over those GPUs, and each rank's CPU set computed
//!   from the GPU it actually gets (torch derives it from LOCAL_RANK, which is wrong once GPUs are reordered).
//!
//! The sysfs root is `$MUSTER_SYSFS_ROOT` (default `/sys`): the directory that holds `bus/` and `devices/`,
//! so tests can point it at the fake trees in `tests/fixtures/gpu/`.

mod cpulist;
mod plan;
mod read;
mod select;

pub use cpulist::{format_cpulist, parse_cpulist};
pub use plan::{plan, NumaMode, Plan, PlanError, PlanInput, RankPlacement};
pub use read::{read, read_cpus};
pub use select::{select_gpus, SelectError, Selection};

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::str::FromStr;

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use serde::Serialize;

/// Points muster at another sysfs tree (the directory containing `bus/` and `devices/`).
pub const SYSFS_ROOT_ENV: &str = "MUSTER_SYSFS_ROOT";
/// The real one.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// `$MUSTER_SYSFS_ROOT`, else `/sys`.
pub fn sysfs_root() -> PathBuf {
    std::env::var_os(SYSFS_ROOT_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SYSFS_ROOT))
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error(transparent)]
    Lost(#[from] crate::gpu::LostGpu),
    #[error("NVML call failed while reading the GPU topology: {0}")]
    Nvml(String),
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse {} ({text:?})", path.display())]
    Parse { path: PathBuf, text: String },
}

impl From<NvmlError> for TopologyError {
    fn from(e: NvmlError) -> TopologyError {
        TopologyError::Nvml(e.to_string())
    }
}

/// The PCIe path between two GPUs, nearest first (`nvidia-smi topo -m` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum PciLevel {
    /// Same board (e.g. a dual-GPU card).
    Internal,
    /// At most one PCIe bridge.
    Pix,
    /// Several PCIe bridges, no host bridge.
    Pxb,
    /// Through a PCIe host bridge.
    Phb,
    /// Between host bridges within one NUMA node.
    Node,
    /// Across the SMP interconnect between NUMA nodes.
    Sys,
}

impl PciLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            PciLevel::Internal => "X",
            PciLevel::Pix => "PIX",
            PciLevel::Pxb => "PXB",
            PciLevel::Phb => "PHB",
            PciLevel::Node => "NODE",
            PciLevel::Sys => "SYS",
        }
    }

    pub(super) fn from_nvml(level: TopologyLevel) -> PciLevel {
        match level {
            TopologyLevel::Internal => PciLevel::Internal,
            TopologyLevel::Single => PciLevel::Pix,
            TopologyLevel::Multiple => PciLevel::Pxb,
            TopologyLevel::HostBridge => PciLevel::Phb,
            TopologyLevel::Node => PciLevel::Node,
            TopologyLevel::System => PciLevel::Sys,
        }
    }
}

impl FromStr for PciLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<PciLevel, String> {
        Ok(match s {
            "X" => PciLevel::Internal,
            "PIX" => PciLevel::Pix,
            "PXB" => PciLevel::Pxb,
            "PHB" => PciLevel::Phb,
            "NODE" => PciLevel::Node,
            "SYS" => PciLevel::Sys,
            other => return Err(format!("unknown PCIe topology level '{other}'")),
        })
    }
}

/// How two GPUs reach each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Active NVLinks usable between the pair (direct, or through NVSwitches); 0 without NVLink.
    pub nvlinks: u32,
    pub pci: PciLevel,
}

impl Link {
    /// Unknown pairs count as the farthest, so they never win a tie against a measured path.
    pub const UNKNOWN: Link = Link { nvlinks: 0, pci: PciLevel::Sys };

    /// The `nvidia-smi topo -m` cell: `NV18`, `PIX`, ...
    pub fn label(&self) -> String {
        if self.nvlinks > 0 {
            format!("NV{}", self.nvlinks)
        } else {
            self.pci.as_str().to_string()
        }
    }

    /// Sort key, nearest first: more NVLinks, then the shorter PCIe path.
    fn key(&self) -> (Reverse<u32>, PciLevel) {
        (Reverse(self.nvlinks), self.pci)
    }
}

/// One GPU as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNode {
    /// NVML index.
    pub index: u32,
    pub uuid: String,
    /// As NVML reports it (`00000000:9A:00.0`).
    pub pci_bus_id: String,
    /// CPU-side NUMA node; None when sysfs says -1 (no NUMA) or nothing knows. Planning treats None as
    /// node 0, as torch clamps -1 to 0.
    pub numa_node: Option<u32>,
}

/// The host CPUs as sysfs describes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuTopology {
    /// NUMA node → its CPUs (`devices/system/node/nodeN/cpulist`). A kernel without NUMA gets node 0 = every
    /// CPU seen.
    pub nodes: BTreeMap<u32, Vec<u32>>,
    /// CPU → physical package (socket).
    pub package: BTreeMap<u32, u32>,
    /// CPU → its SMT siblings, itself included (`thread_siblings_list`).
    pub siblings: BTreeMap<u32, Vec<u32>>,
    /// The distinct CPU sets sharing a highest-level data/unified cache (an L3 / core complex); empty when
    /// sysfs has no cache information.
    pub caches: Vec<Vec<u32>>,
}

impl CpuTopology {
    /// The socket of a NUMA node: the package of its first CPU. A node without package information is its
    /// own socket (a separate id space above every real package id, so it never merges with one).
    fn package_of_node(&self, node: u32) -> u64 {
        self.nodes
            .get(&node)
            .and_then(|cpus| cpus.iter().find_map(|c| self.package.get(c)))
            .map(|p| u64::from(*p))
            .unwrap_or(u64::from(u32::MAX) + 1 + u64::from(node))
    }
}

/// Everything [`plan`] needs to know about the machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pub gpus: Vec<GpuNode>,
    /// Keyed by (lower NVML index, higher NVML index).
    pub links: BTreeMap<(u32, u32), Link>,
    pub cpus: CpuTopology,
}

impl Topology {
    pub fn gpu(&self, index: u32) -> Option<&GpuNode> {
        self.gpus.iter().find(|g| g.index == index)
    }

    pub fn link(&self, a: u32, b: u32) -> Link {
        if a == b {
            return Link { nvlinks: 0, pci: PciLevel::Internal };
        }
        self.links.get(&(a.min(b), a.max(b))).copied().unwrap_or(Link::UNKNOWN)
    }

    fn node_of(&self, gpu: &GpuNode) -> u32 {
        gpu.numa_node.unwrap_or(0)
    }

    fn socket_of(&self, gpu: &GpuNode) -> u64 {
        self.cpus.package_of_node(self.node_of(gpu))
    }
}

/// NVML's bus id (`00000000:9A:00.0`, 8-digit domain, upper case) in the sysfs form (`0000:9a:00.0`).
pub fn sysfs_bdf(bus_id: &str) -> String {
    let lower = bus_id.trim().to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => lower,
        },
        None => lower,
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! The machines the tests plan on, as [`Topology`] values matching `tests/fixtures/gpu/`.

    use super::*;
    use crate::gpu::GpuInfo;

    /// 2 sockets × 8 cores × 2 threads, node0 = 0-7,16-23, node1 = 8-15,24-31, as both fixtures' sysfs trees.
    pub fn cpus() -> CpuTopology {
        let mut t = CpuTopology::default();
        t.nodes.insert(0, (0..8).chain(16..24).collect());
        t.nodes.insert(1, (8..16).chain(24..32).collect());
        for cpu in 0..32u32 {
            let core = cpu % 16;
            t.package.insert(cpu, core / 8);
            t.siblings.insert(cpu, vec![core, core + 16]);
        }
        t
    }

    pub fn topology(gpus: &[(&str, u32)], matrix: &[&[&str]]) -> Topology {
        let mut links = BTreeMap::new();
        for (i, row) in matrix.iter().enumerate() {
            for (j, cell) in row.iter().enumerate().skip(i + 1) {
                let link = match cell.strip_prefix("NV") {
                    Some(n) => Link { nvlinks: n.parse().unwrap(), pci: PciLevel::Node },
                    None => Link { nvlinks: 0, pci: cell.parse().unwrap() },
                };
                links.insert((i as u32, j as u32), link);
            }
        }
        Topology {
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, (bus, node))| GpuNode {
                    index: i as u32,
                    uuid: format!("GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000"),
                    pci_bus_id: format!("00000000:{bus}:00.0"),
                    numa_node: Some(*node),
                })
                .collect(),
            links,
            cpus: cpus(),
        }
    }

    /// tests/fixtures/gpu/pcie-8gpu.json: switches A (0,4), B (1,5) on node 0, C (2,6), D (3,7) on node 1.
    pub fn pcie() -> Topology {
        topology(
            &[("1B", 0), ("3D", 0), ("8A", 1), ("B1", 1), ("1C", 0), ("3E", 0), ("8B", 1), ("B2", 1)],
            &[
                &["X", "NODE", "SYS", "SYS", "PIX", "NODE", "SYS", "SYS"],
                &["NODE", "X", "SYS", "SYS", "NODE", "PIX", "SYS", "SYS"],
                &["SYS", "SYS", "X", "NODE", "SYS", "SYS", "PIX", "NODE"],
                &["SYS", "SYS", "NODE", "X", "SYS", "SYS", "NODE", "PIX"],
                &["PIX", "NODE", "SYS", "SYS", "X", "NODE", "SYS", "SYS"],
                &["NODE", "PIX", "SYS", "SYS", "NODE", "X", "SYS", "SYS"],
                &["SYS", "SYS", "PIX", "NODE", "SYS", "SYS", "X", "NODE"],
                &["SYS", "SYS", "NODE", "PIX", "SYS", "SYS", "NODE", "X"],
            ],
        )
    }

    /// tests/fixtures/gpu/hgx-h100.json: NV18 all-to-all, GPUs 0-3 on node 0 (PCIe NODE), 4-7 on node 1.
    pub fn hgx() -> Topology {
        let row = |i: usize| -> Vec<&'static str> {
            (0..8).map(|j| if i == j { "X" } else { "NV18" }).collect()
        };
        let rows: Vec<Vec<&str>> = (0..8).map(row).collect();
        let refs: Vec<&[&str]> = rows.iter().map(Vec::as_slice).collect();
        let mut t = topology(
            &[("18", 0), ("2A", 0), ("3A", 0), ("5D", 0), ("9A", 1), ("AB", 1), ("BA", 1), ("DB", 1)],
            &refs,
        );
        for ((a, b), link) in t.links.iter_mut() {
            link.pci = if (*a < 4) == (*b < 4) { PciLevel::Node } else { PciLevel::Sys };
        }
        t
    }

    pub fn inventory() -> Vec<GpuInfo> {
        pcie()
            .gpus
            .iter()
            .map(|g| GpuInfo {
                index: g.index,
                uuid: g.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
                name: "NVIDIA H100 PCIe".into(),
                memory_total: 80 << 30,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_the_sysfs_form() {
        assert_eq!(sysfs_bdf("00000000:9A:00.0"), "0000:9a:00.0");
        assert_eq!(sysfs_bdf("0001:1b:00.0"), "0001:1b:00.0");
    }
}
