//! Bad input: one line naming the flag and what is valid, exit 2, and no worker started.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn bad_input_table() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let script = dir.path().join("w.py");
    std::fs::write(&script, format!("open({:?}, 'a').write('x')\n", marker)).unwrap();
    let not_exec = dir.path().join("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\ntouch started\n").unwrap();
    let script = script.to_str().unwrap();
    let not_exec = not_exec.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--nnodes", "0", script], "--nnodes"),
        (&["--nnodes", "3:2", script], "--nnodes"),
        (&["--nnodes", "a", script], "--nnodes"),
        (&["--nproc-per-node", "0", script], "--nproc-per-node"),
        (&["--nproc-per-node", "gpu", script], "--nproc-per-node gpu"),
        (&["--standalone", "/nonexistent/train.py"], "/nonexistent/train.py"),
        (&["--no-python", not_exec], "--no-python"),
        (&["--rdzv-conf", "foo", script], "--rdzv-conf"),
        (&["--max-restarts", "-1", script], "--max-restarts"),
        (&["--monitor-interval", "0", script], "--monitor-interval"),
        (&["-m", "--no-python", script], "--no-python"),
        (&["--redirects", "7", script], "--redirects"),
        (&["--signals-to-handle", "SIGKILL", script], "--signals-to-handle"),
        (&["--rdzv-backend", "bogus", "--rdzv-endpoint", "h:1", script], "--rdzv-backend"),
        (&["--no-python", "--warm-spares", "torch", "/bin/true"], "--warm-spares"),
        (&["--warm-spares", "torch,os;rm", script], "--warm-spares"),
        (&["--warm-spares", "torch", "--warm-spares-delay", "-1", script], "--warm-spares-delay"),
    ];
    for (args, flag) in cases {
        // No NVML library can be found: `gpu` must fail whatever this machine has.
        let out = run(muster().args(*args).env("MUSTER_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"), Duration::from_secs(30));
        let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert_eq!(lines.len(), 1, "{args:?}: expected one line, got {lines:?}");
        assert!(lines[0].contains(flag), "{args:?}: {:?} does not name {flag}", lines[0]);
        assert!(!marker.exists(), "{args:?}: a worker was started");
    }
}

#[test]
fn pet_environment_is_a_fallback_and_the_command_line_wins() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("w.py");
    std::fs::write(&script, "import os\nprint('WS ' + os.environ['WORLD_SIZE'] + ' ' + os.environ['TORCHELASTIC_MAX_RESTARTS'])\n")
        .unwrap();
    let out = run(
        muster().env("PET_NPROC_PER_NODE", "3").env("PET_MAX_RESTARTS", "4").arg(&script),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout.matches("WS 3 4").count(), 3, "{}", out.stdout);
    let out = run(muster().env("PET_NPROC_PER_NODE", "3").arg("--nproc_per_node=1").arg(&script), Duration::from_secs(60));
    assert_eq!(out.stdout.matches("WS 1 ").count(), 1, "{}", out.stdout);
}

#[test]
fn script_args_pass_through_with_local_rank_substitution() {
    let out = run(
        muster().args(["--nproc-per-node=2", "--no-python", "echo", "--standalone", "lr=$local_rank", "${local_rank}x", "cost$$"]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", out.stderr);
    let mut lines: Vec<&str> = out.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["--standalone lr=0 0x cost$", "--standalone lr=1 1x cost$"]);
}
