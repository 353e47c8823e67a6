//! Faults shaped like real incidents: processes attached to fake GPUs through their environment, killed
//! around the event as CUDA does, companion events, and lost GPUs whose calls stall.

mod common;
mod support;

use common::{init, Env};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn config(attach: bool) -> String {
    let gpus: Vec<String> = (0..3)
        .map(|i| {
            format!(
                r#"{{"uuid": "GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000-0000-0000-000000000000", "pci_bus_id": "0000:{:02x}:00.0"}}"#,
                0x18 + i * 0x10
            )
        })
        .collect();
    format!(r#"{{"attach_processes": {attach}, "gpus": [{}]}}"#, gpus.join(","))
}

/// A `sleep` standing in for a worker, with the given environment.
fn worker(env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new("sleep");
    cmd.arg("60");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn sleep")
}

/// Kills (if still running) and reaps a child; returns the signal that ended it.
fn reap(mut child: Child) -> Option<i32> {
    let _ = child.kill();
    child.wait().expect("wait").signal()
}

fn pids(nvml: &nvml_wrapper::Nvml, gpu: u32) -> Vec<u32> {
    let d = nvml.device_by_index(gpu).unwrap();
    let mut p: Vec<u32> = d.running_compute_processes().unwrap().iter().map(|p| p.pid).collect();
    p.sort_unstable();
    p
}

#[test]
fn processes_attach_through_cuda_visible_devices_and_local_rank() {
    let env = Env::with_json("attach", &config(true));
    let by_index = worker(&[("CUDA_VISIBLE_DEVICES", "2,1"), ("LOCAL_RANK", "1")]);
    let by_uuid = worker(&[("CUDA_VISIBLE_DEVICES", "GPU-22222222,GPU-00000000"), ("LOCAL_RANK", "0")]);
    let spare = worker(&[("CUDA_VISIBLE_DEVICES", "1"), ("LOCAL_RANK", "0"), ("MUSTER_WARM_SPARE", "1")]);
    let no_rank = worker(&[("CUDA_VISIBLE_DEVICES", "1")]);
    // A zombie: exited, not reaped yet.
    let mut zombie = Command::new("true");
    let zombie = zombie.env("CUDA_VISIBLE_DEVICES", "1").env("LOCAL_RANK", "0").spawn().unwrap();
    let nvml = init();
    let gone = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"));
    let t = Instant::now();
    while !gone(zombie.id()) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }

    assert_eq!(pids(&nvml, 1), [by_index.id()]);
    assert_eq!(pids(&nvml, 2), [by_uuid.id()]);
    assert!(pids(&nvml, 0).is_empty());
    // Lines still add processes of their own.
    env.inject("process 0 4242 1024");
    assert_eq!(pids(&nvml, 0), [4242]);

    let (a, b) = (by_index.id(), by_uuid.id());
    for c in [by_index, by_uuid, spare, no_rank, zombie] {
        reap(c);
    }
    assert!(!pids(&nvml, 1).contains(&a) && !pids(&nvml, 2).contains(&b), "exited workers are no longer attached");
    drop(nvml);
    drop(env);

    // Off by default.
    let _env = Env::with_json("noattach", &config(false));
    let w = worker(&[("CUDA_VISIBLE_DEVICES", "0"), ("LOCAL_RANK", "0")]);
    let nvml = init();
    assert!(pids(&nvml, 0).is_empty());
    reap(w);
}

fn xid_set<'a>(nvml: &'a nvml_wrapper::Nvml, gpus: &[u32]) -> nvml_wrapper::EventSet<'a> {
    let mut set = nvml.create_event_set().unwrap();
    for &g in gpus {
        let mask = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        set = nvml.device_by_index(g).unwrap().register_events(mask, set).unwrap();
    }
    set
}

/// The position of the first status line starting with `prefix`.
fn line_of(status: &str, prefix: &str) -> usize {
    status.lines().position(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} in:\n{status}"))
}

