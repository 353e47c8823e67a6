//! Loads the fake library through nvml-wrapper 0.13, exactly as muster does, and exercises it.
//!
//! The library keeps one global state per process, so the tests here take a lock and each one
//! initialises NVML from its own config (the state is rebuilt when the refcount returns to 0).

mod common;
mod support;

use common::{init, init_err, Env};

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, MemoryLocation, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use std::path::Path;
use std::time::{Duration, Instant};

const SMALL: &str = r#"{
  "driver_version": "570.86.15",
  "cuda_driver_version": 12080,
  "gpus": [
    {"uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "00000000:18:00.0", "numa_node": 0,
     "cpu_affinity": [0,1,2,3], "processes": [{"pid": 4242, "used_gpu_memory": 1048576}],
     "ecc": {"volatile_dbe": 0, "volatile_sbe": 2, "aggregate_dbe": 1, "retired_dbe": [4096], "remap_pending": true},
     "supported_events": ["xid", "dbe", "sbe"]},
    {"uuid": "GPU-11111111-0000-0000-0000-000000000000", "pci_bus_id": "00000000:2a:00.0", "numa_node": 0,
     "cpu_affinity": [0,1,2,3], "supported_events": ["xid", "dbe", "sbe"]},
    {"uuid": "GPU-22222222-0000-0000-0000-000000000000", "pci_bus_id": "00000000:9a:00.0", "numa_node": 1,
     "cpu_affinity": [4,5,6,7,64], "supported_events": ["xid", "dbe", "sbe"]},
    {"uuid": "GPU-33333333-0000-0000-0000-000000000000", "pci_bus_id": "00000000:ab:00.0", "numa_node": 1,
     "cpu_affinity": [4,5,6,7], "supported_events": ["xid"]}
  ],
  "topology": [["X","NV4","NV2","PHB"],["NV4","X","SYS","PXB"],["NV2","SYS","X","NODE"],["PHB","PXB","NODE","X"]]
}"#;

#[test]
fn hgx_inventory() {
    let _env = Env::new("hgx", &support::fixture("hgx-h100.json"));
    let nvml = init();
    assert_eq!(nvml.sys_driver_version().unwrap(), "570.86.15");
    assert_eq!(nvml.sys_nvml_version().unwrap(), "12.570.86.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12080);
    assert_eq!(nvml.device_count().unwrap(), 8);

    let d0 = nvml.device_by_index(0).unwrap();
    let d4 = nvml.device_by_index(4).unwrap();
    assert_eq!(
        d0.uuid().unwrap(),
        "GPU-00000000-0000-4000-8000-000000000100"
    );
    assert_eq!(d0.name().unwrap(), "NVIDIA H100 80GB HBM3");
    let pci = d4.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:9A:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x9a, 0));
    assert_eq!(pci.pci_device_id, 0x2330_10DE);
    assert_eq!(d4.index().unwrap(), 4);
    assert_eq!(d4.minor_number().unwrap(), 4);
    // Either bus-id form, any case.
    assert_eq!(
        nvml.device_by_pci_bus_id("0000:9a:00.0")
            .unwrap()
            .index()
            .unwrap(),
        4
    );
    assert_eq!(
        nvml.device_by_pci_bus_id("00000000:DB:00.0")
            .unwrap()
            .index()
            .unwrap(),
        7
    );
    assert!(matches!(
        nvml.device_by_pci_bus_id("0000:99:00.0"),
        Err(NvmlError::NotFound)
    ));
    assert_eq!(
        nvml.device_by_uuid("GPU-77777777-0000-4000-8000-000000000100")
            .unwrap()
            .index()
            .unwrap(),
        7
    );
    assert!(matches!(
        nvml.device_by_uuid("GPU-nope"),
        Err(NvmlError::NotFound)
    ));
    assert!(matches!(
        nvml.device_by_index(8),
        Err(NvmlError::InvalidArg)
    ));

    let mem = d0.memory_info().unwrap();
    assert_eq!(mem.total, 85_520_809_984);
    assert_eq!(mem.used, 0);
    assert_eq!(d0.temperature(TemperatureSensor::Gpu).unwrap(), 35);
    assert!(d0.running_compute_processes().unwrap().is_empty());
    assert_eq!(
        d0.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        0
    );
    assert!(d0
        .retired_pages(nvml_wrapper::enum_wrappers::device::RetirementCause::DoubleBitEccError)
        .unwrap()
        .is_empty());
    assert!(!d0.are_pages_pending_retired().unwrap());

    // PCIe path (pci_topology) and NVLink (NV18 through NVSwitch).
    assert_eq!(
        d0.topology_common_ancestor(nvml.device_by_index(1).unwrap())
            .unwrap(),
        TopologyLevel::Node
    );
    assert_eq!(
        nvml.topology_common_ancestor(&d0, &d4).unwrap(),
        TopologyLevel::System
    );
    let mut active = 0;
    for l in 0..18 {
        let link = d0.link_wrapper_for(l);
        if link.is_active().unwrap() {
            active += 1;
            assert_eq!(
                link.remote_pci_info().unwrap().bus_id,
                format!("00000000:{:02X}:00.0", 5 + l % 4)
            );
            let mut kind = 99;
            let rc = unsafe {
                (nvml
                    .lib()
                    .nvmlDeviceGetNvLinkRemoteDeviceType
                    .as_ref()
                    .unwrap())(d0.handle(), l, &mut kind)
            };
            assert_eq!((rc, kind), (0, 2), "remote is an NVSwitch");
        }
    }
    assert_eq!(active, 18);
    assert!(matches!(
        d0.link_wrapper_for(18).is_active(),
        Err(NvmlError::InvalidArg)
    ));

    // Affinity: cpus 0-7,16-23 / node 0 for GPU 0; node 1 for GPU 4; no GPU NUMA id on x86.
    assert_eq!(d0.cpu_affinity(1).unwrap(), vec![0x00FF_00FF]);
    assert_eq!(d4.cpu_affinity(2).unwrap(), vec![0xFF00_FF00, 0]);
    assert_eq!(d0.memory_affinity(1, 0).unwrap(), vec![0b01]);
    assert_eq!(d4.memory_affinity(1, 0).unwrap(), vec![0b10]);
    assert!(matches!(d0.numa_node_id(), Err(NvmlError::NotSupported)));

    // Field values: NVLink count, row remap, recovery action; unknown ids are per-field NotSupported.
    let ids = [
        FieldId(91),
        FieldId(144),
        FieldId(145),
        FieldId(230),
        FieldId(1),
    ];
    let vals: Vec<Result<FieldValueSample, NvmlError>> = d0.field_values_for(&ids).unwrap();
    let v = |k: usize| vals[k].as_ref().unwrap().value.as_ref().unwrap().clone();
    assert!(matches!(v(0), SampleValue::U32(18)));
    assert!(matches!(v(1), SampleValue::U32(0)));
    assert!(matches!(v(2), SampleValue::U32(0)));
    assert!(matches!(v(3), SampleValue::U32(0)));
    assert!(matches!(
        vals[4].as_ref().unwrap().value,
        Err(NvmlError::NotSupported)
    ));

    let supported = d0.supported_event_types().unwrap();
    assert_eq!(
        supported,
        EventTypes::SINGLE_BIT_ECC_ERROR
            | EventTypes::DOUBLE_BIT_ECC_ERROR
            | EventTypes::PSTATE_CHANGE
            | EventTypes::CRITICAL_XID_ERROR
    );
    nvml.shutdown().unwrap();
}

