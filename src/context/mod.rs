//! Launch contexts: what the scheduler that started this agent already says about the job — how many agents,
//! this one's rank among them, where they meet, the job's id, the CPUs it got — read from the environment.
//!
//! [`detect`] is a pure function of an environment lookup; the first context found wins, in this order:
//! Slurm (`slurm.rs`), Kubeflow's PyTorchJob, Volcano, an Indexed Job or JobSet (`k8s.rs`), OpenMPI or PMIx
//! (`mpi.rs`). With none of their variables set it finds nothing and the launch is exactly as without this
//! module. [`fill`] applies a context to the command line: a flag (or a `PET_*` variable clap read) always wins.
//! `docs/contexts.md` lists every variable and the precedence.

use std::fmt;

mod fill;
pub mod hostlist;
mod k8s;
mod mpi;
mod slurm;

pub use fill::{fill, Filled, Used};

/// An environment lookup (`Host::env` in `config`).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The port of a rendezvous endpoint a context names without one: torchrun's c10d default.
pub const C10D_PORT: u16 = 29400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Slurm,
    PyTorchJob,
    Volcano,
    IndexedJob,
    Mpi,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Slurm => "slurm",
            Kind::PyTorchJob => "pytorchjob",
            Kind::Volcano => "volcano",
            Kind::IndexedJob => "indexed-job",
            Kind::Mpi => "mpi",
        }
    }
}

/// One value and the variable(s) it came from (`SLURM_NNODES`, `MASTER_ADDR:MASTER_PORT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact<T> {
    pub value: T,
    pub from: String,
}

impl<T> Fact<T> {
    fn new(value: T, from: impl Into<String>) -> Fact<T> {
        Fact { value, from: from.into() }
    }
}

/// What one context says; each value is None when the context does not say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchContext {
    pub kind: Kind,
    /// Agents in the job (one per node, or one per task where a node runs several).
    pub nnodes: Option<Fact<u32>>,
    /// This agent's rank among them as the scheduler numbers it: the preferred, stable group rank.
    pub node_rank: Option<Fact<u32>>,
    /// The c10d rendezvous endpoint, `host:port`.
    pub endpoint: Option<Fact<String>>,
    /// The run id shared by the job's agents.
    pub run_id: Option<Fact<String>>,
    /// CPUs allocated on this node, for `--nproc-per-node cpu|auto`.
    pub cpus: Option<Fact<u32>>,
}

impl LaunchContext {
    fn new(kind: Kind) -> LaunchContext {
        LaunchContext { kind, nnodes: None, node_rank: None, endpoint: None, run_id: None, cpus: None }
    }
}

impl fmt::Display for LaunchContext {
    /// `slurm: nnodes=2 (SLURM_NNODES) node_rank=1 (SLURM_NODEID) ...`: everything the context says.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind.name())?;
        let facts = [
            ("nnodes", self.nnodes.as_ref().map(|x| (x.value.to_string(), &x.from))),
            ("node_rank", self.node_rank.as_ref().map(|x| (x.value.to_string(), &x.from))),
            ("rdzv_endpoint", self.endpoint.as_ref().map(|x| (x.value.clone(), &x.from))),
            ("rdzv_id", self.run_id.as_ref().map(|x| (x.value.clone(), &x.from))),
            ("cpus", self.cpus.as_ref().map(|x| (x.value.to_string(), &x.from))),
        ];
        let mut any = false;
        for (key, fact) in facts {
            if let Some((value, from)) = fact {
                write!(f, " {key}={value} ({from})")?;
                any = true;
            }
        }
        if !any {
            write!(f, " nothing usable")?;
        }
        Ok(())
    }
}