#[test]
fn a_fault_kills_its_gpus_processes_before_the_event() {
    let env = Env::with_json("kill-before", &config(false));
    let victim = worker(&[("CUDA_VISIBLE_DEVICES", "1"), ("LOCAL_RANK", "0")]);
    let bystander = worker(&[("CUDA_VISIBLE_DEVICES", "1,0"), ("LOCAL_RANK", "1")]);
    let nvml = init();
    let set = xid_set(&nvml, &[1]);
    env.inject("lost 1 kill=-30");
    // One call reads the line; from then on the helper thread acts with nobody calling NVML.
    assert_eq!(nvml.device_count().unwrap(), 3);
    let status = env.await_status("event 1 0x8 79");
    assert!(line_of(&status, &format!("killed 1 pids=[{}]", victim.id())) < line_of(&status, "event 1 0x8 79"), "{status}");
    assert_eq!(reap(victim), Some(9));
    let ev = set.wait(5000).unwrap();
    assert!(matches!(ev.event_data, Some(XidError::Value(79))));
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    // Only the GPU's own processes die.
    assert!(std::fs::metadata(format!("/proc/{}", bystander.id())).is_ok());
    assert_eq!(reap(bystander), Some(9)); // killed by reap itself
}

#[test]
fn a_fault_kills_its_gpus_processes_after_the_event() {
    let env = Env::with_json("kill-after", &config(false));
    let victim = worker(&[("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-0000-0000-000000000000"), ("LOCAL_RANK", "0")]);
    let nvml = init();
    let set = xid_set(&nvml, &[0]);
    env.inject("xid 0 79 kill=+30");
    let ev = set.wait(5000).unwrap();
    assert!(matches!(ev.event_data, Some(XidError::Value(79))));
    let status = env.await_status("killed 0 ");
    assert!(line_of(&status, "event 0 0x8 79") < line_of(&status, &format!("killed 0 pids=[{}]", victim.id())), "{status}");
    // XID 79 is a GPU fallen off the bus: lost from the event on, as with the driver.
    assert!(matches!(nvml.device_by_index(0), Err(NvmlError::GpuLost)));
    let mut victim = victim;
    assert_eq!(victim.wait().unwrap().signal(), Some(9));
}

#[test]
fn companion_events_follow_as_the_driver_logs_them() {
    let env = Env::with_json("companion", &config(false));
    let nvml = init();
    let set = xid_set(&nvml, &[0, 2]);
    env.inject("dbe 0 companion=48@20");
    let ev = set.wait(5000).unwrap();
    assert_eq!(ev.event_type, EventTypes::DOUBLE_BIT_ECC_ERROR);
    let ev = set.wait(5000).unwrap();
    assert_eq!((ev.event_type, ev.device.index().unwrap()), (EventTypes::CRITICAL_XID_ERROR, 0));
    assert!(matches!(ev.event_data, Some(XidError::Value(48))));

    // An uncontained ECC error leaves a row remap pending.
    env.inject("xid 2 95 remap=pending");
    let ev = set.wait(5000).unwrap();
    assert!(matches!(ev.event_data, Some(XidError::Value(95))));
    let fields = nvml.device_by_index(2).unwrap().field_values_for(&[FieldId(143), FieldId(144)]).unwrap();
    let v: Vec<u32> = fields
        .iter()
        .map(|f| match f.as_ref().unwrap().value {
            Ok(SampleValue::U32(x)) => x,
            ref other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(v, [1, 1]);
    assert!(matches!(set.wait(100), Err(NvmlError::Timeout)));
}

#[test]
fn calls_on_a_stalled_lost_gpu_block_without_blocking_the_others() {
    let env = Env::with_json("stall", &config(false));
    let nvml = init();
    let set = xid_set(&nvml, &[0]);
    let lost = nvml.device_by_index(2).unwrap();
    env.inject("lost 2 stall=3000");
    std::thread::scope(|s| {
        let stalled = s.spawn(|| {
            let t = Instant::now();
            let r = lost.uuid();
            (t.elapsed(), r)
        });
        env.await_status("applied lost 2");
        // While that call sleeps, the other GPUs answer and their events arrive.
        env.inject("xid 0 13");
        let ev = set.wait(5000).unwrap();
        assert!(matches!(ev.event_data, Some(XidError::Value(13))));
        assert!(!stalled.is_finished(), "the stalled call returned before the other GPU's event");
        assert_eq!(nvml.device_by_index(0).unwrap().index().unwrap(), 0);
        let (took, r) = stalled.join().unwrap();
        assert!(matches!(r, Err(NvmlError::GpuLost)), "{r:?}");
        assert!(took >= Duration::from_millis(3000), "{took:?}");
    });
    assert!(matches!(nvml.device_by_index(2), Err(NvmlError::GpuLost)));
}
