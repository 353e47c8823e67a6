//! A fake `libnvidia-ml.so` for testing muster without a GPU.
//!
//! Load it with `nvml_wrapper::Nvml::builder().lib_path(..).init()`; configure it with the JSON
//! file named by `FAKE_NVML_CONFIG`; inject faults at run time by appending lines to the
//! configured events file. See README.md for the config format and the event-line grammar.
//!
//! Every exported function catches panics, checks pointers (NVML_ERROR_INVALID_ARGUMENT) and
//! works on one global, mutex-protected state.
//!
//! This file: the shared helpers and the init/system exports; `device.rs`, `ecc.rs`, `topo.rs` and
//! `events.rs` the other exports; `config.rs` the JSON model, `state.rs` the state and the events-file
//! reader, `incident.rs` the events-file grammar, `procs.rs` the processes attached through `/proc`.

// The exported functions are the C ABI of NVML; their contracts are NVML's (documented in
// nvml.h), not restated here.
#![allow(clippy::missing_safety_doc)]
#![allow(non_snake_case)]

mod config;
mod device;
mod ecc;
mod events;
#[cfg(test)]
mod fuzz;
mod incident;
mod procs;
mod state;
mod topo;

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
