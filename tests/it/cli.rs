//! Bad input: one line naming the flag and what is valid, exit 2, and no worker started.

use crate::common;

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
    let a_file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let under_a_file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml/logs");
    let cases: &[(&[&str], &str)] = &[
        (&["--nnodes", "0", script], "--nnodes"),
        (&["--nnodes", "3:2", script], "--nnodes"),
        (&["--nnodes", "a", script], "--nnodes"),
        (&["--nproc-per-node", "0", script], "--nproc-per-node"),
        (&["--nproc-per-node", "gpu", script], "--nproc-per-node gpu"),
        (&["--standalone", "/nonexistent/train.py"], "/nonexistent/train.py"),
        (&["--no-python", not_exec], "--no-python"),
        (&["--rdzv-conf", "foo", script], "--rdzv-conf"),
        (&["--rdzv-conf", "join_timeout=soon", script], "join_timeout=soon"),
        (&["--max-restarts", "-1", script], "--max-restarts"),
        (&["--monitor-interval", "0", script], "--monitor-interval"),
        (&["-m", "--no-python", script], "--no-python"),
        (&["--redirects", "7", script], "--redirects"),
        (&["--signals-to-handle", "SIGKILL", script], "--signals-to-handle"),
        (&["--rdzv-backend", "bogus", "--rdzv-endpoint", "h:1", script], "--rdzv-backend"),
        (&["--no-python", "--warm-spares", "torch", "/bin/true"], "--warm-spares"),
        (&["--warm-spares", "torch,os;rm", script], "--warm-spares"),
        (&["--warm-spares", "torch", "--warm-spares-delay", "-1", script], "--warm-spares-delay"),
        // argparse's reading of the launcher's own arguments
        (&["--frobnicate", script], "unrecognized arguments: --frobnicate"),
        (&["--frobnicate=3", script], "unrecognized arguments: --frobnicate=3"),
        (&["--r", script], "--r could match --rdzv-backend, --rdzv_backend, --rdzv-endpoint"),
        (&["--nproc", "2", script], "--nproc could match --nproc-per-node, --nproc_per_node"),
        (&["--rdzv-id", "--standalone", script], "--rdzv-id"),
        (&["--standalone=1", script], "--standalone"),
        // a repeated option takes the last value, and that one is checked
        (&["--nproc-per-node", "2", "--nproc-per-node", "0", script], "--nproc-per-node"),
        // values only the file system or the rendezvous can refuse, refused before anything starts
        (&["--log-dir", a_file, script], "--log-dir"),
        (&["--log-dir", under_a_file, script], "--log-dir"),
        (&["--log-dir", "/proc/muster-log-dir", script], "--log-dir"),
        (&["--rdzv-endpoint", ":", script], "--rdzv-endpoint"),
        (&["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1:31005", script], "[::1:31005"),
        (&["--rdzv-backend", "c10d", "--rdzv-endpoint", "host:99999", script], "--rdzv-endpoint"),
    ];
    for (args, flag) in cases {
        assert_bad_input(muster().args(*args), &format!("{args:?}"), flag, &marker);
    }
    assert_bad_input(muster().env("PET_RDZV_ENDPOINT", ":").arg(script), "PET_RDZV_ENDPOINT=:", "--rdzv-endpoint", &marker);
    assert_bad_input(muster().env("PET_LOG_DIR", under_a_file).arg(script), "PET_LOG_DIR", "--log-dir", &marker);
}

/// Arguments no user means (bytes that are not UTF-8, line breaks and control characters in values, stray
/// dashes): the same one line and exit 2 as any bad input (the lib's `cli::fuzz` covers many more in-process).
#[test]
fn junk_arguments_are_one_line_and_exit_2() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let script = dir.path().join("w.py");
    std::fs::write(&script, format!("open({:?}, 'a').write('x')\n", marker)).unwrap();
    let script = script.to_str().unwrap();
    let not_utf8 = OsStr::from_bytes(b"--nnodes=\xff\xfe");
    assert_bad_input(muster().arg(not_utf8).arg(script), "not UTF-8", "not valid UTF-8", &marker);
    assert_bad_input(muster().arg(script).arg(OsStr::from_bytes(b"\xc3")), "not UTF-8 script argument", "UTF-8", &marker);
    let cases: &[(&[&str], &str)] = &[
        (&["--nnodes", "1\n2", script], "--nnodes"),
        (&["--rdzv-conf", "join_timeout=\r\n5\u{1}", script], "--rdzv-conf"),
        (&["--nproc-per-node=\u{1}", script], "--nproc-per-node"),
        (&["--tee", "\t", script], "--tee"),
        (&["--\u{e9}", script], "unrecognized arguments"),
        (&["--log-dir"], "--log-dir"),
        (&["-", "x"], "'-'"),
        (&["--=", script], "ambiguous option: --= could match"),
    ];
    for (args, needle) in cases {
        assert_bad_input(muster().args(*args), &format!("{args:?}"), needle, &marker);
    }
}

/// Exit 2, one line on stderr naming `flag`, and no worker started.
fn assert_bad_input(cmd: &mut std::process::Command, what: &str, flag: &str, marker: &std::path::Path) {
    // No NVML library can be found: `gpu` must fail whatever this machine has.
    let out = run(cmd.env("MUSTER_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"), Duration::from_secs(30));
    let lines: Vec<&str> = out.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(out.status.code(), Some(2), "{what}: {}", out.stderr);
    assert_eq!(lines.len(), 1, "{what}: expected one line, got {lines:?}");
    assert!(lines[0].contains(flag), "{what}: {:?} does not name {flag}", lines[0]);
    assert!(!marker.exists(), "{what}: a worker was started");
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
