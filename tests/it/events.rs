//! Every way the agent ends emits exactly one final transition event (`--event-log-handler console`), and it
//! is the last one: success, restarts spent, a signal, a drained node, an error while joining, and an error
//! while setting up (a rendezvous port held by a program that is not a TCPStore, which is also named at once).

use crate::common;

use std::net::TcpListener;
use std::time::Duration;

use common::cluster::LONG;
use common::gpus::FakeNode;
use common::*;

const FINAL: [&str; 4] = ["succeeded", "failed", "interrupted", "drained"];

/// The `to` of every transition event in `stderr`, in order.
fn transitions(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["name"] == "muster.agent.transition")
        .map(|e| e["to"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn assert_one_final(stderr: &str, expected: &str) {
    let to = transitions(stderr);
    let finals: Vec<&String> = to.iter().filter(|t| FINAL.contains(&t.as_str())).collect();
    assert_eq!(finals, [expected], "exactly one final transition, to {expected}: {to:?}\n{stderr}");
    assert_eq!(to.last().map(String::as_str), Some(expected), "the final transition is the last: {to:?}");
}

fn agent(args: &[&str]) -> std::process::Command {
    let mut cmd = muster();
    cmd.arg("--event-log-handler=console").args(args);
    cmd
}

#[test]
fn success_failure_and_a_drain_each_end_with_one_final_event() {
    let ok = run(&mut agent(&["--nproc-per-node=2", "--no-python", "true"]), LONG);
    assert_eq!(ok.status.code(), Some(0), "{}", ok.stderr);
    assert_one_final(&ok.stderr, "succeeded");

    let failed = run(&mut agent(&["--max-restarts=1", "--no-python", "false"]), LONG);
    assert_eq!(failed.status.code(), Some(1), "{}", failed.stderr);
    assert_one_final(&failed.stderr, "failed");
    assert!(transitions(&failed.stderr).contains(&"restarting".to_string()), "{}", failed.stderr);

    let dir = tempfile::tempdir().expect("tempdir");
    let gpus = FakeNode::new(dir.path(), "a", 1, &[]);
    // The driver asks for a node reboot (read by the watcher's first counter read): the node drains.
    gpus.write("recovery 0 2");
    let drained = run(agent(&["--no-python", "sleep", "1000"]).envs(gpus.env()), LONG);
    assert_eq!(drained.status.code(), Some(75), "{}", drained.stderr);
    assert_one_final(&drained.stderr, "drained");
}

#[test]
fn a_signal_ends_with_one_final_event() {
    let mut cmd = agent(&["--no-python", "sleep", "1000"]);
    cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    let mut g = Guard::spawn(&mut cmd);
    let mut stderr = g.0.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let started = eventually(LONG, || {
        std::fs::read_dir("/proc").map(|d| d.flatten().any(|p| is_sleep_child(&p.path(), g.pid()))).unwrap_or(false)
    });
    assert!(started, "the worker never started");
    // SAFETY: plain kill(2) on the agent this test started.
    unsafe { libc::kill(g.pid(), libc::SIGTERM) };
    let status = g.wait_timeout(LONG).expect("the agent exits");
    let stderr = reader.join().unwrap_or_default();
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert_one_final(&stderr, "interrupted");
}

/// Whether `/proc/<pid>` is a `sleep` whose parent is `agent`.
fn is_sleep_child(proc_dir: &std::path::Path, agent: i32) -> bool {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
    let ppid: i32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    ppid == agent && stat.contains("(sleep)")
}

#[test]
fn an_error_while_joining_ends_with_one_final_event() {
    let out = run(
        &mut agent(&[
            "--nnodes=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0",
            "--rdzv-conf=is_host=1,join_timeout=1",
            "--no-python",
            "true",
        ]),
        LONG,
    );
    assert_eq!(out.status.code(), Some(3), "the rendezvous did not complete: {}", out.stderr);
    assert!(out.stderr.contains("timed out"), "{}", out.stderr);
    assert_one_final(&out.stderr, "failed");
}

#[test]
fn a_port_held_by_another_program_is_named_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // A program that accepts and hangs up, as a web server or another service would on a wrong port.
    std::thread::spawn(move || {
        for conn in listener.incoming().take(16) {
            drop(conn);
        }
    });
    let endpoint = format!("--rdzv-endpoint=127.0.0.1:{port}");
    let out = run(
        &mut agent(&["--nnodes=2", "--rdzv-backend=c10d", &endpoint, "--rdzv-conf=is_host=0", "--no-python", "true"]),
        Duration::from_secs(60),
    );
    let last = out.stderr.lines().last().unwrap_or_default();
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(last.contains(&format!("127.0.0.1:{port}")) && last.contains("--rdzv-endpoint"), "{last}");
    assert!(last.contains("does not speak"), "{last}");
    assert_one_final(&out.stderr, "failed");
}