#[test]
fn pcie_topology() {
    let _env = Env::new("pcie", &support::fixture("pcie-8gpu.json"));
    let nvml = init();
    let d: Vec<_> = (0..8).map(|i| nvml.device_by_index(i).unwrap()).collect();
    assert_eq!(
        nvml.topology_common_ancestor(&d[0], &d[4]).unwrap(),
        TopologyLevel::Single
    ); // PIX
    assert_eq!(
        nvml.topology_common_ancestor(&d[0], &d[1]).unwrap(),
        TopologyLevel::Node
    );
    assert_eq!(
        nvml.topology_common_ancestor(&d[0], &d[2]).unwrap(),
        TopologyLevel::System
    );
    let near: Vec<u32> = d[1]
        .topology_nearest_gpus(TopologyLevel::Single)
        .unwrap()
        .iter()
        .map(|g| g.index().unwrap())
        .collect();
    assert_eq!(near, vec![5]);
    // No NVLink on this box.
    assert!(matches!(
        d[0].link_wrapper_for(0).is_active(),
        Err(NvmlError::NotSupported)
    ));
    // NVML index order != bus order.
    let bus: Vec<u32> = d.iter().map(|g| g.pci_info().unwrap().bus).collect();
    assert_eq!(bus, vec![0x1b, 0x3d, 0x8a, 0xb1, 0x1c, 0x3e, 0x8b, 0xb2]);
    assert_eq!(d[3].memory_affinity(1, 0).unwrap(), vec![0b10]);
}