/// A scheduler variable that is set but unusable: bad input, like a bad flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    #[error("{var}='{value}' (from the {context} launch context): {want}; fix the job's environment or give the value as a flag")]
    Invalid { context: &'static str, var: String, value: String, want: String },
    #[error("{var} (from the {context} launch context): {source}")]
    Hostlist { context: &'static str, var: String, source: hostlist::HostlistError },
}

/// One scheduler's reading of the environment.
type Probe = fn(Env) -> Result<Option<LaunchContext>, ContextError>;

/// The launch context this agent runs in, if any.
pub fn detect(env: Env) -> Result<Option<LaunchContext>, ContextError> {
    let probes: [Probe; 5] = [slurm::detect, k8s::pytorch_job, k8s::volcano, k8s::indexed_job, mpi::detect];
    for probe in probes {
        if let Some(context) = probe(env)? {
            return Ok(Some(context));
        }
    }
    Ok(None)
}

/// A variable's value, trimmed; unset and empty are the same (schedulers export empty values for "none").
fn var(env: Env, name: &str) -> Option<String> {
    env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// The first of `names` that is set, with its name.
fn first_var<'n>(env: Env, names: &[&'n str]) -> Option<(&'n str, String)> {
    names.iter().find_map(|n| var(env, n).map(|v| (*n, v)))
}

/// The first of `names` that is set, as a number (`min` or more).
fn number(kind: Kind, env: Env, names: &[&str], min: u32) -> Result<Option<Fact<u32>>, ContextError> {
    let Some((name, value)) = first_var(env, names) else { return Ok(None) };
    match value.parse::<u32>() {
        Ok(n) if n >= min => Ok(Some(Fact::new(n, name))),
        _ => Err(invalid(kind, name, &value, format!("must be an integer >= {min}"))),
    }
}

fn invalid(kind: Kind, var: &str, value: &str, want: impl Into<String>) -> ContextError {
    ContextError::Invalid { context: kind.name(), var: var.to_string(), value: value.to_string(), want: want.into() }
}

