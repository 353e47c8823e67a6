//! The worker environment contract, value for value as torchrun 2.15 sets it
//! (torch/distributed/elastic/agent/server/local_elastic_agent.py and api.py).
//!
//! Workers inherit the agent's whole environment but for [`WITHHELD`]; these variables are added on top and
//! override any value the agent had.

use std::path::Path;

/// The agent's own variables that never reach a worker: the job token and etcd's credentials (training code often logs its whole
/// environment, and a worker holding the token could act as an agent of the job; docs/security.md).
pub const WITHHELD: &[&str] =
    &[crate::config::token::TOKEN_ENV, crate::config::etcd::USER_ENV, crate::config::etcd::PASSWORD_ENV];

/// What one start of the worker group is: the rendezvous result and the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub role: String,
    pub local_world_size: u32,
    pub group_rank: u32,
    pub group_world_size: u32,
    /// Global rank of this node's local rank 0 (prefix sum of the nodes before it).
    pub base_global_rank: u32,
    pub world_size: u32,
    pub base_role_rank: u32,
    pub role_world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub restart_count: u32,
    pub max_restarts: u32,
    pub run_id: String,
    /// The rendezvous round these workers belong to, exported as `MUSTER_ROUND`: a fencing token (a
    /// checkpoint writer can refuse a round older than the newest it has seen).
    pub round: u64,
    pub use_agent_store: bool,
    pub virtual_local_rank: bool,
    /// `--signals-to-handle` as given; torchrun exports it as TORCHELASTIC_SIGNALS_TO_HANDLE.
    pub signals_to_handle: String,
    /// Set by muster on top of the contract for every worker (the planned CUDA_VISIBLE_DEVICES).
    pub extra_env: Vec<(String, String)>,
    /// Per local rank: where the worker runs (empty: no placement, inherit the agent's).
    pub placements: Vec<Placement>,
}

/// Where one worker runs: applied in the child before exec, so no numactl is needed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// CPU affinity.
    pub cpus: Option<Vec<u32>>,
    /// Preferred NUMA node for memory (`--numa-binding node`).
    pub mem_node: Option<u32>,
    /// This worker's own CUDA_VISIBLE_DEVICES (`--virtual-local-rank`), overriding the shared one.
    pub visible_devices: Option<String>,
}

impl GroupSpec {
    pub fn global_rank(&self, local_rank: u32) -> u32 {
        self.base_global_rank + local_rank
    }
}

/// The contract's variables whose values change from one start of the group to the next on the same node
/// (everything else a worker sees stays the same while its local rank and placement do).
pub const PER_START: &[&str] = &[
    "RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    ROUND_ENV,
    // Hang detection's, in the attempt directory.
    crate::hang::progress::FILE_VAR,
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
];

/// muster's own addition to the contract: the round (see [`GroupSpec::round`]).
pub const ROUND_ENV: &str = "MUSTER_ROUND";