#[test]
fn small_config_state_and_direct_nvlink() {
    let _env = Env::with_json("small", SMALL);
    let nvml = init();
    let d0 = nvml.device_by_index(0).unwrap();
    let d2 = nvml.device_by_index(2).unwrap();

    let procs = d0.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 4242);
    assert_eq!(d0.memory_info().unwrap().used, 1_048_576);
    assert_eq!(
        d0.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap(),
        2
    );
    assert_eq!(
        d0.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        1
    );
    assert_eq!(
        d0.memory_error_counter(
            MemoryError::Corrected,
            EccCounter::Volatile,
            MemoryLocation::Device
        )
        .unwrap(),
        2
    );
    assert_eq!(
        d0.memory_error_counter(
            MemoryError::Corrected,
            EccCounter::Volatile,
            MemoryLocation::L2Cache
        )
        .unwrap(),
        0
    );
    let pages = d0
        .retired_pages(nvml_wrapper::enum_wrappers::device::RetirementCause::DoubleBitEccError)
        .unwrap();
    assert_eq!(pages.len(), 1);
    assert_eq!(pages[0].address, 4096);
    let (mut c, mut u, mut p, mut f) = (9, 9, 9, 9);
    let rc = unsafe {
        (nvml.lib().nvmlDeviceGetRemappedRows.as_ref().unwrap())(
            d0.handle(),
            &mut c,
            &mut u,
            &mut p,
            &mut f,
        )
    };
    assert_eq!((rc, c, u, p, f), (0, 0, 0, 1, 0));

    // Direct NVLinks: NV4 to GPU 1, NV2 to GPU 2 -> counting remote bus ids gives 4 and 2.
    let mut per_peer = std::collections::BTreeMap::new();
    for l in 0..18 {
        let link = d0.link_wrapper_for(l);
        if link.is_active().unwrap() {
            *per_peer
                .entry(link.remote_pci_info().unwrap().bus_id)
                .or_insert(0) += 1;
        } else {
            assert!(matches!(
                link.remote_pci_info(),
                Err(NvmlError::NotSupported)
            ));
        }
    }
    assert_eq!(
        per_peer.into_iter().collect::<Vec<_>>(),
        vec![
            ("00000000:2A:00.0".to_string(), 4),
            ("00000000:9A:00.0".to_string(), 2)
        ]
    );
    assert!(matches!(
        nvml.device_by_index(3)
            .unwrap()
            .link_wrapper_for(0)
            .is_active(),
        Err(NvmlError::NotSupported)
    ));
    // Default common-ancestor mapping from the topology cells.
    let lvl = |a: u32, b: u32| {
        nvml.topology_common_ancestor(
            &nvml.device_by_index(a).unwrap(),
            &nvml.device_by_index(b).unwrap(),
        )
        .unwrap()
    };
    assert_eq!(lvl(0, 1), TopologyLevel::Internal);
    assert_eq!(lvl(0, 3), TopologyLevel::HostBridge);
    assert_eq!(lvl(1, 3), TopologyLevel::Multiple);
    assert_eq!(lvl(2, 3), TopologyLevel::Node);
    assert_eq!(lvl(1, 2), TopologyLevel::System);
    // CPU 64 lands in the second word.
    assert_eq!(d2.cpu_affinity(2).unwrap(), vec![0xF0, 1]);
    assert_eq!(d2.cpu_affinity(1).unwrap(), vec![0xF0]);
}

