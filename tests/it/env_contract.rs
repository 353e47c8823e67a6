//! The worker environment is torchrun's, value for value: the same script runs under torchrun 2.15 and
//! under muster and every variable is compared; so are the script's arguments for command lines that
//! argparse reads in its own way (repeated options, `--` around the script).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;

type Env = BTreeMap<String, String>;

fn dump(cmd: &mut std::process::Command, dir: &Path, nproc: u32) -> Vec<Env> {
    let out = run(
        cmd.arg("--standalone").arg(format!("--nproc-per-node={nproc}")).arg(fixture("dump_env.py")).arg(dir),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "launcher failed: {}", out.stderr);
    (0..nproc)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("{r}.json"))).expect("worker env dump");
            serde_json::from_str(&text).expect("json")
        })
        .collect()
}

/// Variables that must differ between two launches, and why.
const DIFFERENT_BY_NATURE: &[&str] = &[
    "MASTER_PORT",             // a fresh free port per job
    "TORCHELASTIC_RUN_ID",     // a fresh uuid4 per standalone job
    "TORCHELASTIC_ERROR_FILE", // under a fresh temp log directory (its shape is checked below)
    "DUMP_DIR",                // where dump_argv.py writes, one directory per launch
];

/// muster's own additions to the contract (docs/command-line.md), which torchrun does not set.
const MUSTER_ONLY: &[&str] = &["MUSTER_ROUND", "MUSTER_INPLACE_SOCKET", "MUSTER_INPLACE_TIMEOUT"];

fn assert_same_env(what: &str, rank: usize, theirs: &Env, ours: &Env) {
    for k in MUSTER_ONLY {
        assert!(theirs.get(*k).is_none(), "{what}: rank {rank}: torchrun set {k}");
    }
    let round = ours.get("MUSTER_ROUND").and_then(|v| v.parse::<u64>().ok());
    assert!(round.is_some(), "{what}: rank {rank}: muster did not set MUSTER_ROUND to a round number: {:?}", ours.get("MUSTER_ROUND"));
    assert!(ours.get("MUSTER_INPLACE_SOCKET").is_some_and(|s| s.starts_with("@muster-inplace-")), "{what}: rank {rank}: {ours:?}");
    // PYTHONPATH: the agent's own, then the in-place API's directory.
    let path = ours.get("PYTHONPATH").map(String::as_str).unwrap_or_default();
    let theirs_path = theirs.get("PYTHONPATH").map(|p| format!("{p}:")).unwrap_or_default();
    let dir = path.strip_prefix(&theirs_path).unwrap_or_default();
    assert!(!dir.contains(':') && dir.contains("muster-inplace-"), "{what}: rank {rank}: PYTHONPATH {path:?}");
    let keys: std::collections::BTreeSet<&String> = theirs
        .keys()
        .chain(ours.keys())
        .filter(|k| !MUSTER_ONLY.contains(&k.as_str()) && k.as_str() != "PYTHONPATH")
        .collect();
    for k in keys {
        if !DIFFERENT_BY_NATURE.contains(&k.as_str()) {
            assert_eq!(theirs.get(k), ours.get(k), "{what}: rank {rank}: {k} differs (torchrun vs muster)");
        }
    }
}

#[test]
fn worker_env_matches_torchrun() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let theirs = dump(&mut torchrun(), a.path(), 3);
    let ours = dump(&mut muster(), b.path(), 3);
    for (rank, (t, m)) in theirs.iter().zip(&ours).enumerate() {
        assert_same_env("plain", rank, t, m);
        for env in [t, m] {
            assert!(
                env["TORCHELASTIC_ERROR_FILE"].ends_with(&format!("/attempt_0/{rank}/error.json")),
                "{}",
                env["TORCHELASTIC_ERROR_FILE"]
            );
            assert_eq!(env["TORCHELASTIC_RUN_ID"].len(), 36, "a uuid4 run id");
        }
        for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT"] {
            assert!(m.contains_key(k), "rank {rank}: muster did not set {k}");
        }
        assert_eq!(m["RANK"], rank.to_string());
        assert_eq!(m["WORLD_SIZE"], "3");
        assert_eq!(m["TORCHELASTIC_USE_AGENT_STORE"], "True", "workers use the agent's store");
    }
    assert_eq!(ours[0]["MASTER_PORT"], ours[2]["MASTER_PORT"]);
}

