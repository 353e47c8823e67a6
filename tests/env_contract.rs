//! The worker environment is torchrun's, value for value: the same script runs under torchrun 2.15 and
//! under muster and every variable is compared.

mod common;

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
];

#[test]
fn worker_env_matches_torchrun() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let theirs = dump(&mut torchrun(), a.path(), 3);
    let ours = dump(&mut muster(), b.path(), 3);
    for (rank, (t, m)) in theirs.iter().zip(&ours).enumerate() {
        let keys: std::collections::BTreeSet<&String> = t.keys().chain(m.keys()).collect();
        for k in keys {
            if DIFFERENT_BY_NATURE.contains(&k.as_str()) {
                continue;
            }
            assert_eq!(t.get(k), m.get(k), "rank {rank}: {k} differs (torchrun vs muster)");
        }
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
