//! Where the agent's time goes: `muster_productive_seconds_total`, `muster_lost_seconds_total{phase}`, the
//! `muster.agent.goodput` events and the last line. The phases tile the agent's wall time, and a scrape
//! says what the events say.

use crate::common;

use std::path::Path;
use std::time::Instant;

use serde_json::Value;

use common::cluster::{Agent, AgentArgs, LONG};
use common::*;

const LOST: [&str; 7] = ["rendezvous", "spawn", "warmup", "reform", "detect", "stop", "finish"];

fn goodput_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|e| e["name"] == "muster.agent.goodput")
        .collect()
}

fn seconds(event: &Value, phase: &str) -> f64 {
    event["lost"][format!("{phase}_s")].as_f64().unwrap_or_else(|| panic!("no {phase}_s in {event}"))
}

/// The value of the series of `name` whose labels contain `label` (a whole `key="value"`, or "").
fn scraped(text: &str, name: &str, label: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .unwrap_or_else(|| panic!("no {name} {label} in:\n{text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("not a number: {line}"))
}

/// Two workers that take 1 s to warm up and then make progress, one crash and a restart, then the end.
#[test]
fn the_phases_add_up_to_the_wall_time_and_a_scrape_matches_the_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let started = Instant::now();
    let args: Vec<String> = [
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "--hang-timeout=600",
        "--metrics-port=0",
        &format!("--event-log={}", events.display()),
        &fixture("goodput_worker.py").display().to_string(),
        &dir.path().display().to_string(),
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent = Agent::start("a", &args);
    assert!(eventually(LONG, || goodput_events(&events).len() == 1), "the workers never ran:\n{}", agent.log());
    // Past the warm-up: the crash then ends a run that trained.
    let warm = || std::fs::read_dir(dir.path()).map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("warm-")).count()).unwrap_or(0);
    assert!(eventually(LONG, || warm() == 2), "the workers never warmed up:\n{}", agent.log());
    std::fs::write(dir.path().join("crash"), "").expect("write crash");
    assert!(eventually(LONG, || goodput_events(&events).len() == 2), "the workers never ran again:\n{}", agent.log());

    // The workers run: nothing changes the totals until the next transition.
    let after_restart = goodput_events(&events)[1].clone();
    let (status, text) = http_get(&metrics_addr(&agent), "/metrics").expect("a scrape");
    assert_eq!(status, 200);
    let productive = after_restart["productive_s"].as_f64().expect("productive_s");
    assert!((scraped(&text, "muster_productive_seconds_total", "") - productive).abs() < 1e-6, "{after_restart}\n{text}");
    for phase in LOST {
        let metric = scraped(&text, "muster_lost_seconds_total", &format!("phase=\"{phase}\""));
        assert!((metric - seconds(&after_restart, phase)).abs() < 1e-6, "{phase}: {metric} vs {after_restart}");
    }
    assert!(seconds(&after_restart, "warmup") >= 0.9, "a 1 s warm-up: {after_restart}");
    assert!(productive > 0.0 && seconds(&after_restart, "stop") > 0.0, "{after_restart}");

    std::fs::write(dir.path().join("finish"), "").expect("write finish");
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
    let lifetime = started.elapsed().as_secs_f64();
    let last = goodput_events(&events).pop().expect("a final goodput event");
    assert_eq!(last["final"], true, "{last}");
    let wall = last["wall_s"].as_f64().expect("wall_s");
    let sum: f64 = LOST.iter().map(|p| seconds(&last, p)).sum::<f64>() + last["productive_s"].as_f64().unwrap_or(-1.0);
    assert!((sum - wall).abs() <= wall * 0.01, "the phases ({sum} s) add up to the wall time ({wall} s): {last}");
    assert!(wall <= lifetime, "the agent's wall time ({wall} s) is within its process's life ({lifetime} s)");
    let ratio = last["goodput"].as_f64().expect("goodput");
    assert!((ratio - last["productive_s"].as_f64().unwrap_or(0.0) / sum).abs() < 0.01, "{last}");
    assert!(agent.log().lines().any(|l| l.contains("goodput ") && l.contains("% of ")), "{}", agent.log());
}

/// `goodput X% of W s: training T s; lost rendezvous R s, …` → (W, T, R).
fn goodput_line(line: &str) -> (f64, f64, f64) {
    let number = |after: &str| -> f64 {
        let rest = line.split(after).nth(1).unwrap_or_else(|| panic!("no {after:?} in {line}"));
        rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no number after {after:?}: {line}"))
    };
    (number("% of "), number("training "), number("lost rendezvous "))
}

/// An agent stopped while it waits for an etcd that is not there never started a worker: its account still
/// begins with it, and all of the wait is lost to the rendezvous.
#[test]
fn an_agent_stopped_waiting_for_its_store_lost_the_wait_to_the_rendezvous() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Takes connections, never answers (etcd hung): waited for. (Where nothing listens the agent ends at once.)
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let args = AgentArgs::rdzv("etcd", 1, format!("127.0.0.1:{port}")).script(fixture("elastic_worker.py")).arg(dir.path()).build();
    let mut agent = Agent::start("a", &args);
    // Said after 3 s of failed attempts (OUTAGE_AFTER in src/store/etcd/cluster.rs): the agent has waited that long.
    let waiting = eventually(LONG, || agent.log().contains("etcd does not answer: "));
    assert!(waiting, "the agent never said it waits for etcd:\n{}", agent.log());
    // SAFETY: plain kill(2) of a process this test started.
    assert_eq!(unsafe { libc::kill(agent.guard.pid(), libc::SIGTERM) }, 0);
    agent.exit_code(LONG);
    let log = agent.log();
    let last = log.lines().rfind(|l| l.contains("goodput ") && l.contains("% of "));
    let (wall, training, rendezvous) = goodput_line(last.unwrap_or_else(|| panic!("no goodput line:\n{log}")));
    assert!(wall >= 3.0, "the 3 s and more of waiting are in the account: {log}");
    assert_eq!(training, 0.0, "{log}");
    assert!((rendezvous - wall).abs() <= 0.1, "all of the wait is lost to the rendezvous: {log}");
    assert!(!dir.path().join("starts").exists(), "no worker may start");
    drop(silent);
}
