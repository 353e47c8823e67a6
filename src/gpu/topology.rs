//! Topology-aware placement: which GPU each local rank gets, and which CPUs it may run on.
//!
//! Three layers, so that everything with a decision in it is pure and unit-tested:
//! - [`read`]: the machine as data ([`Topology`]): per GPU its CPU-side NUMA node (sysfs, as torch reads it),
//!   pairwise links (NVML common ancestor plus active NVLinks), and the CPU topology from sysfs;
//! - [`select_gpus`]: which GPUs this agent may use (inherited `CUDA_VISIBLE_DEVICES`, Slurm, the container
//!   runtime, `--gpus`, minus excluded ones);
//! - [`plan`]: a greedy nearest-neighbour chain over those GPUs, and each rank's CPU set computed from the
//!   GPU it actually gets (torch derives it from LOCAL_RANK, which is wrong once GPUs are reordered).
//!
//! The sysfs root is `$MUSTER_SYSFS_ROOT` (default `/sys`): the directory that holds `bus/` and `devices/`,
//! so tests can point it at the fake trees in `tests/fixtures/gpu/`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nvml_wrapper::enum_wrappers::device::TopologyLevel;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use serde::Serialize;

use super::GpuInfo;

/// Points muster at another sysfs tree (the directory containing `bus/` and `devices/`).
pub const SYSFS_ROOT_ENV: &str = "MUSTER_SYSFS_ROOT";
/// The real one.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";
/// `NVML_NVLINK_MAX_LINKS`: link numbers at or above it are invalid.
const MAX_NVLINKS: u32 = 18;

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
    Lost(#[from] super::LostGpu),
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

    fn from_nvml(level: TopologyLevel) -> PciLevel {
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

// ---------------------------------------------------------------------------------------------------------
// Reading the machine

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

/// Reads the topology of `gpus` (from [`super::inventory`]) through NVML and the sysfs tree at `sysfs_root`.
///
/// Only a failure to get a GPU's NVML handle or an unreadable (not merely absent) sysfs file is an error:
/// a topology query NVML does not support leaves that pair [`Link::UNKNOWN`], a missing `numa_node` falls
/// back to NVML's memory affinity, and missing CPU files leave the corresponding maps empty.
pub fn read(nvml: &Nvml, gpus: &[GpuInfo], sysfs_root: &Path) -> Result<Topology, TopologyError> {
    let devices = gpus
        .iter()
        .map(|g| {
            nvml.device_by_index(g.index).map_err(|e| {
                super::LostGpu::from_nvml(&e, g.index, Some(&g.uuid)).map_or_else(|| e.into(), TopologyError::Lost)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut nodes = Vec::with_capacity(gpus.len());
    for (g, d) in gpus.iter().zip(&devices) {
        let path = sysfs_root.join("bus/pci/devices").join(sysfs_bdf(&g.pci_bus_id)).join("numa_node");
        let node = match read_optional(&path)? {
            Some(text) => {
                let v: i64 = text.trim().parse().map_err(|_| TopologyError::Parse { path: path.clone(), text })?;
                u32::try_from(v).ok()
            }
            // No sysfs entry (an unusual container): NVML's memory affinity has the node as its lowest bit.
            None => d.memory_affinity(1, 0).ok().and_then(|words| lowest_bit(&words)),
        };
        nodes.push(node);
    }

    let nvlinks = nvlink_counts(gpus, &devices);
    let mut links = BTreeMap::new();
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate().skip(i + 1) {
            // Device::topology_common_ancestor takes the other device by value: get a second handle.
            let pci = nvml
                .device_by_index(b.index)
                .and_then(|other| devices[i].topology_common_ancestor(other))
                .map(PciLevel::from_nvml)
                .unwrap_or(PciLevel::Sys);
            links.insert((a.index.min(b.index), a.index.max(b.index)), Link { nvlinks: nvlinks.between(i, j), pci });
        }
    }

    Ok(Topology {
        gpus: gpus
            .iter()
            .zip(nodes)
            .map(|(g, numa_node)| GpuNode {
                index: g.index,
                uuid: g.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
                numa_node,
            })
            .collect(),
        links,
        cpus: read_cpus(sysfs_root)?,
    })
}

fn lowest_bit(words: &[std::os::raw::c_ulong]) -> Option<u32> {
    let bits = std::os::raw::c_ulong::BITS;
    words
        .iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i as u32 * bits + w.trailing_zeros())
}

/// Active NVLinks per GPU (by position in the inventory): direct links per peer, and links to NVSwitches.
struct NvLinks {
    direct: Vec<BTreeMap<usize, u32>>,
    switch: Vec<u32>,
}

impl NvLinks {
    fn between(&self, i: usize, j: usize) -> u32 {
        let direct = self.direct[i].get(&j).copied().unwrap_or(0).max(self.direct[j].get(&i).copied().unwrap_or(0));
        // Through NVSwitches every GPU with switch links reaches every other one; the narrower side bounds it.
        let switched = self.switch[i].min(self.switch[j]);
        direct + switched
    }
}

fn nvlink_counts(gpus: &[GpuInfo], devices: &[nvml_wrapper::Device]) -> NvLinks {
    let by_bdf: BTreeMap<String, usize> =
        gpus.iter().enumerate().map(|(i, g)| (sysfs_bdf(&g.pci_bus_id), i)).collect();
    let mut direct = vec![BTreeMap::new(); gpus.len()];
    let mut switch = vec![0u32; gpus.len()];
    for (i, d) in devices.iter().enumerate() {
        for l in 0..MAX_NVLINKS {
            let link = d.link_wrapper_for(l);
            match link.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                // NOT_SUPPORTED (a PCIe card) or an invalid link number: no (more) NVLinks on this GPU.
                Err(_) => break,
            }
            // The remote end's PCI address tells a peer GPU from an NVSwitch. (nvml-wrapper 0.13's
            // remote_device_type() cannot be used: it writes the result into a temporary and always
            // returns Unknown.) An active link whose far end NVML cannot name counts nothing rather
            // than a guess.
            if let Ok(remote) = link.remote_pci_info() {
                match by_bdf.get(&sysfs_bdf(&remote.bus_id)) {
                    Some(&peer) if peer != i => *direct[i].entry(peer).or_insert(0) += 1,
                    Some(_) => {}
                    None => switch[i] += 1,
                }
            }
        }
    }
    NvLinks { direct, switch }
}

/// A file's contents, or None when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, TopologyError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TopologyError::Io { path: path.to_path_buf(), source }),
    }
}

fn read_cpulist_file(path: &Path) -> Result<Option<Vec<u32>>, TopologyError> {
    match read_optional(path)? {
        Some(text) => parse_cpulist(&text)
            .map(Some)
            .ok_or_else(|| TopologyError::Parse { path: path.to_path_buf(), text }),
        None => Ok(None),
    }
}

/// `(number, path)` for each entry of `dir` named `<prefix><number>`; an absent directory has none.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, TopologyError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(TopologyError::Io { path: dir.to_path_buf(), source }),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| TopologyError::Io { path: dir.to_path_buf(), source })?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|n| n.parse::<u32>().ok()) {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The CPU topology under `<root>/devices/system/{node,cpu}`.
pub fn read_cpus(root: &Path) -> Result<CpuTopology, TopologyError> {
    let mut topo = CpuTopology::default();
    for (node, dir) in numbered_entries(&root.join("devices/system/node"), "node")? {
        if let Some(cpus) = read_cpulist_file(&dir.join("cpulist"))? {
            // Memory-only nodes (CXL, HBM) have an empty cpulist: no CPU to bind to there.
            if !cpus.is_empty() {
                topo.nodes.insert(node, cpus);
            }
        }
    }
    // (max level, shared CPU sets at that level)
    let mut caches: (u32, BTreeSet<Vec<u32>>) = (0, BTreeSet::new());
    for (cpu, dir) in numbered_entries(&root.join("devices/system/cpu"), "cpu")? {
        let topology = dir.join("topology");
        let package_path = topology.join("physical_package_id");
        if let Some(text) = read_optional(&package_path)? {
            // -1 on some virtual machines: no package information.
            if let Ok(p) = u32::try_from(
                text.trim().parse::<i64>().map_err(|_| TopologyError::Parse { path: package_path.clone(), text })?,
            ) {
                topo.package.insert(cpu, p);
            }
        } else if !topology.exists() {
            // An offline CPU has no topology directory: it cannot run anything.
            continue;
        }
        let siblings = read_cpulist_file(&topology.join("thread_siblings_list"))?.unwrap_or_else(|| vec![cpu]);
        topo.siblings.insert(cpu, siblings);
        for (_, index) in numbered_entries(&dir.join("cache"), "index")? {
            let kind = read_optional(&index.join("type"))?.unwrap_or_default();
            if !matches!(kind.trim(), "Unified" | "Data") {
                continue;
            }
            let level_path = index.join("level");
            let Some(level_text) = read_optional(&level_path)? else { continue };
            let level: u32 = level_text
                .trim()
                .parse()
                .map_err(|_| TopologyError::Parse { path: level_path.clone(), text: level_text })?;
            let Some(shared) = read_cpulist_file(&index.join("shared_cpu_list"))? else { continue };
            if level > caches.0 {
                caches = (level, BTreeSet::new());
            }
            if level == caches.0 && !shared.is_empty() {
                caches.1.insert(shared);
            }
        }
    }
    topo.caches = caches.1.into_iter().collect();
    if topo.nodes.is_empty() && !topo.siblings.is_empty() {
        // A kernel without NUMA support: one node holding every CPU.
        topo.nodes.insert(0, topo.siblings.keys().copied().collect());
    }
    Ok(topo)
}

/// Parses a kernel CPU list (`0-7,16-23`, possibly empty); None when malformed.
pub fn parse_cpulist(text: &str) -> Option<Vec<u32>> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b {
                    return None;
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(part.parse().ok()?);
            }
        }
    }
    Some(out.into_iter().collect())
}

