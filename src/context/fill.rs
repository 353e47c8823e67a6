//! A context applied to the command line: its values where the user gave none.
//!
//! Precedence, per value: a flag; a `PET_*` variable clap read (unless it is the context's own variable, as
//! PyTorchJob's `PET_NNODES`: then it is reported as the context's); the context; the default. The rendezvous
//! (c10d at the context's endpoint, with its run id) is filled only for a job of several agents and only when
//! the user named no rendezvous (`--standalone`, `--master-addr`, `--master-port`, `--rdzv-endpoint`, or a
//! backend other than c10d): a one-agent job keeps the implicit standalone's free port, which another job on
//! the same machine cannot hold (a fixed port can be).

use std::fmt;

use super::{Fact, Kind, LaunchContext};
use crate::cli::{Cli, Given};

/// One value the launch took from the context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Used {
    pub key: &'static str,
    pub value: String,
    pub from: String,
}

/// What the launch took from its context (for the banner and `muster plan`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filled {
    pub kind: Kind,
    pub used: Vec<Used>,
    /// The node rank is the scheduler's (then the rendezvous prefers it as this agent's group rank).
    pub node_rank: bool,
    /// CPUs allocated on this node, for `--nproc-per-node cpu|auto`.
    pub cpus: Option<Fact<u32>>,
}

impl Filled {
    /// Notes the worker count when the context's CPU count made it (`cpu`, or `auto` without GPUs).
    pub fn note_nproc(&mut self, spec: &str, nproc: u32, gpus: bool) {
        if let Some(cpus) = self.cpus.as_ref().filter(|c| c.value == nproc) {
            if spec == "cpu" || (spec == "auto" && !gpus) {
                self.used.push(Used { key: "nproc_per_node", value: nproc.to_string(), from: cpus.from.clone() });
            }
        }
    }
}

impl fmt::Display for Filled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.kind.name())?;
        if self.used.is_empty() {
            return write!(f, " nothing used (the command line gives every value it has)");
        }
        for u in &self.used {
            write!(f, " {}={} ({})", u.key, u.value, u.from)?;
        }
        Ok(())
    }
}

