//! End to end: `examples/train.py`, a real DDP (gloo) training job, run under muster as a user would.

use crate::common;

use common::{example, muster, python, run, Output};
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `muster <launcher_args> examples/train.py --result R --ckpt-dir C <script_args>` in a fresh temp
/// dir, asserts it succeeded, and returns its output and the parsed result file.
fn train(launcher_args: &[&str], script_args: &[&str]) -> (Output, serde_json::Value) {
    python(); // fails loudly, not obscurely, when the torch venv is missing
    let dir = tempfile::tempdir().expect("tempdir");
    let result = dir.path().join("result.json");
    let ckpt = dir.path().join("ckpt");
    let out = run(
        muster()
            .arg("--standalone")
            .args(launcher_args)
            .arg(example("train.py"))
            .arg("--result")
            .arg(&result)
            .arg("--ckpt-dir")
            .arg(&ckpt)
            .args(script_args),
        TIMEOUT,
    );
    assert!(
        out.status.success(),
        "muster exited with {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let r = read_result(&result, &out);
    (out, r)
}

fn read_result(path: &Path, out: &Output) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("no result file {}: {e}\n--- stdout:\n{}\n--- stderr:\n{}", path.display(), out.stdout, out.stderr)
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("result file is not JSON ({e}): {text}"))
}

fn assert_finite_loss(r: &serde_json::Value) {
    let loss = r["final_loss"].as_f64().unwrap_or_else(|| panic!("final_loss is not a number: {r}"));
    assert!(loss.is_finite() && loss >= 0.0, "final_loss = {loss}: {r}");
}

#[test]
fn trains_to_completion() {
    let (out, r) = train(&["--nproc-per-node=2"], &[]);
    assert_eq!(r["steps"], 40, "{r}");
    assert_eq!(r["world_size"], 2, "{r}");
    assert_eq!(r["restart_count"], 0, "{r}");
    assert!(r["resumed_from"].is_null(), "a fresh run resumed: {r}");
    assert_finite_loss(&r);
    assert!(out.stdout.contains("done: steps=40 world_size=2 loss="), "stdout:\n{}", out.stdout);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(!all.contains("resumed from step"), "a fresh run resumed:\n{all}");
}

/// Four workers meet through muster's own worker store (TORCHELASTIC_USE_AGENT_STORE=True); after a crash the
/// restarted group initialises cleanly against the store the agent cleared.
#[test]
fn resumes_after_a_crash() {
    let (out, r) = train(
        &["--nproc-per-node=4", "--max-restarts=1"],
        &["--crash-at-step", "12", "--crash-rank", "1", "--ckpt-every", "5"],
    );
    let all = format!("--- stdout:\n{}\n--- stderr:\n{}", out.stdout, out.stderr);
    assert_eq!(r["use_agent_store"], "True", "{r}");
    assert_eq!(r["steps"], 40, "{r}\n{all}");
    assert_eq!(r["world_size"], 4, "{r}\n{all}");
    assert_eq!(r["restart_count"], 1, "the group was not restarted exactly once: {r}\n{all}");
    assert_eq!(r["resumed_from"], 10, "{r}\n{all}");
    assert_finite_loss(&r);
    assert!(all.contains("injected crash at step 12"), "the crash was not injected:\n{all}");
    assert!(all.contains("resumed from step 10"), "no resume message:\n{all}");
    assert!(out.stdout.contains("done: steps=40 world_size=4 loss="), "{all}");
}
