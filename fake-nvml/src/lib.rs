//! A fake `libnvidia-ml.so` for testing muster without a GPU.
//!
//! Load it with `nvml_wrapper::Nvml::builder().lib_path(..).init()`; configure it with the JSON
//! file named by `FAKE_NVML_CONFIG`; inject faults at run time by appending lines to the
//! configured events file. See README.md for the config format and the event-line grammar.
//!
//! Every exported function catches panics, checks pointers (NVML_ERROR_INVALID_ARGUMENT) and
//! works on one global, mutex-protected state.

// The exported functions are the C ABI of NVML; their contracts are NVML's (documented in
// nvml.h), not restated here.
#![allow(clippy::missing_safety_doc)]
#![allow(non_snake_case)]

mod config;
mod incident;
mod procs;
mod state;

use config::{Bdf, Model, Remote, MAX_GPUS, MAX_LINKS, SWITCH_BDFS};
use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEccErrorCounts_t, nvmlEventData_t, nvmlEventSet_t, nvmlFieldValue_t,
    nvmlMemory_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlProcessInfo_t, nvmlReturn_t, nvmlValue_t,
};
use state::{lock, State};
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type Ret = nvmlReturn_t;

const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const TIMEOUT: Ret = 10;
const GPU_IS_LOST: Ret = 15;
const ARGUMENT_VERSION_MISMATCH: Ret = 25;
const UNKNOWN: Ret = 999;

/// Device handles are addresses into this table (never dereferenced by anyone).
static HANDLES: [u8; MAX_GPUS] = [0; MAX_GPUS];
/// Event-set handles are `SET_BASE + id * 16` (never dereferenced either).
const SET_BASE: usize = 0x5E70_0000;
/// How often a waiting `nvmlEventSetWait_v2` re-reads the events file.
const POLL: Duration = Duration::from_millis(20);

fn guard(f: impl FnOnce() -> Ret) -> Ret {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(UNKNOWN)
}