/// The command line with the context's values where the user gave none, and what was taken.
pub fn fill(cli: &Cli, context: &LaunchContext) -> (Cli, Filled) {
    let mut cli = cli.clone();
    let mut filled = Filled { kind: context.kind, used: Vec::new(), node_rank: false, cpus: context.cpus.clone() };
    let open = |cli: &Cli, id: &str, fact_from: &str| match cli.given(id) {
        None => true,
        Some(Given::Env) => fact_from == format!("PET_{}", id.to_ascii_uppercase()),
        Some(Given::Flag) => false,
    };
    let mut take = |key: &'static str, value: String, from: &str| {
        filled.used.push(Used { key, value, from: from.to_string() });
    };
    // `--standalone` is a one-node job whatever the scheduler counts.
    if let Some(n) = context.nnodes.as_ref().filter(|n| !cli.standalone && open(&cli, "nnodes", &n.from)) {
        cli.nnodes = n.value.to_string();
        take("nnodes", cli.nnodes.clone(), &n.from);
    }
    let rank = context.node_rank.as_ref().filter(|r| open(&cli, "node_rank", &r.from));
    if let Some(r) = rank {
        cli.node_rank = r.value;
        take("node_rank", r.value.to_string(), &r.from);
    }
    // The MAX of `N` or `MIN:MAX` (a malformed value is config's to refuse, after this).
    let several = cli.nnodes.rsplit(':').next().and_then(|max| max.trim().parse::<u32>().ok()).is_some_and(|max| max > 1);
    let named = cli.standalone || ["master_addr", "master_port", "rdzv_endpoint"].iter().any(|id| cli.given(id).is_some());
    let c10d = cli.given("rdzv_backend").is_none() || cli.rdzv_backend == "c10d";
    if let Some(e) = context.endpoint.as_ref().filter(|_| several && !named && c10d) {
        if cli.given("rdzv_backend").is_none() {
            cli.rdzv_backend = "c10d".into();
            take("rdzv_backend", cli.rdzv_backend.clone(), &e.from);
        }
        cli.rdzv_endpoint = e.value.clone();
        take("rdzv_endpoint", e.value.clone(), &e.from);
    }
    let dynamic = several && !cli.standalone && cli.rdzv_backend == "c10d";
    if let Some(id) = context.run_id.as_ref().filter(|id| dynamic && open(&cli, "rdzv_id", &id.from)) {
        cli.rdzv_id = id.value.clone();
        take("rdzv_id", id.value.clone(), &id.from);
    }
    filled.node_rank = rank.is_some();
    (cli, filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{detect, env_of};

    /// The command line `args`, with the `PET_*` fallbacks these tests use taken from `vars` as clap takes
    /// them from the process environment.
    fn filled(args: &[&str], vars: &[(&str, &str)]) -> String {
        let argv: Vec<String> = std::iter::once("muster").chain(args.iter().copied()).chain(["x.py"]).map(String::from).collect();
        let mut cli = crate::cli::parse(&argv).unwrap();
        for (k, v) in vars {
            let id = match *k {
                "PET_NNODES" => "nnodes",
                "PET_NODE_RANK" => "node_rank",
                "PET_MASTER_PORT" => "master_port",
                _ => continue,
            };
            if cli.given(id).is_none() {
                match id {
                    "nnodes" => cli.nnodes = v.to_string(),
                    "node_rank" => cli.node_rank = v.parse().unwrap(),
                    _ => cli.master_port = Some(v.parse().unwrap()),
                }
                cli.given.insert(id.to_string(), Given::Env);
            }
        }
        let context = detect(&env_of(vars)).unwrap().unwrap();
        let (cli, filled) = fill(&cli, &context);
        format!(
            "{filled} | --nnodes {} --node-rank {} --rdzv-backend {} --rdzv-endpoint '{}' --rdzv-id {}",
            cli.nnodes, cli.node_rank, cli.rdzv_backend, cli.rdzv_endpoint, cli.rdzv_id
        )
    }

    const SLURM: &[(&str, &str)] = &[
        ("SLURM_JOB_ID", "812"),
        ("SLURM_STEP_ID", "3"),
        ("SLURM_NNODES", "2"),
        ("SLURM_NODEID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[007-008]"),
        ("SLURM_CPUS_ON_NODE", "16"),
    ];

    #[test]
    fn flags_win_and_the_rest_comes_from_the_context() {
        let all = "slurm: nnodes=2 (SLURM_NNODES) node_rank=1 (SLURM_NODEID) rdzv_backend=c10d (SLURM_JOB_NODELIST) \
                   rdzv_endpoint=gpu007:21003 (SLURM_JOB_NODELIST) rdzv_id=812.3 (SLURM_JOB_ID.SLURM_STEP_ID)";
        type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], String);
        let rows: &[Row] = &[
            (&[], SLURM, format!("{all} | --nnodes 2 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 'gpu007:21003' --rdzv-id 812.3")),
            (
                &["--nnodes", "1:4", "--rdzv-id", "mine"],
                SLURM,
                "slurm: node_rank=1 (SLURM_NODEID) rdzv_backend=c10d (SLURM_JOB_NODELIST) rdzv_endpoint=gpu007:21003 \
                 (SLURM_JOB_NODELIST) | --nnodes 1:4 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 'gpu007:21003' --rdzv-id mine"
                    .into(),
            ),
            // The user's rendezvous: only the counts and the rank.
            (
                &["--rdzv-backend", "c10d", "--rdzv-endpoint", "h:5"],
                SLURM,
                "slurm: nnodes=2 (SLURM_NNODES) node_rank=1 (SLURM_NODEID) rdzv_id=812.3 (SLURM_JOB_ID.SLURM_STEP_ID) \
                 | --nnodes 2 --node-rank 1 --rdzv-backend c10d --rdzv-endpoint 'h:5' --rdzv-id 812.3"
                    .into(),
            ),
            (
                &["--master-addr", "h", "--node-rank", "0"],
                SLURM,
                "slurm: nnodes=2 (SLURM_NNODES) | --nnodes 2 --node-rank 0 --rdzv-backend static --rdzv-endpoint '' --rdzv-id none".into(),
            ),
            (
                &["--standalone"],
                SLURM,
                "slurm: node_rank=1 (SLURM_NODEID) | --nnodes 1:1 --node-rank 1 --rdzv-backend static --rdzv-endpoint '' --rdzv-id none".into(),
            ),
            // One agent: the implicit standalone's free port, not 29400.
            (
                &["--nnodes", "1"],
                SLURM,
                "slurm: node_rank=1 (SLURM_NODEID) | --nnodes 1 --node-rank 1 --rdzv-backend static --rdzv-endpoint '' --rdzv-id none".into(),
            ),
            // PyTorchJob: its own PET_ variables are the context's; a PET_MASTER_PORT picks static, as torchrun.
            (
                &[],
                &[("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("MASTER_ADDR", "m"), ("MASTER_PORT", "23456")],
                "pytorchjob: nnodes=2 (PET_NNODES) node_rank=1 (PET_NODE_RANK) rdzv_backend=c10d (MASTER_ADDR:MASTER_PORT) \
                 rdzv_endpoint=m:23456 (MASTER_ADDR:MASTER_PORT) | --nnodes 2 --node-rank 1 --rdzv-backend c10d \
                 --rdzv-endpoint 'm:23456' --rdzv-id none"
                    .into(),
            ),
            (
                &[],
                &[("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("MASTER_ADDR", "m"), ("MASTER_PORT", "1"), ("PET_MASTER_PORT", "1")],
                "pytorchjob: nnodes=2 (PET_NNODES) node_rank=1 (PET_NODE_RANK) | --nnodes 2 --node-rank 1 --rdzv-backend static \
                 --rdzv-endpoint '' --rdzv-id none"
                    .into(),
            ),
            // A PET_ variable that is not the context's own wins over it.
            (
                &[],
                &[("PET_NODE_RANK", "0"), ("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")],
                "mpi: nnodes=4 (OMPI_COMM_WORLD_SIZE) | --nnodes 4 --node-rank 0 --rdzv-backend static --rdzv-endpoint '' --rdzv-id none".into(),
            ),
            (
                &["--nnodes", "2", "--node-rank", "1"],
                &[("JOB_COMPLETION_INDEX", "0")],
                "indexed-job: nothing used (the command line gives every value it has) | --nnodes 2 --node-rank 1 \
                 --rdzv-backend static --rdzv-endpoint '' --rdzv-id none"
                    .into(),
            ),
        ];
        for (args, vars, want) in rows {
            assert_eq!(filled(args, vars), *want, "{args:?} {vars:?}");
        }
    }

    #[test]
    fn the_cpu_count_is_noted_when_it_made_the_worker_count() {
        let context = detect(&env_of(SLURM)).unwrap().unwrap();
        let cli = crate::cli::parse(&["muster".into(), "x.py".into()]).unwrap();
        for (spec, nproc, gpus, noted) in [("cpu", 16, false, true), ("auto", 16, false, true), ("auto", 16, true, false), ("4", 4, false, false)] {
            let (_, mut f) = fill(&cli, &context);
            f.note_nproc(spec, nproc, gpus);
            assert_eq!(f.to_string().contains("nproc_per_node=16 (SLURM_CPUS_ON_NODE)"), noted, "{spec} {gpus}");
        }
    }
}