/// The kernel/numactl form of a CPU set: sorted ranges, `0-3,16-19`.
pub fn format_cpulist(cpus: &[u32]) -> String {
    let sorted: BTreeSet<u32> = cpus.iter().copied().collect();
    let mut parts: Vec<String> = Vec::new();
    let mut iter = sorted.into_iter().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        parts.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    parts.join(",")
}

// ---------------------------------------------------------------------------------------------------------
// Which GPUs may be used

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("invalid value '{value}' for '--gpus': {reason}")]
    GpusFlag { value: String, reason: String },
}

/// The GPUs this agent may place workers on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// NVML indices, in the order they were selected (planning reorders them).
    pub gpus: Vec<u32>,
    /// The selection named GPUs by UUID, so the planned `CUDA_VISIBLE_DEVICES` uses UUIDs too.
    pub by_uuid: bool,
    /// GPU → the MIG device it was selected as, which stands for it in `CUDA_VISIBLE_DEVICES` (the worker
    /// must keep seeing the MIG slice, not the whole GPU).
    pub mig: BTreeMap<u32, String>,
    /// Where the selection came from, for error messages: `CUDA_VISIBLE_DEVICES=5,2,7,1`, `all GPUs`, ...
    pub source: String,
    /// Entries that were ignored, worded for the user.
    pub warnings: Vec<String>,
}

/// One list entry resolved to a GPU.
struct Resolved {
    index: u32,
    by_uuid: bool,
    mig: Option<String>,
}

