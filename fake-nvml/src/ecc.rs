//! NVML exports: ECC counters, page retirement, row remapping and field values.

use super::*;

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
