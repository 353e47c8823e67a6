//! The pure planner: GPU order (a nearest-neighbour chain) and each rank's CPU set.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::{sysfs_bdf, GpuNode, Topology};

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
    /// Usable GPUs (NVML indices), already filtered: [`super::Selection::gpus`].
    pub gpus: Vec<u32>,
    /// Local world size.
    pub nproc: u32,
    pub numa: Option<NumaMode>,
    /// The agent's CPUs (`sched_getaffinity`, i.e. its cgroup cpuset); None: no restriction.
    pub allowed_cpus: Option<BTreeSet<u32>>,
    /// Name GPUs by UUID in `CUDA_VISIBLE_DEVICES` ([`super::Selection::by_uuid`]).
    pub by_uuid: bool,
    /// GPUs that stand as a MIG device in `CUDA_VISIBLE_DEVICES` ([`super::Selection::mig`]).
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
    use crate::gpu::topology::cpulist::format_cpulist;
    use crate::gpu::topology::fixtures::{hgx, pcie};

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
}