/// Resolves one `CUDA_VISIBLE_DEVICES`-style entry: an NVML index, a GPU UUID or unique prefix of one (with
/// or without `GPU-`), or a MIG device (`MIG-GPU-<uuid>/<gi>/<ci>`, or an opaque `MIG-<uuid>` that
/// `mig_parent` maps to its GPU's index).
fn resolve(entry: &str, all: &[GpuInfo], mig_parent: &dyn Fn(&str) -> Option<u32>) -> Result<Resolved, String> {
    let entry = entry.trim();
    if entry.is_empty() {
        return Err("an empty entry".into());
    }
    if entry.bytes().all(|b| b.is_ascii_digit()) {
        let index: u32 = entry.parse().map_err(|_| format!("'{entry}' is not a GPU index"))?;
        return match all.iter().find(|g| g.index == index) {
            Some(_) => Ok(Resolved { index, by_uuid: false, mig: None }),
            None => Err(format!("there is no GPU {index} (NVML sees {})", all.len())),
        };
    }
    if let Some(rest) = entry.strip_prefix("MIG-") {
        let parent = if rest.starts_with("GPU-") {
            // Legacy form: the parent's UUID is spelled out.
            let uuid = rest.split('/').next().unwrap_or(rest);
            by_uuid_prefix(uuid, all)?
        } else {
            mig_parent(entry).ok_or_else(|| format!("no MIG device '{entry}' on this node"))?
        };
        return Ok(Resolved { index: parent, by_uuid: true, mig: Some(entry.to_string()) });
    }
    let uuid = if entry.starts_with("GPU-") { entry.to_string() } else { format!("GPU-{entry}") };
    Ok(Resolved { index: by_uuid_prefix(&uuid, all)?, by_uuid: true, mig: None })
}

fn by_uuid_prefix(prefix: &str, all: &[GpuInfo]) -> Result<u32, String> {
    let prefix = prefix.to_ascii_lowercase();
    let matches: Vec<&GpuInfo> = all.iter().filter(|g| g.uuid.to_ascii_lowercase().starts_with(&prefix)).collect();
    match matches.as_slice() {
        [one] => Ok(one.index),
        [] => Err(format!("no GPU has a UUID starting with '{prefix}'")),
        _ => Err(format!("'{prefix}' matches {} GPUs' UUIDs", matches.len())),
    }
}

/// Which GPUs may be used, from the inherited environment (`env` looks a variable up), the `--gpus` flag and
/// the GPUs excluded after faults (NVML indices).
///
/// The inherited selection is the first of: `CUDA_VISIBLE_DEVICES` (set and empty means none),
/// `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS` (Slurm's global GPU ids, i.e. NVML indices), `NVIDIA_VISIBLE_DEVICES`
/// (`all`, `none`/`void`, or a list); otherwise every GPU. Environment lists follow CUDA's rules: the first
/// entry that does not resolve ends the list (`0,2,-1,1` is 0 and 2) and a warning says so. `--gpus` names
/// NVML indices or UUIDs, must be a subset of the inherited selection, and any bad entry is an error.
pub fn select_gpus(
    all: &[GpuInfo],
    env: &dyn Fn(&str) -> Option<String>,
    gpus_flag: Option<&str>,
    excluded: &BTreeSet<u32>,
    mig_parent: &dyn Fn(&str) -> Option<u32>,
) -> Result<Selection, SelectError> {
    let mut sel = Selection::default();
    let inherited = ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES"]
        .into_iter()
        .find_map(|var| env(var).map(|v| (var, v)));
    let all_indices = || all.iter().map(|g| g.index).collect::<Vec<u32>>();
    match inherited {
        None => {
            sel.gpus = all_indices();
            sel.source = "all GPUs".into();
        }
        Some((var, value)) => {
            sel.source = format!("{var}={value}");
            let trimmed = value.trim();
            let container_all = var == "NVIDIA_VISIBLE_DEVICES" && trimmed.eq_ignore_ascii_case("all");
            let container_none = var == "NVIDIA_VISIBLE_DEVICES"
                && (trimmed.eq_ignore_ascii_case("none") || trimmed.eq_ignore_ascii_case("void"));
            let entries: Vec<&str> = if trimmed.is_empty() { Vec::new() } else { trimmed.split(',').collect() };
            if container_all {
                sel.gpus = all_indices();
            } else if container_none {
            } else if var == "NVIDIA_VISIBLE_DEVICES"
                && entries.len() == all.len()
                && entries.iter().all(|e| e.trim().bytes().all(|b| b.is_ascii_digit()))
            {
                // The container runtime already exposed exactly these GPUs, and NVML numbers them from 0
                // inside the container: the host indices in the variable mean nothing here.
                sel.gpus = all_indices();
            } else {
                for entry in entries {
                    match resolve(entry, all, mig_parent) {
                        Ok(r) => {
                            sel.by_uuid |= r.by_uuid;
                            if !sel.gpus.contains(&r.index) {
                                sel.gpus.push(r.index);
                                if let Some(mig) = r.mig {
                                    sel.mig.insert(r.index, mig);
                                }
                            }
                        }
                        Err(reason) => {
                            sel.warnings.push(format!(
                                "{var} entry '{}' ignored with every entry after it, as CUDA does: {reason}",
                                entry.trim()
                            ));
                            break;
                        }
                    }
                }
            }
        }
    }
    if let Some(flag) = gpus_flag {
        let bad = |reason: String| SelectError::GpusFlag { value: flag.to_string(), reason };
        let mut chosen = Vec::new();
        let mut by_uuid = false;
        let mut mig = BTreeMap::new();
        for entry in flag.split(',') {
            let r = resolve(entry, all, mig_parent).map_err(bad)?;
            if !sel.gpus.contains(&r.index) {
                return Err(bad(format!("GPU {} is not in the inherited selection ({})", r.index, sel.source)));
            }
            by_uuid |= r.by_uuid;
            if !chosen.contains(&r.index) {
                chosen.push(r.index);
                if let Some(m) = r.mig.or_else(|| sel.mig.get(&r.index).cloned()) {
                    mig.insert(r.index, m);
                }
            }
        }
        sel.gpus = chosen;
        sel.by_uuid |= by_uuid;
        sel.mig = mig;
        sel.source = format!("--gpus {flag} of {}", sel.source);
    }
    sel.gpus.retain(|g| !excluded.contains(g));
    sel.mig.retain(|g, _| !excluded.contains(g));
    Ok(sel)
}

