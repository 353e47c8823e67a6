//! NVML exports: enumeration and identity of the fake GPUs; their memory, compute processes and temperature.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with_state(|st| put(count, st.model.gpus.len() as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> Ret {
    nvmlDeviceGetCount_v2(count)
}

unsafe fn by_index(index: c_uint, device: *mut nvmlDevice_t) -> Ret {
    with_state(|st| {
        let i = index as usize;
        if device.is_null() || i >= st.model.gpus.len() {
            return Err(INVALID_ARGUMENT);
        }
        if st.model.gpus[i].lost {
            return Err(lost(st, i));
        }
        put(device, handle(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> Ret {
    by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    with_state(|st| {
        let u = read_str(uuid)?;
        if device.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let i = st
            .model
            .gpus
            .iter()
            .position(|g| g.uuid == u)
            .ok_or(NOT_FOUND)?;
        if st.model.gpus[i].lost {
            return Err(lost(st, i));
        }
        put(device, handle(i))
    })
}

unsafe fn by_pci(bus_id: *const c_char, device: *mut nvmlDevice_t) -> Ret {
    with_state(|st| {
        let s = read_str(bus_id)?;
        if device.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let bdf = Bdf::parse(&s).ok_or(INVALID_ARGUMENT)?;
        let i = st
            .model
            .gpus
            .iter()
            .position(|g| g.bdf == bdf)
            .ok_or(NOT_FOUND)?;
        if st.model.gpus[i].lost {
            return Err(lost(st, i));
        }
        put(device, handle(i))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    by_pci(bus_id, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> Ret {
    by_pci(bus_id, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> Ret {
    with_gpu(device, |_, i| put(index, i as c_uint))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        put_str(uuid, length, &st.model.gpus[i].uuid)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        put_str(name, length, &st.model.gpus[i].name)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> Ret {
    with_gpu(device, |st, i| {
        let g = &st.model.gpus[i];
        put(pci, pci_info(g.bdf, g.pci_device_id, g.pci_sub_system_id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) -> Ret {
    with_gpu(device, |st, i| put(minor, st.model.gpus[i].minor_number))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: nvmlDevice_t, arch: *mut c_uint) -> Ret {
    with_gpu(device, |st, i| put(arch, st.model.gpus[i].architecture))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    with_gpu(device, |st, i| {
        if major.is_null() || minor.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let [a, b] = st.model.gpus[i].cuda_cc;
        put(major, a)?;
        put(minor, b)
    })
}

/// (total, reserved, free, used); used = configured used + the running processes' memory.
fn memory(st: &State, i: usize) -> (u64, u64, u64, u64) {
    let g = &st.model.gpus[i];
    let procs: u64 = g.processes.iter().map(|p| p.1).sum();
    let used = g.memory_used.saturating_add(procs).min(g.memory_total);
    let reserved = g.memory_reserved.min(g.memory_total - used);
    (
        g.memory_total,
        reserved,
        g.memory_total - used - reserved,
        used,
    )
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_t,
) -> Ret {
    with_gpu(device, |st, i| {
        let (total, _reserved, free, used) = memory(st, i);
        put(mem, nvmlMemory_t { total, free, used })
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    mem: *mut nvmlMemory_v2_t,
) -> Ret {
    with_gpu(device, |st, i| {
        if mem.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let version = (*mem).version;
        if version >> 24 != 2 {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, free, used) = memory(st, i);
        put(
            mem,
            nvmlMemory_v2_t {
                version,
                total,
                reserved,
                free,
                used,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> Ret {
    with_gpu(device, |st, i| {
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let mut procs = st.model.gpus[i].processes.clone();
        if st.model.attach_processes {
            let uuids: Vec<String> = st.model.gpus.iter().map(|g| g.uuid.clone()).collect();
            for (pid, _) in procs::attached(&uuids).into_iter().filter(|(_, g)| *g == i) {
                if !procs.iter().any(|p| p.0 == pid) {
                    // What a fresh CUDA context holds is not modelled: attached processes report 0 bytes.
                    procs.push((pid, 0));
                }
            }
        }
        let cap = *count as usize;
        *count = procs.len() as c_uint;
        if procs.is_empty() {
            return Ok(());
        }
        if infos.is_null() || cap < procs.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, &(pid, used)) in procs.iter().enumerate() {
            infos.add(k).write(nvmlProcessInfo_t {
                pid,
                usedGpuMemory: used,
                gpuInstanceId: u32::MAX,
                computeInstanceId: u32::MAX,
            });
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        put(temp, st.model.gpus[i].temperature)
    })
}

/// The clock-event reasons (`clocks <gpu> <mask>`): NVML's older name, which nvml-wrapper calls.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) -> Ret {
    with_gpu(device, |st, i| put(reasons, st.model.gpus[i].clock_reasons))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) -> Ret {
    nvmlDeviceGetCurrentClocksThrottleReasons(device, reasons)
}

/// nvmlClockType_t: graphics 0, SM 1, memory 2, video 3.
const CLOCK_MEM: c_uint = 2;
/// An H100's HBM3 clock, in MHz.
const MEM_CLOCK: c_uint = 2619;

/// The current clock of `kind` in MHz: graphics and SM as `clocks <gpu> <mask> sm=MHz` last set them.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, kind: c_uint, clock: *mut c_uint) -> Ret {
    with_gpu(device, |st, i| match kind {
        CLOCK_MEM => put(clock, MEM_CLOCK),
        0 | 1 | 3 => put(clock, st.model.gpus[i].sm_clock),
        _ => Err(INVALID_ARGUMENT),
    })
}