#[derive(Debug, serde::Deserialize)]
struct Dump {
    argv: Vec<String>,
    env: Env,
}

/// Runs `args` (with `SCRIPT` standing for dump_argv.py, `PROG` for an executable wrapper around it) from
/// the fixtures directory, so `-m dump_argv` imports it; returns what each worker saw.
fn dump_argv(mut cmd: std::process::Command, args: &[&str], wrapper: &Path) -> Vec<Dump> {
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("dump_argv.py");
    let args = args.iter().map(|a| match *a {
        "SCRIPT" => script.as_os_str(),
        "PROG" => wrapper.as_os_str(),
        a => std::ffi::OsStr::new(a),
    });
    let out = run(
        cmd.args(args).env("DUMP_DIR", dir.path()).current_dir(fixture("")),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "launcher failed: {}", out.stderr);
    let mut dumps = Vec::new();
    for r in 0.. {
        let Ok(text) = std::fs::read_to_string(dir.path().join(format!("{r}.json"))) else { break };
        dumps.push(serde_json::from_str(&text).expect("json"));
    }
    dumps
}

#[test]
fn script_arguments_and_repeated_options_match_torchrun() {
    let bin = tempfile::tempdir().unwrap();
    let wrapper = bin.path().join("dump-argv");
    let python = python();
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {} {} \"$@\"\n", python.display(), fixture("dump_argv.py").display()))
        .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cases: &[&[&str]] = &[
        &[
            "--standalone", "--standalone", "--nproc-per-node", "3", "--nproc_per_node=2", "--max-restarts", "1",
            "--max_restarts=2", "--role", "a", "--role=b", "--signals-to-handle", "SIGTERM",
            "--signals_to_handle=SIGINT,SIGTERM", "SCRIPT", "--role", "c",
        ],
        &["--standalone", "SCRIPT", "--", "a"],
        &["--standalone", "SCRIPT", "a", "--", "b"],
        &["--standalone", "SCRIPT", "--", "--", "a"],
        &["--standalone", "--", "SCRIPT", "--", "a"],
        &["--standalone", "-m", "dump_argv", "--", "--depth=24"],
        &["--standalone", "-m", "dump_argv", "--", "--", "x"],
        &["--standalone", "--no-python", "PROG", "--", "x"],
        &["--standalone", "--no-python", "PROG", "a", "--", "x"],
    ];
    for args in cases {
        let what = format!("{args:?}");
        let theirs = dump_argv(torchrun(), args, &wrapper);
        let ours = dump_argv(muster(), args, &wrapper);
        assert!(!theirs.is_empty(), "{what}: torchrun started no worker");
        assert_eq!(theirs.len(), ours.len(), "{what}: worker count");
        for (rank, (t, m)) in theirs.iter().zip(&ours).enumerate() {
            assert_eq!(t.argv, m.argv, "{what}: rank {rank}: the script's arguments differ (torchrun vs muster)");
            assert_same_env(&what, rank, &t.env, &m.env);
        }
    }
}

/// The job token is the agent's alone: the agent reads it (an empty one is refused before anything starts),
/// and its workers, whose training code may log the whole environment, never see it.
#[test]
fn workers_do_not_inherit_the_job_token() {
    const TOKEN: &str = "token-for-the-agents-only";
    let dir = tempfile::tempdir().unwrap();
    let workers = dump(muster().env("MUSTER_RDZV_TOKEN", TOKEN), dir.path(), 2);
    for (rank, env) in workers.iter().enumerate() {
        assert_eq!(env.get("MUSTER_RDZV_TOKEN"), None, "rank {rank} inherited the job token");
        assert!(env.values().all(|v| !v.contains(TOKEN)), "rank {rank} sees the token in its environment");
        assert_eq!(env["RANK"], rank.to_string());
    }
    let out = run(
        muster().env("MUSTER_RDZV_TOKEN", " ").arg("--standalone").arg(fixture("dump_env.py")).arg(dir.path()),
        Duration::from_secs(60),
    );
    assert_eq!(out.status.code(), Some(2), "an empty token is bad input: {}", out.stderr);
    assert!(out.stderr.contains("MUSTER_RDZV_TOKEN") && out.stderr.contains("empty"), "{}", out.stderr);
}