// ---------------------------------------------------------------------------------------------------------
// Planning

/// `--numa-binding` modes, exactly torch's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumaMode {
    /// Every CPU of the GPU's NUMA node.
    Node,
    /// Every CPU of every NUMA node in the GPU's socket.
    Socket,
    /// A disjoint share of whole physical cores of the GPU's node.
    Exclusive,
    /// The CPUs sharing one highest-level cache (an L3 / core complex) of the GPU's node.
    CoreComplex,
}

impl NumaMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NumaMode::Node => "node",
            NumaMode::Socket => "socket",
            NumaMode::Exclusive => "exclusive",
            NumaMode::CoreComplex => "core-complex",
        }
    }
}

impl fmt::Display for NumaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NumaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<NumaMode, String> {
        Ok(match s {
            "node" => NumaMode::Node,
            "socket" => NumaMode::Socket,
            "exclusive" => NumaMode::Exclusive,
            "core-complex" => NumaMode::CoreComplex,
            other => {
                return Err(format!(
                    "invalid value '{other}' for '--numa-binding': use node, socket, exclusive or core-complex"
                ))
            }
        })
    }
}

/// What to plan for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanInput {
    /// Usable GPUs (NVML indices), already filtered: [`Selection::gpus`].
    pub gpus: Vec<u32>,
    /// Local world size.
    pub nproc: u32,
    pub numa: Option<NumaMode>,
    /// The agent's CPUs (`sched_getaffinity`, i.e. its cgroup cpuset); None: no restriction.
    pub allowed_cpus: Option<BTreeSet<u32>>,
    /// Name GPUs by UUID in `CUDA_VISIBLE_DEVICES` ([`Selection::by_uuid`]).
    pub by_uuid: bool,
    /// GPUs that stand as a MIG device in `CUDA_VISIBLE_DEVICES` ([`Selection::mig`]).
    pub mig: BTreeMap<u32, String>,
    /// `--virtual-local-rank`: each worker also gets its own one-GPU `CUDA_VISIBLE_DEVICES`.
    pub virtual_local_rank: bool,
}

/// Where one local rank runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankPlacement {
    pub local_rank: u32,
    /// NVML index.
    pub gpu_index: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    /// The GPU's CPU-side NUMA node (None: unknown or no NUMA).
    pub numa_node: Option<u32>,
    /// CPU affinity to set in the worker before exec; None: inherit the agent's (no `--numa-binding`).
    pub cpus: Option<Vec<u32>>,
    /// `--virtual-local-rank` only: this worker's own `CUDA_VISIBLE_DEVICES` (its GPU alone), overriding
    /// [`Plan::visible_devices`].
    pub visible_devices: Option<String>,
    /// How this rank's GPU reaches the previous rank's (`NV18`, `PIX`, ...); None for rank 0.
    pub link_to_previous: Option<String>,
}

/// The placement of one node's workers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub numa_binding: Option<NumaMode>,
    pub ranks: Vec<RankPlacement>,
    /// `CUDA_VISIBLE_DEVICES` for every worker: position i is rank i's GPU, then the usable GPUs no rank
    /// got, so `set_device(LOCAL_RANK)` lands on the planned GPU and NCCL still sees every GPU of the node.
    /// Indices are NVML (PCI bus) order: export `CUDA_DEVICE_ORDER=PCI_BUS_ID` with it.
    pub visible_devices: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("'--nproc-per-node' must be at least 1")]
    NoWorkers,
    #[error("{nproc} workers per node but only {usable} usable GPU{}", if *usable == 1 { "" } else { "s" })]
    TooManyWorkers { nproc: u32, usable: usize },
    #[error("GPU {0} is not in the topology")]
    UnknownGpu(u32),
    #[error("'--numa-binding {mode}': no CPU of NUMA node {node} (for local rank {rank}) is allowed to this process")]
    NoCpus { mode: NumaMode, node: u32, rank: u32 },
    #[error("'--numa-binding exclusive': NUMA node {node} has {cores} usable physical cores for {ranks} workers")]
    TooFewCores { node: u32, cores: usize, ranks: usize },
}

