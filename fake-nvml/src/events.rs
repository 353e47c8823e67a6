//! NVML exports: event sets, their registrations and waits.

use super::*;

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
