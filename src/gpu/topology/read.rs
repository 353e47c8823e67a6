//! Reading the machine: GPUs and their links through NVML, NUMA nodes and the CPU topology from sysfs.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use nvml_wrapper::Nvml;

use super::cpulist::parse_cpulist;
use super::{sysfs_bdf, CpuTopology, GpuNode, Link, PciLevel, Topology, TopologyError};
use crate::gpu::GpuInfo;

/// `NVML_NVLINK_MAX_LINKS`: link numbers at or above it are invalid.
const MAX_NVLINKS: u32 = 18;

/// Reads the topology of `gpus` (from [`crate::gpu::inventory`]) through NVML and the sysfs tree at `sysfs_root`.
///
/// Only a failure to get a GPU's NVML handle or an unreadable (not merely absent) sysfs file is an error:
/// a topology query NVML does not support leaves that pair [`Link::UNKNOWN`], a missing `numa_node` falls
/// back to NVML's memory affinity, and missing CPU files leave the corresponding maps empty.
pub fn read(nvml: &Nvml, gpus: &[GpuInfo], sysfs_root: &Path) -> Result<Topology, TopologyError> {
    let devices = gpus
        .iter()
        .map(|g| {
            nvml.device_by_index(g.index).map_err(|e| {
                crate::gpu::LostGpu::from_nvml(&e, g.index, Some(&g.uuid)).map_or_else(|| e.into(), TopologyError::Lost)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::topology::fixtures::cpus;

    #[test]
    fn reads_the_fixture_cpu_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpu/sysfs-pcie");
        let t = read_cpus(&root).unwrap();
        assert_eq!(t, cpus());
        assert!(read_cpus(Path::new("/nonexistent")).unwrap().nodes.is_empty());
    }
}
