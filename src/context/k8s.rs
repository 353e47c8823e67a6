//! Kubernetes: Kubeflow's PyTorchJob, Volcano Jobs, and Indexed Jobs (JobSet's Jobs are Indexed Jobs).

use super::{endpoint, first_var, hostlist, invalid, number, var, ContextError, Env, Fact, Kind, LaunchContext};

/// `MASTER_ADDR:MASTER_PORT` as the operator (or Volcano's pytorch plugin) sets them.
fn master(kind: Kind, env: Env) -> Result<Option<Fact<String>>, ContextError> {
    let (Some(addr), Some(port)) = (var(env, "MASTER_ADDR"), var(env, "MASTER_PORT")) else { return Ok(None) };
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(|| {
        invalid(kind, "MASTER_PORT", &port, "must be a port number in 1..=65535")
    })?;
    Ok(Some(Fact::new(endpoint(addr.trim_start_matches('[').trim_end_matches(']'), port), "MASTER_ADDR:MASTER_PORT")))
}

/// PyTorchJob (training-operator v1): `PET_NNODES` (N, or MIN:MAX with an elastic policy), `PET_NODE_RANK`,
/// `PET_NPROC_PER_NODE`, `MASTER_ADDR`/`MASTER_PORT` of the master replica's service, and `RANK`, the replica's
/// rank (its `WORLD_SIZE` counts processes, not nodes). The mark: `MASTER_ADDR`/`MASTER_PORT` with a `PET_*`.
pub(super) fn pytorch_job(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    const K: Kind = Kind::PyTorchJob;
    let marked = ["PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE"].iter().any(|v| var(env, v).is_some());
    let Some(master) = master(K, env)?.filter(|_| marked) else { return Ok(None) };
    let mut c = LaunchContext::new(K);
    c.endpoint = Some(master);
    // MIN:MAX is clap's to read (`--nnodes`); a plain count is the context's too.
    c.nnodes = match var(env, "PET_NNODES") {
        Some(n) if !n.contains(':') => number(K, env, &["PET_NNODES"], 1)?,
        _ => None,
    };
    c.node_rank = number(K, env, &["PET_NODE_RANK", "RANK"], 0)?;
    Ok(Some(c))
}

/// Volcano: the env plugin's `VC_TASK_INDEX` (= `VK_TASK_INDEX`, the pod's index in its task) marks it. With
/// the pytorch plugin, `MASTER_ADDR`/`MASTER_PORT`, `WORLD_SIZE` (pods) and `RANK` (global over the tasks)
/// say everything. Else the svc plugin's `VC_<TASK>_HOSTS`/`VC_<TASK>_NUM` of this pod's own task (the one
/// whose host list holds `HOSTNAME`) give the agents: those of this task.
pub(super) fn volcano(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    const K: Kind = Kind::Volcano;
    let Some(index) = number(K, env, &["VC_TASK_INDEX", "VK_TASK_INDEX"], 0)? else { return Ok(None) };
    let mut c = LaunchContext::new(K);
    if let (Some(master), Some(_)) = (master(K, env)?, var(env, "RANK")) {
        c.endpoint = Some(master);
        c.nnodes = number(K, env, &["WORLD_SIZE"], 1)?;
        c.node_rank = number(K, env, &["RANK"], 0)?;
        return Ok(Some(c));
    }
    c.node_rank = Some(index);
    if let Some((hosts_var, first, num_var)) = own_task(env)? {
        c.endpoint = Some(Fact::new(endpoint(&first, super::C10D_PORT), hosts_var));
        c.nnodes = number(K, env, &[&num_var], 1)?;
    }
    Ok(Some(c))
}

/// This pod's task as the svc plugin exports it: (`VC_<TASK>_HOSTS`, its first host, `VC_<TASK>_NUM`). Pods
/// are named `<job>-<task>-<index>` and job names may hold dashes too, so each dash of the name is tried as
/// the start of the task, with the plugin's upper-cased name and with `_` for `-`.
fn own_task(env: Env) -> Result<Option<(String, String, String)>, ContextError> {
    let Some(pod) = var(env, "HOSTNAME") else { return Ok(None) };
    let Some((stem, _index)) = pod.rsplit_once('-') else { return Ok(None) };
    let starts = stem.match_indices('-').map(|(i, _)| i + 1);
    for task in starts.map(|i| &stem[i..]) {
        for key in [task.to_uppercase(), task.to_uppercase().replace('-', "_")] {
            let hosts_var = format!("VC_{key}_HOSTS");
            let Some(list) = var(env, &hosts_var) else { continue };
            let hosts = hostlist::expand(&list)
                .map_err(|source| ContextError::Hostlist { context: Kind::Volcano.name(), var: hosts_var.clone(), source })?;
            if hosts.iter().any(|h| h.split('.').next() == Some(pod.as_str())) {
                return Ok(hosts.first().map(|h| (hosts_var, h.clone(), format!("VC_{key}_NUM"))));
            }
        }
    }
    Ok(None)
}

/// An Indexed Job's pod: `JOB_COMPLETION_INDEX`. In a JobSet every replica of a replicated job repeats the
/// indexes (`JOB_INDEX` says which replica), so only the first replica's are ranks.
pub(super) fn indexed_job(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    const K: Kind = Kind::IndexedJob;
    let Some(index) = number(K, env, &["JOB_COMPLETION_INDEX"], 0)? else { return Ok(None) };
    let mut c = LaunchContext::new(K);
    let replica = first_var(env, &["JOB_INDEX"]);
    if replica.as_ref().is_none_or(|(_, r)| r == "0") {
        c.node_rank = Some(index);
    }
    Ok(Some(c))
}