#[test]
fn events_injection_lost_and_timeout() {
    let env = Env::with_json("events", SMALL);
    let nvml = init();
    let devs: Vec<_> = (0..4).map(|i| nvml.device_by_index(i).unwrap()).collect();
    let handles: Vec<_> = devs.iter().map(|d| unsafe { d.handle() }).collect();

    // GPU 3 only supports XID: registering DBE on it fails (and the wrapper frees the set).
    let set = nvml.create_event_set().unwrap();
    let err = devs[3]
        .register_events(EventTypes::DOUBLE_BIT_ECC_ERROR, set)
        .err()
        .unwrap();
    assert!(matches!(err.error, NvmlError::NotSupported));

    let mut set = nvml.create_event_set().unwrap();
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    for d in &devs[..3] {
        set = d
            .register_events(wanted & d.supported_event_types().unwrap(), set)
            .unwrap();
    }
    set = devs[3]
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    assert!(
        env.status().contains("registered 2 0xa"),
        "status: {}",
        env.status()
    );

    // Nothing injected: times out after roughly the timeout.
    let t = Instant::now();
    assert!(matches!(set.wait(120), Err(NvmlError::Timeout)));
    assert!(
        t.elapsed() >= Duration::from_millis(110),
        "{:?}",
        t.elapsed()
    );

    // XID on GPU 2, injected while wait() is blocked (13: a 79 would leave the GPU lost).
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            env.inject("xid 2 13");
        });
        let t = Instant::now();
        let ev = set.wait(5000).unwrap();
        assert!(t.elapsed() < Duration::from_millis(2000));
        assert_eq!(unsafe { ev.device.handle() }, handles[2]);
        assert_eq!(
            ev.device.uuid().unwrap(),
            "GPU-22222222-0000-0000-0000-000000000000"
        );
        assert_eq!(ev.event_type, EventTypes::CRITICAL_XID_ERROR);
        assert!(matches!(
            ev.event_data,
            Some(nvml_wrapper::enums::event::XidError::Value(13))
        ));
    });

    // DBE bumps the counters; SBE is not registered -> no event, but the counter moves.
    env.inject("sbe 1");
    env.inject("dbe 1");
    let ev = set.wait(2000).unwrap();
    assert_eq!(unsafe { ev.device.handle() }, handles[1]);
    assert_eq!(ev.event_type, EventTypes::DOUBLE_BIT_ECC_ERROR);
    assert!(ev.event_data.is_none());
    assert_eq!(
        devs[1]
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        1
    );
    assert_eq!(
        devs[1]
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate)
            .unwrap(),
        1
    );
    assert_eq!(
        devs[1]
            .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            .unwrap(),
        1
    );
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));

    // Processes come and go without events; getters see them right away.
    env.inject("process 1 777 2048");
    let procs = devs[1].running_compute_processes().unwrap();
    assert_eq!((procs.len(), procs[0].pid), (1, 777));
    env.inject("noprocess 1 777");
    assert!(devs[1].running_compute_processes().unwrap().is_empty());
    env.inject("recovery 1 4");
    let v = devs[1].field_values_for(&[FieldId(230)]).unwrap();
    assert!(matches!(
        v[0].as_ref().unwrap().value,
        Ok(SampleValue::U32(4))
    ));

    // Events for an unregistered type/device are dropped; malformed lines are ignored.
    env.inject("this is not an event");
    env.inject("xid 9 13");
    env.inject("sbe 3");
    assert!(matches!(set.wait(80), Err(NvmlError::Timeout)));

    // Lost: one XID 79, then GPU_IS_LOST on every call for that GPU; the others keep working.
    env.inject("lost 3");
    let ev = set.wait(2000).unwrap();
    assert_eq!(unsafe { ev.device.handle() }, handles[3]);
    assert!(matches!(
        ev.event_data,
        Some(nvml_wrapper::enums::event::XidError::Value(79))
    ));
    assert!(matches!(ev.device.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(devs[3].pci_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(devs[3].memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(nvml.device_by_index(3), Err(NvmlError::GpuLost)));
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert_eq!(
        devs[0].uuid().unwrap(),
        "GPU-00000000-0000-0000-0000-000000000000"
    );
    env.inject("xid 3 13");
    assert!(matches!(set.wait(60), Err(NvmlError::Timeout)));
    let status = env.status();
    assert!(
        status.contains("applied lost 3") && status.contains("malformed this is not an event"),
        "{status}"
    );
    set.release_events().unwrap();
}

#[test]
fn only_registered_devices_get_events() {
    let env = Env::with_json("reg", SMALL);
    let nvml = init();
    let set = nvml.create_event_set().unwrap();
    let set = nvml
        .device_by_index(0)
        .unwrap()
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .unwrap();
    env.inject("xid 1 48");
    env.inject("dbe 0");
    assert!(matches!(set.wait(100), Err(NvmlError::Timeout)));
    env.inject("xid 0 31");
    let ev = set.wait(1000).unwrap();
    assert_eq!(ev.device.index().unwrap(), 0);
    assert!(matches!(
        ev.event_data,
        Some(nvml_wrapper::enums::event::XidError::Value(31))
    ));
    // A second handle on the library shares the state (refcounted init).
    let nvml2 = init();
    assert_eq!(
        nvml2
            .device_by_index(0)
            .unwrap()
            .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            .unwrap(),
        1
    );
    drop(nvml2);
    assert_eq!(nvml.device_count().unwrap(), 4);
}

#[test]
fn init_failures() {
    {
        let _env = Env::new("missing", Path::new("/nonexistent/fake-nvml.json"));
        assert!(matches!(init_err(), NvmlError::Unknown));
    }
    {
        let _env = Env::with_json("badjson", "{ not json");
        assert!(matches!(init_err(), NvmlError::Unknown));
    }
    {
        let _env = Env::with_json(
            "badtopo",
            r#"{"gpus":[{"uuid":"GPU-a","pci_bus_id":"0000:01:00.0"}],"topology":[["NV4"]]}"#,
        );
        assert!(matches!(init_err(), NvmlError::Unknown));
    }
    {
        let _env = Env::with_json("drv", r#"{"gpus":[], "init_error": "driver_not_loaded"}"#);
        assert!(matches!(init_err(), NvmlError::DriverNotLoaded));
    }
    {
        let _env = Env::with_json(
            "rm",
            r#"{"gpus":[], "init_error": "lib_rm_version_mismatch"}"#,
        );
        assert!(matches!(init_err(), NvmlError::LibRmVersionMismatch));
    }
    {
        let _env = Env::with_json("empty", r#"{"gpus":[]}"#);
        let nvml = init();
        assert_eq!(nvml.device_count().unwrap(), 0);
    }
}