/// Places `input.nproc` workers on the usable GPUs and computes each one's CPU set.
///
/// GPU order: a greedy chain. It starts in one socket (the first by PCI bus id that can hold every worker,
/// else the one with most usable GPUs) at that socket's lowest-bus-id GPU, and repeatedly takes the nearest
/// remaining GPU: more NVLinks first, then staying on the same NUMA node, then the shorter PCIe path
/// (PIX < PXB < PHB < NODE < SYS), then the lower bus id. It only leaves a socket once that socket has no
/// usable GPU left, so ranks 0..k share a socket.
pub fn plan(topo: &Topology, input: &PlanInput) -> Result<Plan, PlanError> {
    if input.nproc == 0 {
        return Err(PlanError::NoWorkers);
    }
    let mut candidates: Vec<&GpuNode> = Vec::new();
    for &index in &input.gpus {
        let gpu = topo.gpu(index).ok_or(PlanError::UnknownGpu(index))?;
        if !candidates.iter().any(|c| c.index == index) {
            candidates.push(gpu);
        }
    }
    if input.nproc as usize > candidates.len() {
        return Err(PlanError::TooManyWorkers { nproc: input.nproc, usable: candidates.len() });
    }
    let order = chain(topo, candidates, input.nproc as usize);
    let assigned = &order[..input.nproc as usize];
    let cpus = cpu_sets(topo, assigned, input)?;

    let name = |g: &GpuNode| -> String {
        if let Some(mig) = input.mig.get(&g.index) {
            mig.clone()
        } else if input.by_uuid {
            g.uuid.clone()
        } else {
            g.index.to_string()
        }
    };
    let ranks = assigned
        .iter()
        .zip(cpus)
        .enumerate()
        .map(|(rank, (g, cpus))| RankPlacement {
            local_rank: rank as u32,
            gpu_index: g.index,
            uuid: g.uuid.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            numa_node: g.numa_node,
            cpus,
            visible_devices: input.virtual_local_rank.then(|| name(g)),
            link_to_previous: rank.checked_sub(1).map(|prev| topo.link(assigned[prev].index, g.index).label()),
        })
        .collect();
    Ok(Plan {
        numa_binding: input.numa,
        ranks,
        visible_devices: order.iter().map(|g| name(g)).collect::<Vec<_>>().join(","),
    })
}

/// Every candidate, in placement order (the first `nproc` get ranks).
fn chain<'a>(topo: &Topology, mut rest: Vec<&'a GpuNode>, nproc: usize) -> Vec<&'a GpuNode> {
    let bdf = |g: &GpuNode| sysfs_bdf(&g.pci_bus_id);
    rest.sort_by_key(|g| bdf(g));
    // Sockets with their GPU count, in bus-id order of their first GPU.
    let mut sockets: Vec<(u64, usize)> = Vec::new();
    for g in &rest {
        let s = topo.socket_of(g);
        match sockets.iter_mut().find(|(id, _)| *id == s) {
            Some((_, n)) => *n += 1,
            None => sockets.push((s, 1)),
        }
    }
    // The first socket (by bus id) that can hold every worker, else the one with most GPUs (first on ties).
    let start_socket = sockets
        .iter()
        .find(|(_, n)| *n >= nproc)
        .or_else(|| {
            let most = sockets.iter().map(|(_, n)| *n).max()?;
            sockets.iter().find(|(_, n)| *n == most)
        })
        .map(|(s, _)| *s);
    let Some(first) = rest.iter().position(|g| Some(topo.socket_of(g)) == start_socket) else {
        return rest;
    };
    let mut order = vec![rest.remove(first)];
    while !rest.is_empty() {
        let current = order[order.len() - 1];
        let here = topo.socket_of(current);
        let stay = rest.iter().any(|g| topo.socket_of(g) == here);
        let next = rest
            .iter()
            .enumerate()
            .filter(|(_, g)| !stay || topo.socket_of(g) == here)
            .min_by_key(|(_, g)| {
                let link = topo.link(current.index, g.index).key();
                (link.0, topo.node_of(g) != topo.node_of(current), link.1, bdf(g))
            })
            .map(|(i, _)| i)
            .unwrap_or(0);
        order.push(rest.remove(next));
    }
    order
}

/// Each assigned GPU's CPU set under `input.numa` (None when there is no binding).
fn cpu_sets(topo: &Topology, assigned: &[&GpuNode], input: &PlanInput) -> Result<Vec<Option<Vec<u32>>>, PlanError> {
    let Some(mode) = input.numa else {
        return Ok(vec![None; assigned.len()]);
    };
    let allowed = |cpus: &[u32]| -> Vec<u32> {
        cpus.iter().copied().filter(|c| input.allowed_cpus.as_ref().is_none_or(|a| a.contains(c))).collect()
    };
    let node_cpus = |node: u32| -> Vec<u32> { allowed(topo.cpus.nodes.get(&node).map(Vec::as_slice).unwrap_or(&[])) };
    // Local ranks on each NUMA node, in rank order: exclusive and core-complex share a node among them.
    let mut on_node: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (rank, g) in assigned.iter().enumerate() {
        on_node.entry(topo.node_of(g)).or_default().push(rank);
    }
    let mut out = Vec::with_capacity(assigned.len());
    for (rank, g) in assigned.iter().enumerate() {
        let node = topo.node_of(g);
        let position = on_node[&node].iter().position(|r| *r == rank).unwrap_or(0);
        let sharers = on_node[&node].len();
        let cpus = match mode {
            NumaMode::Node => node_cpus(node),
            NumaMode::Socket => {
                let package = topo.cpus.package_of_node(node);
                let mut cpus: Vec<u32> = topo
                    .cpus
                    .nodes
                    .keys()
                    .filter(|n| topo.cpus.package_of_node(**n) == package)
                    .flat_map(|n| node_cpus(*n))
                    .collect();
                cpus.sort_unstable();
                cpus
            }
            NumaMode::Exclusive => {
                let cores = physical_cores(topo, &node_cpus(node));
                if cores.len() < sharers {
                    return Err(PlanError::TooFewCores { node, cores: cores.len(), ranks: sharers });
                }
                // Even split; the lowest ranks on the node take one extra core each until the remainder is gone.
                let (per, extra) = (cores.len() / sharers, cores.len() % sharers);
                let start = position * per + position.min(extra);
                let count = per + usize::from(position < extra);
                let mut cpus: Vec<u32> = cores[start..start + count].iter().flatten().copied().collect();
                cpus.sort_unstable();
                cpus
            }
            NumaMode::CoreComplex => {
                let node_set: BTreeSet<u32> = node_cpus(node).into_iter().collect();
                let mut complexes: Vec<Vec<u32>> = topo
                    .cpus
                    .caches
                    .iter()
                    .map(|c| c.iter().copied().filter(|cpu| node_set.contains(cpu)).collect::<Vec<u32>>())
                    .filter(|c| !c.is_empty())
                    .collect();
                // torch's order: larger complexes first, then by lowest CPU.
                complexes.sort_by_key(|c| (Reverse(c.len()), c.first().copied()));
                match complexes.len() {
                    // No cache information: the node is the best known grouping.
                    0 => node_set.into_iter().collect(),
                    n => complexes.swap_remove(position % n),
                }
            }
        };
        if cpus.is_empty() {
            return Err(PlanError::NoCpus { mode, node, rank: rank as u32 });
        }
        out.push(Some(cpus));
    }
    Ok(out)
}

