//! NVML exports: topology, CPU / memory affinity and NVLink.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    level: *mut c_uint,
) -> Ret {
    with_state(|st| {
        let i = gpu(st, a)?;
        let j = gpu(st, b)?;
        put(level, st.model.levels[i][j])
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTopologyNearestGpus(
    device: nvmlDevice_t,
    level: c_uint,
    count: *mut c_uint,
    devices: *mut nvmlDevice_t,
) -> Ret {
    with_gpu(device, |st, i| {
        let found: Vec<usize> = (0..st.model.gpus.len())
            .filter(|&j| j != i && st.model.levels[i][j] <= level)
            .collect();
        put_handles(count, devices, &found)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    a: nvmlDevice_t,
    b: nvmlDevice_t,
    index: c_uint,
    status: *mut c_uint,
) -> Ret {
    with_state(|st| {
        let i = gpu(st, a)?;
        let j = gpu(st, b)?;
        let s = match index {
            2 => {
                // NVML_P2P_CAPS_INDEX_NVLINK
                if matches!(st.model.cells[i][j], config::Cell::Nv(_)) {
                    0
                } else {
                    5 // NVML_P2P_STATUS_NOT_SUPPORTED
                }
            }
            0..=4 => 0,
            _ => return Err(INVALID_ARGUMENT),
        };
        put(status, s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
) -> Ret {
    with_gpu(device, |st, i| {
        put_mask(set, size, &st.model.gpus[i].cpu_affinity)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
    scope: c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        if scope > 1 {
            return Err(INVALID_ARGUMENT);
        }
        put_mask(set, size, &st.model.gpus[i].cpu_affinity)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    set: *mut c_ulong,
    scope: c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        if scope > 1 {
            return Err(INVALID_ARGUMENT);
        }
        let node = st.model.gpus[i].numa_node.ok_or(NOT_SUPPORTED)?;
        put_mask(set, size, &[node])
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(device: nvmlDevice_t, node: *mut c_uint) -> Ret {
    // The GPU's own NUMA id (Grace/coherent platforms only); NOT_SUPPORTED on x86 like the real thing.
    with_gpu(device, |st, i| {
        put(node, st.model.gpus[i].gpu_numa_id.ok_or(NOT_SUPPORTED)?)
    })
}

fn link(st: &State, i: usize, l: c_uint) -> Result<Option<Remote>, Ret> {
    let ls = links(st, i)?;
    if l >= MAX_LINKS {
        return Err(INVALID_ARGUMENT);
    }
    Ok(ls.get(l as usize).copied())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    l: c_uint,
    active: *mut c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        let up = link(st, i, l)?.is_some() && !st.model.gpus[i].links_down.contains(&l);
        put(active, up as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    l: c_uint,
    kind: *mut c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        let t = match link(st, i, l)? {
            Some(Remote::Gpu(_)) => 0,    // NVML_NVLINK_DEVICE_TYPE_GPU
            Some(Remote::Switch(_)) => 2, // NVML_NVLINK_DEVICE_TYPE_SWITCH
            None => 255,                  // NVML_NVLINK_DEVICE_TYPE_UNKNOWN
        };
        put(kind, t)
    })
}

unsafe fn remote_pci(device: nvmlDevice_t, l: c_uint, pci: *mut nvmlPciInfo_t) -> Ret {
    with_gpu(device, |st, i| {
        let info = match link(st, i, l)? {
            Some(Remote::Gpu(j)) => {
                let g = &st.model.gpus[j];
                pci_info(g.bdf, g.pci_device_id, g.pci_sub_system_id)
            }
            Some(Remote::Switch(k)) => pci_info(SWITCH_BDFS[k], 0x22A3_10DE, 0x1796_10DE),
            None => return Err(NOT_SUPPORTED),
        };
        put(pci, info)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    l: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    remote_pci(device, l, pci)
}