/// `host:port` with an IPv6 address bracketed, as `--rdzv-endpoint` takes it.
fn endpoint(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
pub(crate) fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detected(vars: &[(&str, &str)]) -> Option<LaunchContext> {
        detect(&env_of(vars)).unwrap()
    }

    #[test]
    fn a_plain_machine_has_no_context() {
        assert_eq!(detected(&[]), None);
        // Variables that only mean something inside a context are not a context by themselves.
        assert_eq!(detected(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]), None);
        assert_eq!(detected(&[("PET_NNODES", "2")]), None);
    }

    /// (environment, context: nnodes, node rank, endpoint, run id, cpus — each "value (var)" or "-")
    #[test]
    fn each_context_as_a_table() {
        type Row<'a> = (&'a [(&'a str, &'a str)], &'a str);
        let rows: &[Row] = &[
            (
                &[
                    ("SLURM_JOB_ID", "812"),
                    ("SLURM_STEP_ID", "3"),
                    ("SLURM_NNODES", "4"),
                    ("SLURM_NODEID", "2"),
                    ("SLURM_JOB_NODELIST", "gpu[007-010]"),
                    ("SLURM_CPUS_ON_NODE", "16"),
                ],
                "slurm: nnodes=4 (SLURM_NNODES) node_rank=2 (SLURM_NODEID) \
                 rdzv_endpoint=gpu007:21003 (SLURM_JOB_NODELIST) rdzv_id=812.3 (SLURM_JOB_ID.SLURM_STEP_ID) \
                 cpus=16 (SLURM_CPUS_ON_NODE)",
            ),
            // A step on part of the allocation: the step's own counts and list.
            (
                &[
                    ("SLURM_JOB_ID", "9"),
                    ("SLURM_STEPID", "0"),
                    ("SLURM_NNODES", "8"),
                    ("SLURM_STEP_NUM_NODES", "2"),
                    ("SLURM_NODEID", "1"),
                    ("SLURM_JOB_NODELIST", "n[1-8]"),
                    ("SLURM_STEP_NODELIST", "n[5-6]"),
                ],
                "slurm: nnodes=2 (SLURM_STEP_NUM_NODES) node_rank=1 (SLURM_NODEID) \
                 rdzv_endpoint=n5:28442 (SLURM_STEP_NODELIST) rdzv_id=9.0 (SLURM_JOB_ID.SLURM_STEPID)",
            ),
            // Two tasks per node: one agent per task, ranked by task.
            (
                &[
                    ("SLURM_JOB_ID", "9"),
                    ("SLURM_STEP_ID", "0"),
                    ("SLURM_STEP_NUM_NODES", "2"),
                    ("SLURM_STEP_NUM_TASKS", "4"),
                    ("SLURM_NODEID", "1"),
                    ("SLURM_PROCID", "3"),
                    ("SLURM_STEP_NODELIST", "a,b"),
                ],
                "slurm: nnodes=4 (SLURM_STEP_NUM_TASKS) node_rank=3 (SLURM_PROCID) \
                 rdzv_endpoint=a:28442 (SLURM_STEP_NODELIST) rdzv_id=9.0 (SLURM_JOB_ID.SLURM_STEP_ID)",
            ),
            // A batch script is one process on the first node: only its CPUs.
            (
                &[("SLURM_JOB_ID", "9"), ("SLURM_NNODES", "8"), ("SLURM_NODEID", "0"), ("SLURM_CPUS_ON_NODE", "4")],
                "slurm: cpus=4 (SLURM_CPUS_ON_NODE)",
            ),
            (
                &[
                    ("PET_NNODES", "2"),
                    ("PET_NODE_RANK", "1"),
                    ("PET_NPROC_PER_NODE", "8"),
                    ("MASTER_ADDR", "job-master-0"),
                    ("MASTER_PORT", "23456"),
                    ("WORLD_SIZE", "16"),
                    ("RANK", "1"),
                ],
                "pytorchjob: nnodes=2 (PET_NNODES) node_rank=1 (PET_NODE_RANK) \
                 rdzv_endpoint=job-master-0:23456 (MASTER_ADDR:MASTER_PORT)",
            ),
            // Elastic PyTorchJob: nnodes MIN:MAX stays with clap; the rank is RANK.
            (
                &[("PET_NNODES", "1:4"), ("MASTER_ADDR", "m"), ("MASTER_PORT", "1"), ("RANK", "2")],
                "pytorchjob: node_rank=2 (RANK) rdzv_endpoint=m:1 (MASTER_ADDR:MASTER_PORT)",
            ),
            // Volcano with its pytorch plugin: global ranks over every task.
            (
                &[
                    ("VC_TASK_INDEX", "0"),
                    ("VK_TASK_INDEX", "0"),
                    ("MASTER_ADDR", "tj-master-0.tj"),
                    ("MASTER_PORT", "23456"),
                    ("WORLD_SIZE", "3"),
                    ("RANK", "2"),
                ],
                "volcano: nnodes=3 (WORLD_SIZE) node_rank=2 (RANK) \
                 rdzv_endpoint=tj-master-0.tj:23456 (MASTER_ADDR:MASTER_PORT)",
            ),
            // Volcano with the env and svc plugins: this pod's task, found by its host name.
            (
                &[
                    ("VC_TASK_INDEX", "1"),
                    ("HOSTNAME", "mnist-worker-1"),
                    ("VC_WORKER_HOSTS", "mnist-worker-0.mnist,mnist-worker-1.mnist,mnist-worker-2.mnist"),
                    ("VC_WORKER_NUM", "3"),
                ],
                "volcano: nnodes=3 (VC_WORKER_NUM) node_rank=1 (VC_TASK_INDEX) \
                 rdzv_endpoint=mnist-worker-0.mnist:29400 (VC_WORKER_HOSTS)",
            ),
            (
                &[
                    ("VK_TASK_INDEX", "0"),
                    ("HOSTNAME", "j-trainer-x-0"),
                    ("VC_TRAINER_X_HOSTS", "j-trainer-x-0.j"),
                    ("VC_TRAINER_X_NUM", "1"),
                ],
                "volcano: nnodes=1 (VC_TRAINER_X_NUM) node_rank=0 (VK_TASK_INDEX) \
                 rdzv_endpoint=j-trainer-x-0.j:29400 (VC_TRAINER_X_HOSTS)",
            ),
            // Only the env plugin: the index, nothing to count.
            (&[("VC_TASK_INDEX", "4"), ("HOSTNAME", "x-y-4")], "volcano: node_rank=4 (VC_TASK_INDEX)"),
            (&[("JOB_COMPLETION_INDEX", "5")], "indexed-job: node_rank=5 (JOB_COMPLETION_INDEX)"),
            // JobSet: completion indexes repeat in every replica of a replicated job; only the first is ranked.
            (&[("JOB_COMPLETION_INDEX", "1"), ("JOB_INDEX", "0")], "indexed-job: node_rank=1 (JOB_COMPLETION_INDEX)"),
            (&[("JOB_COMPLETION_INDEX", "1"), ("JOB_INDEX", "2")], "indexed-job: nothing usable"),
            (
                &[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4"), ("PMIX_RANK", "3")],
                "mpi: nnodes=4 (OMPI_COMM_WORLD_SIZE) node_rank=3 (OMPI_COMM_WORLD_RANK)",
            ),
            (&[("PMIX_RANK", "7")], "mpi: node_rank=7 (PMIX_RANK)"),
            // Precedence: Slurm before MPI (srun --mpi=pmix sets both).
            (
                &[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_NNODES", "1"), ("SLURM_NODEID", "0"),
                  ("SLURM_NODELIST", "h"), ("PMIX_RANK", "0")],
                "slurm: nnodes=1 (SLURM_NNODES) node_rank=0 (SLURM_NODEID) rdzv_endpoint=h:28690 (SLURM_NODELIST) \
                 rdzv_id=1.0 (SLURM_JOB_ID.SLURM_STEP_ID)",
            ),
        ];
        for (vars, want) in rows {
            let got = detected(vars).map(|c| c.to_string()).unwrap_or_else(|| "-".into());
            assert_eq!(got, *want, "{vars:?}");
        }
    }

    #[test]
    fn unusable_values_name_the_variable() {
        let rows: &[(&[(&str, &str)], &str)] = &[
            (&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_NNODES", "two")], "SLURM_NNODES='two'"),
            (&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_NNODES", "0")], ">= 1"),
            (&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_NODEID", "-1")], "SLURM_NODEID='-1'"),
            (&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_JOB_NODELIST", "n[2-1]")], "SLURM_JOB_NODELIST"),
            (&[("SLURM_JOB_ID", "1 2"), ("SLURM_STEP_ID", "0")], "SLURM_JOB_ID='1 2'"),
            (&[("SLURM_JOB_ID", "1"), ("SLURM_CPUS_ON_NODE", "0")], "SLURM_CPUS_ON_NODE"),
            (&[("PET_NNODES", "2"), ("MASTER_ADDR", "m"), ("MASTER_PORT", "http")], "MASTER_PORT='http'"),
            (&[("PET_NNODES", "2"), ("MASTER_ADDR", "m"), ("MASTER_PORT", "1"), ("PET_NODE_RANK", "x")], "PET_NODE_RANK"),
            (&[("VC_TASK_INDEX", "one")], "VC_TASK_INDEX='one'"),
            (&[("JOB_COMPLETION_INDEX", "?")], "JOB_COMPLETION_INDEX"),
            (&[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "0")], "OMPI_COMM_WORLD_SIZE"),
            (&[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")], "less than OMPI_COMM_WORLD_SIZE"),
        ];
        for (vars, needle) in rows {
            let e = detect(&env_of(vars)).unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("launch context"), "{vars:?}: {e}");
        }
    }
}
