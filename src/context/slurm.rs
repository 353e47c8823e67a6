//! Slurm: `srun` runs one agent per node (or per task) of a job step and tells each where it stands.
//!
//! The GPUs Slurm allocated (`SLURM_STEP_GPUS`, `SLURM_JOB_GPUS`) are read where every GPU selection is made,
//! `gpu::topology::select`; this file reads the rest.

use super::{endpoint, first_var, hostlist, invalid, number, ContextError, Env, Fact, Kind, LaunchContext};

const K: Kind = Kind::Slurm;

pub(super) fn detect(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    let Some((job_var, job)) = first_var(env, &["SLURM_JOB_ID", "SLURM_JOBID"]) else { return Ok(None) };
    let mut c = LaunchContext::new(K);
    c.cpus = number(K, env, &["SLURM_CPUS_ON_NODE"], 1)?;
    // Outside a step (a batch script) this is one process on the allocation's first node: the job's node
    // count and list say nothing about the agents.
    let Some((step_var, step)) = first_var(env, &["SLURM_STEP_ID", "SLURM_STEPID"]) else { return Ok(Some(c)) };
    for (name, value) in [(job_var, &job), (step_var, &step)] {
        if value.contains(char::is_whitespace) {
            return Err(invalid(K, name, value, "must be a job or step id without spaces"));
        }
    }
    let nodes = number(K, env, &["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"], 1)?;
    let tasks = number(K, env, &["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"], 1)?;
    // One agent per task: with several tasks on a node (`--ntasks-per-node=2`), each is a node of its own
    // to the rendezvous, ranked by task.
    match (nodes, tasks) {
        (Some(n), Some(t)) if t.value > n.value => {
            c.nnodes = Some(t);
            c.node_rank = number(K, env, &["SLURM_PROCID"], 0)?;
        }
        (nodes, _) => {
            c.nnodes = nodes;
            c.node_rank = number(K, env, &["SLURM_NODEID"], 0)?;
        }
    }
    if let Some((list_var, list)) = first_var(env, &["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]) {
        let hosts = hostlist::expand(&list).map_err(|source| ContextError::Hostlist { context: K.name(), var: list_var.into(), source })?;
        c.endpoint = hosts.first().map(|h| Fact::new(endpoint(h, step_port(&format!("{job}.{step}"))), list_var));
    }
    c.run_id = Some(Fact::new(format!("{job}.{step}"), format!("{job_var}.{step_var}")));
    Ok(Some(c))
}

/// The step's own rendezvous port: two steps on one node at once (steps run side by side, array jobs) must
/// not share a store, as they would on torch's fixed 29400. From the step's id, so the same on every node;
/// in 20000..=29999, below Linux's ephemeral range.
fn step_port(step: &str) -> u16 {
    // FNV-1a: stable across builds and machines (std's hashers are not).
    let hash = step.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    20000 + (hash % 10000) as u16
}

#[cfg(test)]
mod tests {
    #[test]
    fn steps_get_ports_of_their_own() {
        let ports: Vec<u16> = ["812.3", "812.4", "813.3", "9.0"].iter().map(|s| super::step_port(s)).collect();
        assert!(ports.iter().all(|p| (20000..=29999).contains(p)), "{ports:?}");
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert_eq!(super::step_port("812.3"), super::step_port("812.3"));
    }
}