/// The variables set for worker `local_rank`; `parent` looks up the agent's own environment.
pub fn worker_env(
    spec: &GroupSpec,
    local_rank: u32,
    error_file: Option<&Path>,
    parent: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
    let mut env = vec![
        ("LOCAL_RANK", if spec.virtual_local_rank { 0 } else { local_rank }.to_string()),
        ("RANK", spec.global_rank(local_rank).to_string()),
        ("GROUP_RANK", spec.group_rank.to_string()),
        ("ROLE_RANK", (spec.base_role_rank + local_rank).to_string()),
        ("ROLE_NAME", spec.role.clone()),
        ("LOCAL_WORLD_SIZE", spec.local_world_size.to_string()),
        ("WORLD_SIZE", spec.world_size.to_string()),
        ("GROUP_WORLD_SIZE", spec.group_world_size.to_string()),
        ("ROLE_WORLD_SIZE", spec.role_world_size.to_string()),
        ("MASTER_ADDR", spec.master_addr.clone()),
        ("MASTER_PORT", spec.master_port.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", spec.restart_count.to_string()),
        ("TORCHELASTIC_MAX_RESTARTS", spec.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", spec.run_id.clone()),
        ("TORCHELASTIC_USE_AGENT_STORE", py_bool(spec.use_agent_store)),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", parent("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|| "1".into())),
        ("TORCHELASTIC_ERROR_FILE", error_file.map(|p| p.display().to_string()).unwrap_or_default()),
        ("TORCHELASTIC_SIGNALS_TO_HANDLE", spec.signals_to_handle.clone()),
        (ROUND_ENV, spec.round.to_string()),
    ];
    if parent("OMP_NUM_THREADS").is_none() && spec.local_world_size > 1 {
        env.push(("OMP_NUM_THREADS", "1".into()));
    }
    env.extend(spec.extra_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let own = spec.placements.get(local_rank as usize).and_then(|p| p.visible_devices.clone());
    if let Some(own) = own {
        env.push(("CUDA_VISIBLE_DEVICES", own));
    } else if spec.virtual_local_rank {
        // torchrun: the parent's list entry for this rank (HIP_VISIBLE_DEVICES first when set), else the rank.
        let (source, also_hip) = match parent("HIP_VISIBLE_DEVICES") {
            Some(h) => (Some(h), true),
            None => (parent("CUDA_VISIBLE_DEVICES"), false),
        };
        let device = match source {
            Some(list) => list
                .split(',')
                .nth(local_rank as usize)
                .map(|d| d.trim().to_string())
                .ok_or_else(|| {
                    format!("--virtual-local-rank: local rank {local_rank} has no entry in the visible devices '{list}'")
                })?,
            None => local_rank.to_string(),
        };
        if also_hip {
            env.push(("HIP_VISIBLE_DEVICES", device.clone()));
        }
        env.push(("CUDA_VISIBLE_DEVICES", device));
    }
    Ok(env.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> GroupSpec {
        GroupSpec {
            role: "default".into(),
            local_world_size: 2,
            group_rank: 1,
            group_world_size: 2,
            base_global_rank: 2,
            world_size: 4,
            base_role_rank: 2,
            role_world_size: 4,
            master_addr: "node0".into(),
            master_port: 29500,
            restart_count: 1,
            max_restarts: 3,
            run_id: "job".into(),
            round: 7,
            use_agent_store: true,
            virtual_local_rank: false,
            signals_to_handle: "SIGTERM".into(),
            extra_env: Vec::new(),
            placements: Vec::new(),
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn contract_values() {
        let env = worker_env(&spec(), 1, Some(Path::new("/l/1/error.json")), &|_| None).unwrap();
        for (k, v) in [
            ("LOCAL_RANK", "1"),
            ("RANK", "3"),
            ("GROUP_RANK", "1"),
            ("ROLE_RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ("OMP_NUM_THREADS", "1"),
            ("TORCHELASTIC_ERROR_FILE", "/l/1/error.json"),
            ("MUSTER_ROUND", "7"),
        ] {
            assert_eq!(get(&env, k), Some(v), "{k}");
        }
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), None);
    }

    #[test]
    fn parent_values_win_where_torchrun_copies_them() {
        let parent = |k: &str| match k {
            "OMP_NUM_THREADS" => Some("8".to_string()),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING" => Some("3".to_string()),
            _ => None,
        };
        let env = worker_env(&spec(), 0, None, &parent).unwrap();
        assert_eq!(get(&env, "OMP_NUM_THREADS"), None, "inherited, not overridden");
        assert_eq!(get(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), Some("3"));
        assert_eq!(get(&env, "TORCHELASTIC_ERROR_FILE"), Some(""));
    }

    #[test]
    fn virtual_local_rank_picks_one_device() {
        let s = GroupSpec { virtual_local_rank: true, ..spec() };
        let parent = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "4, 6".to_string());
        let env = worker_env(&s, 1, None, &parent).unwrap();
        assert_eq!(get(&env, "LOCAL_RANK"), Some("0"));
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), Some("6"));
        assert_eq!(get(&worker_env(&s, 1, None, &|_| None).unwrap(), "CUDA_VISIBLE_DEVICES"), Some("1"));
        assert!(worker_env(&s, 2, None, &parent).is_err());
    }
}