/// `cpus` grouped into physical cores (SMT siblings together), sorted by lowest CPU.
fn physical_cores(topo: &Topology, cpus: &[u32]) -> Vec<Vec<u32>> {
    let set: BTreeSet<u32> = cpus.iter().copied().collect();
    let mut cores: BTreeSet<Vec<u32>> = BTreeSet::new();
    for cpu in &set {
        let core: Vec<u32> = match topo.cpus.siblings.get(cpu) {
            Some(siblings) => siblings.iter().copied().filter(|s| set.contains(s)).collect(),
            None => vec![*cpu],
        };
        cores.insert(core);
    }
    let mut cores: Vec<Vec<u32>> = cores.into_iter().collect();
    cores.sort_by_key(|c| c.first().copied());
    cores
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 sockets × 8 cores × 2 threads, node0 = 0-7,16-23, node1 = 8-15,24-31, as both fixtures' sysfs trees.
    fn cpus() -> CpuTopology {
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

    fn topology(gpus: &[(&str, u32)], matrix: &[&[&str]]) -> Topology {
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
    fn pcie() -> Topology {
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
    fn hgx() -> Topology {
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

    fn input(gpus: &[u32], nproc: u32, numa: Option<NumaMode>) -> PlanInput {
        PlanInput { gpus: gpus.to_vec(), nproc, numa, ..PlanInput::default() }
    }

    fn gpu_order(p: &Plan) -> Vec<u32> {
        p.ranks.iter().map(|r| r.gpu_index).collect()
    }

    #[test]
    fn pcie_chain_keeps_switch_mates_adjacent_and_socket_zero_first() {
        let t = pcie();
        let p = plan(&t, &input(&(0..8).collect::<Vec<_>>(), 8, Some(NumaMode::Node))).unwrap();
        assert_eq!(gpu_order(&p), [0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(p.visible_devices, "0,4,1,5,2,6,3,7");
        let links: Vec<Option<&str>> = p.ranks.iter().map(|r| r.link_to_previous.as_deref()).collect();
        assert_eq!(links, [None, Some("PIX"), Some("NODE"), Some("PIX"), Some("SYS"), Some("PIX"), Some("NODE"), Some("PIX")]);
        for r in &p.ranks {
            let node = t.gpu(r.gpu_index).unwrap().numa_node.unwrap();
            assert_eq!(r.numa_node, Some(node));
            assert_eq!(r.cpus.as_ref().unwrap(), &t.cpus.nodes[&node], "rank {}", r.local_rank);
        }
        assert!(p.ranks[..4].iter().all(|r| r.numa_node == Some(0)));
    }

    #[test]
    fn fewer_workers_take_a_switch_pair_on_one_socket() {
        let p = plan(&pcie(), &input(&(0..8).collect::<Vec<_>>(), 2, None)).unwrap();
        assert_eq!(gpu_order(&p), [0, 4]);
        assert!(p.ranks.iter().all(|r| r.cpus.is_none()), "no binding mode: inherit");
        // The unassigned GPUs stay visible after the ranks' ones, for NCCL.
        assert_eq!(p.visible_devices, "0,4,1,5,2,6,3,7");
    }

    #[test]
    fn exclusive_gives_disjoint_whole_cores_on_the_gpu_node() {
        let t = pcie();
        let p = plan(&t, &input(&(0..8).collect::<Vec<_>>(), 8, Some(NumaMode::Exclusive))).unwrap();
        let mut seen = BTreeSet::new();
        for r in &p.ranks {
            let cpus = r.cpus.as_ref().unwrap();
            // 8 cores per node over 4 ranks: 2 whole cores (4 threads) each.
            assert_eq!(cpus.len(), 4, "rank {}", r.local_rank);
            let node = &t.cpus.nodes[&r.numa_node.unwrap()];
            for c in cpus {
                assert!(node.contains(c));
                assert!(cpus.contains(&t.cpus.siblings[c][0]) && cpus.contains(&t.cpus.siblings[c][1]));
                assert!(seen.insert(*c), "cpu {c} given twice");
            }
        }
        assert_eq!(p.ranks[0].cpus.as_deref(), Some(&[0, 1, 16, 17][..]));
        assert_eq!(p.ranks[4].cpus.as_deref(), Some(&[8, 9, 24, 25][..]));
        assert_eq!(format_cpulist(p.ranks[1].cpus.as_ref().unwrap()), "2-3,18-19");
    }

    #[test]
    fn exclusive_remainder_goes_to_the_lowest_ranks_and_too_few_cores_fail() {
        let t = pcie();
        // Only 5 cores of node 0 allowed (0-4 and their siblings) for 2 ranks: 3 + 2.
        let allowed: BTreeSet<u32> = (0..5).chain(16..21).collect();
        let mut i = input(&[0, 4], 2, Some(NumaMode::Exclusive));
        i.allowed_cpus = Some(allowed);
        let p = plan(&t, &i).unwrap();
        assert_eq!(p.ranks[0].cpus.as_deref(), Some(&[0, 1, 2, 16, 17, 18][..]));
        assert_eq!(p.ranks[1].cpus.as_deref(), Some(&[3, 4, 19, 20][..]));

        i.allowed_cpus = Some([0, 16].into_iter().collect());
        assert_eq!(plan(&t, &i), Err(PlanError::TooFewCores { node: 0, cores: 1, ranks: 2 }));
    }

    #[test]
    fn node_and_socket_modes_respect_the_allowed_cpus() {
        let t = pcie();
        let mut i = input(&[0, 2], 2, Some(NumaMode::Node));
        i.allowed_cpus = Some((0..4).chain(8..12).collect());
        let p = plan(&t, &i).unwrap();
        assert_eq!(p.ranks[0].cpus.as_deref(), Some(&[0, 1, 2, 3][..]));
        assert_eq!(p.ranks[1].cpus.as_deref(), Some(&[8, 9, 10, 11][..]));

        i.allowed_cpus = Some((0..4).collect());
        assert_eq!(plan(&t, &i), Err(PlanError::NoCpus { mode: NumaMode::Node, node: 1, rank: 1 }));

        let p = plan(&t, &input(&[0], 1, Some(NumaMode::Socket))).unwrap();
        assert_eq!(format_cpulist(p.ranks[0].cpus.as_ref().unwrap()), "0-7,16-23");
    }

    #[test]
    fn socket_mode_unions_the_nodes_of_one_package() {
        // Sub-NUMA clustering: 4 nodes, two per package.
        let mut t = pcie();
        t.cpus.nodes = BTreeMap::from([
            (0, vec![0, 1, 2, 3, 16, 17, 18, 19]),
            (1, vec![4, 5, 6, 7, 20, 21, 22, 23]),
            (2, vec![8, 9, 10, 11, 24, 25, 26, 27]),
            (3, vec![12, 13, 14, 15, 28, 29, 30, 31]),
        ]);
        let p = plan(&t, &input(&[0], 1, Some(NumaMode::Socket))).unwrap();
        assert_eq!(format_cpulist(p.ranks[0].cpus.as_ref().unwrap()), "0-7,16-23");
        let p = plan(&t, &input(&[0], 1, Some(NumaMode::Node))).unwrap();
        assert_eq!(format_cpulist(p.ranks[0].cpus.as_ref().unwrap()), "0-3,16-19");
    }

    #[test]
    fn core_complex_uses_cache_groups_or_falls_back_to_the_node() {
        let mut t = pcie();
        let p = plan(&t, &input(&[0, 4], 2, Some(NumaMode::CoreComplex))).unwrap();
        assert_eq!(format_cpulist(p.ranks[1].cpus.as_ref().unwrap()), "0-7,16-23");
        // Two L3 complexes of 4 cores per socket.
        t.cpus.caches = vec![
            vec![0, 1, 2, 3, 16, 17, 18, 19],
            vec![4, 5, 6, 7, 20, 21, 22, 23],
            vec![8, 9, 10, 11, 24, 25, 26, 27],
            vec![12, 13, 14, 15, 28, 29, 30, 31],
        ];
        let p = plan(&t, &input(&[0, 4, 1], 3, Some(NumaMode::CoreComplex))).unwrap();
        let got: Vec<String> = p.ranks.iter().map(|r| format_cpulist(r.cpus.as_ref().unwrap())).collect();
        assert_eq!(got, ["0-3,16-19", "4-7,20-23", "0-3,16-19"]);
    }

    #[test]
    fn hgx_is_all_nv18_and_fills_node_zero_first() {
        let t = hgx();
        let p = plan(&t, &input(&(0..8).collect::<Vec<_>>(), 8, Some(NumaMode::Exclusive))).unwrap();
        assert_eq!(gpu_order(&p), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(p.ranks[1..].iter().all(|r| r.link_to_previous.as_deref() == Some("NV18")));
        for r in &p.ranks[..4] {
            assert_eq!(r.numa_node, Some(0));
            assert!(r.cpus.as_ref().unwrap().iter().all(|c| t.cpus.nodes[&0].contains(c)));
        }
        assert_eq!(p.ranks[3].cpus.as_deref(), Some(&[6, 7, 22, 23][..]));
        assert!(p.ranks[4..].iter().all(|r| r.numa_node == Some(1)));
    }

    #[test]
    fn an_inherited_subset_is_kept_and_reordered_by_topology() {
        let t = pcie();
        // CUDA_VISIBLE_DEVICES=5,2,7,1: 1 and 5 share switch B on node 0, 2 and 7 are on node 1.
        let p = plan(&t, &input(&[5, 2, 7, 1], 4, Some(NumaMode::Node))).unwrap();
        assert_eq!(gpu_order(&p), [1, 5, 2, 7]);
        assert_eq!(p.visible_devices, "1,5,2,7");
        assert_eq!(p.ranks[1].link_to_previous.as_deref(), Some("PIX"));
    }

    #[test]
    fn a_socket_that_holds_every_worker_is_preferred() {
        let t = pcie();
        // Node 0 has only GPU 0 usable, node 1 has three: two workers both go to node 1.
        let p = plan(&t, &input(&[0, 2, 6, 3], 2, None)).unwrap();
        assert_eq!(gpu_order(&p), [2, 6]);
        // Three workers: node 1 still holds them all.
        assert_eq!(gpu_order(&plan(&t, &input(&[0, 2, 6, 3], 3, None)).unwrap()), [2, 6, 3]);
        // Four: start on the socket with most GPUs, then cross.
        assert_eq!(gpu_order(&plan(&t, &input(&[0, 2, 6, 3], 4, None)).unwrap()), [2, 6, 3, 0]);
    }

    #[test]
    fn too_many_workers_name_the_counts() {
        let e = plan(&pcie(), &input(&[5, 2, 7, 1], 5, None)).unwrap_err();
        assert_eq!(e, PlanError::TooManyWorkers { nproc: 5, usable: 4 });
        assert_eq!(e.to_string(), "5 workers per node but only 4 usable GPUs");
        assert_eq!(plan(&pcie(), &input(&[1], 0, None)), Err(PlanError::NoWorkers));
    }

    #[test]
    fn uuids_mig_and_virtual_local_rank_in_visible_devices() {
        let t = pcie();
        let mut i = input(&[1, 5], 2, None);
        i.by_uuid = true;
        i.virtual_local_rank = true;
        i.mig.insert(5, "MIG-abc".into());
        let p = plan(&t, &i).unwrap();
        assert_eq!(p.visible_devices, format!("{},MIG-abc", t.gpus[1].uuid));
        assert_eq!(p.ranks[0].visible_devices.as_deref(), Some(t.gpus[1].uuid.as_str()));
        assert_eq!(p.ranks[1].visible_devices.as_deref(), Some("MIG-abc"));
    }

    fn inventory() -> Vec<GpuInfo> {
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

    fn select(vars: &[(&str, &str)], flag: Option<&str>, excluded: &[u32]) -> Result<Selection, SelectError> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mig = |m: &str| (m == "MIG-opaque-1").then_some(6);
        select_gpus(&inventory(), &|k| vars.get(k).cloned(), flag, &excluded.iter().copied().collect(), &mig)
    }

    #[test]
    fn selection_from_the_environment() {
        let all = select(&[], None, &[]).unwrap();
        assert_eq!((all.gpus, all.by_uuid), ((0..8).collect(), false));

        let s = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1"), ("SLURM_STEP_GPUS", "0")], None, &[]).unwrap();
        assert_eq!(s.gpus, [5, 2, 7, 1]);
        assert_eq!(s.source, "CUDA_VISIBLE_DEVICES=5,2,7,1");

        // CUDA's rule: an invalid entry ends the list.
        let s = select(&[("CUDA_VISIBLE_DEVICES", "0,2,-1,1")], None, &[]).unwrap();
        assert_eq!(s.gpus, [0, 2]);
        assert_eq!(s.warnings.len(), 1);
        assert!(select(&[("CUDA_VISIBLE_DEVICES", "")], None, &[]).unwrap().gpus.is_empty());

        // UUIDs, unique prefixes (with or without GPU-), MIG devices → their parent GPU.
        let s = select(&[("CUDA_VISIBLE_DEVICES", "GPU-33333333-0000,44444444-0000,MIG-GPU-77777777-0000/1/0,MIG-opaque-1")], None, &[])
            .unwrap();
        assert_eq!(s.gpus, [3, 4, 7, 6]);
        assert!(s.by_uuid);
        assert_eq!(s.mig.get(&7).map(String::as_str), Some("MIG-GPU-77777777-0000/1/0"));
        // An ambiguous prefix resolves nothing.
        assert!(select(&[("CUDA_VISIBLE_DEVICES", "GPU-")], None, &[]).unwrap().gpus.is_empty());

        assert_eq!(select(&[("SLURM_JOB_GPUS", "1,3")], None, &[]).unwrap().gpus, [1, 3]);
        assert_eq!(select(&[("SLURM_STEP_GPUS", "2"), ("SLURM_JOB_GPUS", "1,3")], None, &[]).unwrap().gpus, [2]);
        assert_eq!(select(&[("NVIDIA_VISIBLE_DEVICES", "all")], None, &[]).unwrap().gpus.len(), 8);
        assert!(select(&[("NVIDIA_VISIBLE_DEVICES", "none")], None, &[]).unwrap().gpus.is_empty());
        assert_eq!(select(&[("NVIDIA_VISIBLE_DEVICES", "2,3")], None, &[]).unwrap().gpus, [2, 3]);
        // As many host indices as GPUs in the container: the runtime already did the selecting.
        assert_eq!(
            select(&[("NVIDIA_VISIBLE_DEVICES", "8,9,10,11,12,13,14,15")], None, &[]).unwrap().gpus,
            (0..8).collect::<Vec<_>>()
        );
    }

    #[test]
    fn selection_flag_and_exclusions() {
        let s = select(&[], Some("0,2,4"), &[2]).unwrap();
        assert_eq!(s.gpus, [0, 4]);
        let s = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1")], Some("GPU-22222222"), &[]).unwrap();
        assert_eq!((s.gpus, s.by_uuid), (vec![2], true));
        let e = select(&[("CUDA_VISIBLE_DEVICES", "5,2,7,1")], Some("0"), &[]).unwrap_err();
        assert!(e.to_string().contains("'--gpus'") && e.to_string().contains("CUDA_VISIBLE_DEVICES=5,2,7,1"), "{e}");
        assert!(select(&[], Some("9"), &[]).unwrap_err().to_string().contains("there is no GPU 9"));
        assert!(select(&[], Some("0,,1"), &[]).is_err());
    }

    #[test]
    fn cpulists_and_bus_ids() {
        assert_eq!(parse_cpulist("0-3,8,16-17\n"), Some(vec![0, 1, 2, 3, 8, 16, 17]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(format_cpulist(&[17, 0, 1, 2, 3, 8, 16]), "0-3,8,16-17");
        assert_eq!(sysfs_bdf("00000000:9A:00.0"), "0000:9a:00.0");
        assert_eq!(sysfs_bdf("0001:1b:00.0"), "0001:1b:00.0");
    }

    #[test]
    fn reads_the_fixture_cpu_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu/sysfs-pcie");
        let t = read_cpus(&root).unwrap();
        assert_eq!(t, cpus());
        assert!(read_cpus(Path::new("/nonexistent")).unwrap().nodes.is_empty());
    }
}