thread_local! {
    /// Set when this call met a lost GPU that stalls (`lost <gpu> stall=N`): the call sleeps after releasing
    /// the global lock, so calls on other GPUs (and event waits) go on meanwhile.
    static STALL: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` on the initialised state, after applying pending events-file lines.
fn with_state(f: impl FnOnce(&mut State) -> Result<(), Ret>) -> Ret {
    guard(|| {
        STALL.set(None);
        let ret = {
            let mut g = lock();
            let Some(st) = g.as_mut() else {
                return UNINITIALIZED;
            };
            st.poll_events();
            match f(st) {
                Ok(()) => SUCCESS,
                Err(e) => e,
            }
        };
        if let Some(d) = STALL.take() {
            std::thread::sleep(d);
        }
        ret
    })
}

/// GPU_IS_LOST for GPU `i`, after its stall if it has one.
fn lost(st: &State, i: usize) -> Ret {
    if let Some(d) = st.model.gpus[i].stall {
        STALL.set(Some(d));
    }
    GPU_IS_LOST
}

fn handle(i: usize) -> nvmlDevice_t {
    HANDLES.as_ptr().wrapping_add(i) as nvmlDevice_t
}

/// Index of a device handle, without the lost check.
fn index_of(st: &State, d: nvmlDevice_t) -> Result<usize, Ret> {
    let base = HANDLES.as_ptr() as usize;
    let p = d as usize;
    if p < base || p >= base + st.model.gpus.len() {
        return Err(INVALID_ARGUMENT);
    }
    Ok(p - base)
}

/// Index of a usable device handle (GPU_IS_LOST once the GPU fell off the bus).
fn gpu(st: &State, d: nvmlDevice_t) -> Result<usize, Ret> {
    let i = index_of(st, d)?;
    if st.model.gpus[i].lost {
        return Err(lost(st, i));
    }
    Ok(i)
}

fn with_gpu(d: nvmlDevice_t, f: impl FnOnce(&mut State, usize) -> Result<(), Ret>) -> Ret {
    with_state(|st| {
        let i = gpu(st, d)?;
        f(st, i)
    })
}

fn set_id(s: nvmlEventSet_t) -> Result<u64, Ret> {
    let p = s as usize;
    if p <= SET_BASE || (p - SET_BASE) % 16 != 0 {
        return Err(INVALID_ARGUMENT);
    }
    Ok(((p - SET_BASE) / 16) as u64)
}

unsafe fn put<T>(p: *mut T, v: T) -> Result<(), Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    p.write(v);
    Ok(())
}

unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let b = s.as_bytes();
    if (len as usize) < b.len() + 1 {
        return Err(INSUFFICIENT_SIZE);
    }
    for (k, c) in b.iter().enumerate() {
        buf.add(k).write(*c as c_char);
    }
    buf.add(b.len()).write(0);
    Ok(())
}

unsafe fn read_str(p: *const c_char) -> Result<String, Ret> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    CStr::from_ptr(p)
        .to_str()
        .map(str::to_owned)
        .map_err(|_| INVALID_ARGUMENT)
}

fn copy_str<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (k, c) in s.bytes().take(N - 1).enumerate() {
        out[k] = c as c_char;
    }
    out
}

fn pci_info(bdf: Bdf, device_id: u32, subsys: u32) -> nvmlPciInfo_t {
    nvmlPciInfo_t {
        busIdLegacy: copy_str(&bdf.legacy()),
        domain: bdf.domain,
        bus: bdf.bus,
        device: bdf.device,
        pciDeviceId: device_id,
        pciSubSystemId: subsys,
        busId: copy_str(&bdf.nvml()),
    }
}

/// Writes a CPU / NUMA-node list as an array of 64-bit words (bits beyond `words` are dropped).
unsafe fn put_mask(out: *mut c_ulong, words: c_uint, bits: &[u32]) -> Result<(), Ret> {
    if out.is_null() || words == 0 {
        return Err(INVALID_ARGUMENT);
    }
    let per = c_ulong::BITS;
    for w in 0..words as usize {
        out.add(w).write(0);
    }
    for &b in bits {
        let w = (b / per) as usize;
        if w < words as usize {
            *out.add(w) |= 1 << (b % per);
        }
    }
    Ok(())
}

fn links(st: &State, i: usize) -> Result<&Vec<Remote>, Ret> {
    st.model.gpus[i].links.as_ref().ok_or(NOT_SUPPORTED)
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

// ------------------------------------------------------------------------------------------
// Init / system
// ------------------------------------------------------------------------------------------

fn init_impl() -> Ret {
    guard(|| {
        let mut g = lock();
        if let Some(st) = g.as_mut() {
            st.refcount += 1;
            return SUCCESS;
        }
        match Model::from_env() {
            Ok(m) => {
                if let Some(code) = m.init_error {
                    return code;
                }
                *g = Some(State::new(m));
                SUCCESS
            }
            Err(e) => {
                eprintln!("fake-nvml: nvmlInit failed: {e}");
                UNKNOWN
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    init_impl()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    init_impl()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init_impl()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    guard(|| {
        let mut g = lock();
        let Some(st) = g.as_mut() else {
            return UNINITIALIZED;
        };
        st.refcount -= 1;
        if st.refcount == 0 {
            st.status("shutdown");
            *g = None;
        }
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        18 => c"RM has detected an NVML/RM version mismatch.",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_state(|st| put_str(version, length, &st.model.driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    with_state(|st| put_str(version, length, &st.model.nvml_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> Ret {
    with_state(|st| put(v, st.model.cuda_driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> Ret {
    with_state(|st| put(v, st.model.cuda_driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetTopologyGpuSet(
    cpu: c_uint,
    count: *mut c_uint,
    devices: *mut nvmlDevice_t,
) -> Ret {
    with_state(|st| {
        let found: Vec<usize> = (0..st.model.gpus.len())
            .filter(|&i| st.model.gpus[i].cpu_affinity.contains(&cpu))
            .collect();
        put_handles(count, devices, &found)
    })
}

/// NVML's "count == 0 asks for the size" convention.
unsafe fn put_handles(
    count: *mut c_uint,
    devices: *mut nvmlDevice_t,
    found: &[usize],
) -> Result<(), Ret> {
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let cap = *count as usize;
    if cap == 0 {
        *count = found.len() as c_uint;
        return Ok(());
    }
    if devices.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let n = cap.min(found.len());
    for (k, &i) in found.iter().take(n).enumerate() {
        devices.add(k).write(handle(i));
    }
    *count = n as c_uint;
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Enumeration / identity
// ------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------
// Memory / processes / temperature
// ------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------------------
// ECC / retirement / remapping / field values
// ------------------------------------------------------------------------------------------

fn ecc_count(st: &State, i: usize, error_type: c_uint, counter: c_uint) -> Result<u64, Ret> {
    let e = &st.model.gpus[i].ecc;
    Ok(match (error_type, counter) {
        (0, 0) => e.volatile_sbe,
        (0, 1) => e.aggregate_sbe,
        (1, 0) => e.volatile_dbe,
        (1, 1) => e.aggregate_dbe,
        _ => return Err(INVALID_ARGUMENT),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with_gpu(device, |_, _| {
        if current.is_null() || pending.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(current, 1)?;
        put(pending, 1)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: c_uint,
    counter: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    with_gpu(device, |st, i| {
        put(count, ecc_count(st, i, error_type, counter)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDetailedEccErrors(
    device: nvmlDevice_t,
    error_type: c_uint,
    counter: c_uint,
    counts: *mut nvmlEccErrorCounts_t,
) -> Ret {
    with_gpu(device, |st, i| {
        let v = ecc_count(st, i, error_type, counter)?;
        put(
            counts,
            nvmlEccErrorCounts_t {
                l1Cache: 0,
                l2Cache: 0,
                deviceMemory: v,
                registerFile: 0,
            },
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryErrorCounter(
    device: nvmlDevice_t,
    error_type: c_uint,
    counter: c_uint,
    location: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    with_gpu(device, |st, i| {
        let v = ecc_count(st, i, error_type, counter)?;
        match location {
            2 => put(count, v),     // NVML_MEMORY_LOCATION_DRAM / DEVICE_MEMORY
            0..=7 => put(count, 0), // caches, register file, ...: always clean
            _ => Err(INVALID_ARGUMENT),
        }
    })
}

fn retired(st: &State, i: usize, cause: c_uint) -> Result<&Vec<u64>, Ret> {
    let e = &st.model.gpus[i].ecc;
    match cause {
        0 => Ok(&e.retired_sbe),
        1 => Ok(&e.retired_dbe),
        _ => Err(INVALID_ARGUMENT),
    }
}

unsafe fn retired_pages(
    device: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    with_gpu(device, |st, i| {
        let pages = retired(st, i, cause)?;
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let cap = *count as usize;
        *count = pages.len() as c_uint;
        if pages.is_empty() {
            return Ok(());
        }
        if addresses.is_null() || cap < pages.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, a) in pages.iter().enumerate() {
            addresses.add(k).write(*a);
            if !timestamps.is_null() {
                timestamps.add(k).write(1_700_000_000);
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Ret {
    retired_pages(device, cause, count, addresses, std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Ret {
    retired_pages(device, cause, count, addresses, timestamps)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    pending: *mut c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        put(pending, st.model.gpus[i].ecc.retired_pending as c_uint)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: nvmlDevice_t,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Ret {
    with_gpu(device, |st, i| {
        if corr.is_null() || unc.is_null() || pending.is_null() || failure.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let e = &st.model.gpus[i].ecc;
        put(corr, e.remapped_cor)?;
        put(unc, e.remapped_unc)?;
        put(pending, e.remap_pending as c_uint)?;
        put(failure, e.remap_failure as c_uint)
    })
}

enum Val {
    U32(u32),
    U64(u64),
}

fn field(st: &State, i: usize, id: c_uint) -> Result<Val, Ret> {
    let g = &st.model.gpus[i];
    let e = &g.ecc;
    Ok(match id {
        3 => Val::U64(e.volatile_sbe),  // NVML_FI_DEV_ECC_SBE_VOL_TOTAL
        4 => Val::U64(e.volatile_dbe),  // NVML_FI_DEV_ECC_DBE_VOL_TOTAL
        5 => Val::U64(e.aggregate_sbe), // NVML_FI_DEV_ECC_SBE_AGG_TOTAL
        6 => Val::U64(e.aggregate_dbe), // NVML_FI_DEV_ECC_DBE_AGG_TOTAL
        29 => Val::U64(e.retired_sbe.len() as u64), // NVML_FI_DEV_RETIRED_SBE
        30 => Val::U64(e.retired_dbe.len() as u64), // NVML_FI_DEV_RETIRED_DBE
        31 => Val::U32(e.retired_pending as u32), // NVML_FI_DEV_RETIRED_PENDING
        91 => Val::U32(links(st, i)?.len() as u32), // NVML_FI_DEV_NVLINK_LINK_COUNT
        142 => Val::U32(e.remapped_cor), // NVML_FI_DEV_REMAPPED_COR
        143 => Val::U32(e.remapped_unc), // NVML_FI_DEV_REMAPPED_UNC
        144 => Val::U32(e.remap_pending as u32), // NVML_FI_DEV_REMAPPED_PENDING
        145 => Val::U32(e.remap_failure as u32), // NVML_FI_DEV_REMAPPED_FAILURE
        230 => Val::U32(g.recovery_action), // NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        _ => return Err(NOT_SUPPORTED),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: c_int,
    values: *mut nvmlFieldValue_t,
) -> Ret {
    with_gpu(device, |st, i| {
        if count < 0 || (count > 0 && values.is_null()) {
            return Err(INVALID_ARGUMENT);
        }
        let ts = now_us();
        for k in 0..count as usize {
            let v = &mut *values.add(k);
            v.timestamp = ts;
            v.latencyUsec = 0;
            match field(st, i, v.fieldId) {
                Ok(Val::U32(x)) => {
                    v.valueType = 1; // NVML_VALUE_TYPE_UNSIGNED_INT
                    v.value = nvmlValue_t { uiVal: x };
                    v.nvmlReturn = SUCCESS;
                }
                Ok(Val::U64(x)) => {
                    v.valueType = 3; // NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                    v.value = nvmlValue_t { ullVal: x };
                    v.nvmlReturn = SUCCESS;
                }
                Err(e) => {
                    v.valueType = 1;
                    v.value = nvmlValue_t { ullVal: 0 };
                    v.nvmlReturn = e;
                }
            }
        }
        Ok(())
    })
}

// ------------------------------------------------------------------------------------------
// Topology / affinity / NVLink
// ------------------------------------------------------------------------------------------

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
        put(active, link(st, i, l)?.is_some() as c_uint)
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

// ------------------------------------------------------------------------------------------
// Events
// ------------------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    with_gpu(device, |st, i| {
        put(types, st.model.gpus[i].supported_events)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    with_state(|st| {
        if set.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let id = st.next_set;
        st.next_set += 1;
        st.sets.insert(id, Default::default());
        put(set, (SET_BASE + id as usize * 16) as nvmlEventSet_t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    with_state(|st| {
        let id = set_id(set)?;
        st.sets.remove(&id).map(|_| ()).ok_or(INVALID_ARGUMENT)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    with_gpu(device, |st, i| {
        let id = set_id(set)?;
        let supported = st.model.gpus[i].supported_events;
        if !st.sets.contains_key(&id) {
            return Err(INVALID_ARGUMENT);
        }
        if types & !supported != 0 {
            return Err(NOT_SUPPORTED);
        }
        if let Some(s) = st.sets.get_mut(&id) {
            *s.regs.entry(i).or_insert(0) |= types;
        }
        st.status(&format!("registered {i} 0x{types:x}"));
        Ok(())
    })
}

unsafe fn wait(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) -> Ret {
    guard(|| {
        let Ok(id) = set_id(set) else {
            return INVALID_ARGUMENT;
        };
        if data.is_null() {
            return INVALID_ARGUMENT;
        }
        let deadline = Instant::now() + Duration::from_millis(timeout_ms as u64);
        loop {
            {
                let mut g = lock();
                let Some(st) = g.as_mut() else {
                    return UNINITIALIZED;
                };
                st.poll_events();
                let Some(s) = st.sets.get_mut(&id) else {
                    return INVALID_ARGUMENT;
                };
                if let Some(ev) = s.queue.pop_front() {
                    data.write(nvmlEventData_t {
                        device: handle(ev.gpu),
                        eventType: ev.kind,
                        eventData: ev.data,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    });
                    st.status(&format!("delivered {} 0x{:x} {}", ev.gpu, ev.kind, ev.data));
                    return SUCCESS;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return TIMEOUT;
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    wait(set, data, timeout_ms)
}
