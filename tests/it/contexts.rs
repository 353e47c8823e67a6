//! Launch contexts end to end: two real agents started as a Kubernetes operator starts them, with no
//! rendezvous flags, form one group whose GROUP_RANK is the scheduler's node rank (not the join order).

use crate::common;

use std::time::Duration;

use common::cluster::*;
use common::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts node rank 1 first (it hosts the store at MASTER_ADDR:MASTER_PORT and joins first), then node
/// rank 0; checks the workers' ranks, the banner's account of the context, and a clean exit.
fn two_agents_rank_as_the_scheduler_says(
    flags: &[&str],
    env: impl Fn(u32) -> Vec<(&'static str, String)>,
    banner: impl Fn(u32) -> String,
) {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    args.extend(["--shutdown-timeout=5".into(), fixture("elastic_worker.py").display().to_string()]);
    args.push(dir.path().display().to_string());
    let mut first = Agent::start_with_env("first", &args, &env(1));
    first.hosted_port();
    let mut second = Agent::start_with_env("second", &args, &env(0));
    let world = wait_world(dir.path(), 4, 4);
    for s in &world {
        assert_eq!(s.group_rank, if s.node == "first" { 1 } else { 0 }, "GROUP_RANK is the scheduler's: {world:?}");
        assert_eq!(s.rank, s.group_rank * 2 + s.local_rank, "{s:?}");
        assert_eq!(s.world_size, 4);
    }
    std::fs::write(dir.path().join("finish"), "").unwrap();
    for (agent, rank) in [(&mut first, 1), (&mut second, 0)] {
        assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
        let want = banner(rank);
        assert!(agent.log().lines().any(|l| l.ends_with(&want)), "no '{want}' in:\n{}", agent.log());
    }
}

#[test]
fn pytorchjob_env_forms_the_group_with_the_operators_node_ranks() {
    let port = free_port();
    two_agents_rank_as_the_scheduler_says(
        &[],
        |rank| {
            vec![
                ("PET_NNODES", "2".into()),
                ("PET_NPROC_PER_NODE", "2".into()),
                ("PET_NODE_RANK", rank.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.to_string()),
                ("WORLD_SIZE", "4".into()),
                ("RANK", rank.to_string()),
            ]
        },
        |rank| {
            format!(
                "launch context pytorchjob: nnodes=2 (PET_NNODES) node_rank={rank} (PET_NODE_RANK) rdzv_backend=c10d \
                 (MASTER_ADDR:MASTER_PORT) rdzv_endpoint=127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT)"
            )
        },
    );
}

#[test]
fn volcano_env_forms_the_group_with_the_task_ranks() {
    let port = free_port();
    two_agents_rank_as_the_scheduler_says(
        &["--nproc-per-node=2"],
        |rank| {
            vec![
                ("VC_TASK_INDEX", rank.to_string()),
                ("VK_TASK_INDEX", rank.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.to_string()),
                ("WORLD_SIZE", "2".into()),
                ("RANK", rank.to_string()),
            ]
        },
        |rank| {
            format!(
                "launch context volcano: nnodes=2 (WORLD_SIZE) node_rank={rank} (RANK) rdzv_backend=c10d \
                 (MASTER_ADDR:MASTER_PORT) rdzv_endpoint=127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT)"
            )
        },
    );
}

#[test]
fn an_unusable_scheduler_variable_is_one_line_and_exit_2() {
    let out = run(
        muster().env("SLURM_JOB_ID", "7").env("SLURM_STEP_ID", "0").env("SLURM_JOB_NODELIST", "n[2-1]").arg("x.py"),
        Duration::from_secs(30),
    );
    let err = &out.stderr;
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.trim().starts_with("muster: error: SLURM_JOB_NODELIST (from the slurm launch context)"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
