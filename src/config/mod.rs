//! The validated launch configuration: everything the agent needs, checked once, before anything starts.
//!
//! Pure apart from lookups passed in or done at the edge (environment variables, the file system for the script
//! and `--log-dir`, NVML for `--nproc-per-node gpu|auto`), so every rule here is unit-tested. Each error names the flag
//! or value and what would be valid; the binary prints it as one line and exits 2 without starting a worker.

use std::collections::BTreeSet;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cli::Cli;
use crate::gpu::placement::PlacementError;
pub use health::{Health, OnLinkDrop};
pub use inplace::InPlaceConfig;
pub use straggler::{OnStraggler, StragglerConfig};

mod entrypoint;
mod hang;
mod health;
mod inplace;
mod straggler;
mod logs;
mod observe;
mod parse;
mod rdzv;
pub mod etcd;
pub mod k8s;
pub mod token;

pub use entrypoint::{find_program, Entrypoint, WarmConfig};
pub use hang::{HangConfig, OnHang};
pub use observe::ObserveConfig;
pub use logs::{LogConfig, Std, StdSpec};
pub use parse::{parse_nnodes, parse_signals};
pub use rdzv::{parse_endpoint, session_ttl, EtcdConf, EtcdProtocol, RdzvConf, Rendezvous, StoreType, RDZV_CONF_KEYS};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

/// A bad-input message; control characters of an echoed value are escaped so that it stays one line.
fn bad(msg: impl Into<String>) -> ConfigError {
    let msg: String = msg.into();
    ConfigError(if msg.contains(char::is_control) {
        msg.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
    } else {
        msg
    })
}

#[derive(Debug, Clone)]
pub struct LaunchConfig {
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub nproc_per_node: u32,
    /// The backend name as torchrun would report it (after standalone resolution).
    pub rdzv_backend: String,
    pub rendezvous: Rendezvous,
    /// This node's address: its rendezvous id and, on group rank 0, the workers' MASTER_ADDR.
    pub local_addr: String,
    /// `--nproc-per-node` as given (part of the launch fingerprint).
    pub nproc_spec: String,
    pub run_id: String,
    /// `--rdzv-conf`, typed.
    pub rdzv: RdzvConf,
    /// The job token agents present to the rendezvous store (`MUSTER_RDZV_TOKEN` or `token_file=`).
    pub token: Option<token::Token>,
    /// static's group rank (`--node-rank`, or the scheduler's).
    pub node_rank: u32,
    /// The rank this agent asks of the rendezvous: static's group rank; with c10d a preference among
    /// newcomers (`--node-rank` given, or the scheduler's node rank). None: join order.
    pub pref_rank: Option<u32>,
    /// What this launch took from the scheduler's environment (`context`), for the banner.
    pub context: Option<crate::context::Filled>,
    pub max_restarts: u32,
    /// `--job-max-restarts`: the job-wide restart budget, counted in the rendezvous store.
    pub restart_budget: Option<crate::rendezvous::RestartBudget>,
    /// `--exclude-after`: how many incidents keep a host out (same syntax as the budget).
    pub exclude_after: Option<crate::rendezvous::RestartBudget>,
    pub role: String,
    pub entrypoint: Entrypoint,
    pub logs: LogConfig,
    pub signals: Vec<Signal>,
    /// The original `--signals-to-handle` text, exported to workers as torchrun does.
    pub signals_text: String,
    pub shutdown_timeout: Duration,
    pub virtual_local_rank: bool,
    /// Metrics endpoint, event log and console events.
    pub observe: ObserveConfig,
    /// What each GPU fault does.
    pub gpu_policy: crate::gpu::xid::Policy,
    /// `--numa-binding` (torch's modes), parsed.
    pub numa_binding: Option<crate::gpu::topology::NumaMode>,
    /// `--gpus`: the GPUs to use.
    pub gpus: Option<String>,
    /// The user's hook for a drained node.
    pub on_node_fault: Option<String>,
    /// The health gate before every join (`crate::gate`).
    pub health: Health,
    pub gpu_wait_timeout: Duration,
    /// `--warm-spares`: None when off.
    pub warm_spares: Option<WarmConfig>,
    /// `--hang-timeout` and its companions: None when off.
    pub hang: Option<HangConfig>,
    /// `--straggler-window`, `--on-straggler`: None when off.
    pub straggler: Option<StragglerConfig>,
    /// `--in-place`, `--in-place-timeout`: None when off.
    pub in_place: Option<InPlaceConfig>,
    /// `--stacks-on-failure`.
    pub stacks_on_failure: bool,
}

impl LaunchConfig {
    /// Whether the user asked for GPU placement explicitly (then an impossible one is an error; otherwise a
    /// job with more workers than GPUs, e.g. a CPU job on a GPU node, simply runs without placement).
    pub fn wants_gpu_placement(&self) -> bool {
        self.gpus.is_some() || self.numa_binding.is_some() || matches!(self.nproc_spec.as_str(), "gpu" | "auto")
    }

    /// The GPU placement for `excluded` GPUs (None: no NVML, no GPU, or not applicable to this job). With
    /// `strict` (a job whose workers were placed on GPUs before) every failure is an error: a GPU job never
    /// silently becomes a job without placement.
    pub fn placement_strict(
        &self,
        nproc: u32,
        excluded: &BTreeSet<u32>,
        strict: bool,
    ) -> Result<Option<crate::gpu::topology::Plan>, PlacementError> {
        let plan = crate::gpu::placement::placement_for(
            nproc,
            self.numa_binding,
            self.gpus.as_deref(),
            excluded,
            self.virtual_local_rank,
        );
        match plan {
            Ok(None) if strict => Err(PlacementError::System("NVML no longer reports the job's GPUs".into())),
            Ok(None) if self.numa_binding.is_some() || self.gpus.is_some() => Err(PlacementError::Input(
                "'--numa-binding' and '--gpus' need NVIDIA GPUs, and NVML reports none on this node".into(),
            )),
            Ok(plan) => Ok(plan),
            Err(e) if strict || self.wants_gpu_placement() => Err(e),
            Err(e) => {
                tracing::info!("no GPU placement for this job: {e}");
                Ok(None)
            }
        }
    }

    /// The first placement, checked before anything starts: an impossible one is bad input.
    pub fn placement(&self, nproc: u32, excluded: &BTreeSet<u32>) -> Result<Option<crate::gpu::topology::Plan>, ConfigError> {
        self.placement_strict(nproc, excluded, false).map_err(|e| bad(e.to_string()))
    }
}

/// The outside world `LaunchConfig::from_cli` consults, injectable for tests.
pub struct Host<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub gpu_count: &'a dyn Fn() -> Result<u32, String>,
    pub cpu_count: usize,
    pub fqdn: &'a dyn Fn() -> String,
}

impl LaunchConfig {
    pub fn from_cli(cli: &Cli, host: &Host) -> Result<LaunchConfig, ConfigError> {
        // The scheduler's values where the user gave none (`context`); nothing changes without one.
        let detected = crate::context::detect(host.env).map_err(|e| bad(e.to_string()))?;
        let (filled_cli, mut context) = detected.map(|c| crate::context::fill(cli, &c)).unzip();
        let cli = filled_cli.as_ref().unwrap_or(cli);
        let cpus = context.as_ref().and_then(|f| f.cpus.as_ref()).map(|c| c.value as usize);
        let host = &Host { cpu_count: cpus.unwrap_or(host.cpu_count), ..*host };

        let (min_nodes, max_nodes) = parse_nnodes(&cli.nnodes)?;
        let nproc_per_node = parse::parse_nproc(&cli.nproc_per_node, host)?;
        if let Some(f) = context.as_mut() {
            let spec = cli.nproc_per_node.trim();
            f.note_nproc(spec, nproc_per_node, spec == "auto" && (host.gpu_count)().is_ok_and(|n| n > 0));
        }
        let rank_from_context = context.as_ref().is_some_and(|f| f.node_rank);
        let rdzv = RdzvConf::parse(&cli.rdzv_conf)?;
        let straggler = straggler::from_cli(cli, rdzv.keep_alive_interval)?;
        let in_place = inplace::from_cli(cli)?;
        let token = token::resolve(rdzv.token_file.as_deref(), token::RDZV_CONF_FLAG, (host.env)(token::TOKEN_ENV))?;
        let signals = parse_signals(&cli.signals_to_handle)?;
        let entrypoint = entrypoint::resolve(cli, host)?;

        if let Some(specs) = cli.logs_specs.as_deref().filter(|s| *s != "default") {
            return Err(bad(format!("invalid value '{specs}' for '--logs-specs': muster has only 'default'")));
        }

        // The rendezvous records are lines of space-separated fields (rendezvous/wire.rs).
        if let Some(addr) = cli.local_addr.as_deref().filter(|a| a.is_empty() || a.contains(char::is_whitespace)) {
            return Err(bad(format!("invalid value '{addr}' for '--local-addr': use a host name or address (no spaces)")));
        }
        let (rdzv_backend, rendezvous, run_id) =
            rdzv::resolve(cli, max_nodes, &rdzv, rank_from_context, etcd::credentials(host.env)?)?;
        let asks_rank = matches!(rendezvous, Rendezvous::Static { .. }) || cli.given("node_rank").is_some();
        let logs = LogConfig::from_cli(cli, host)?;

        let shutdown_timeout = match cli.shutdown_timeout {
            Some(s) => s,
            None => match (host.env)("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Some(v) => v.trim().parse::<u32>().map_err(|_| {
                    bad(format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='{v}': must be an integer number of seconds >= 0"))
                })?,
                None => 30,
            },
        };


        Ok(LaunchConfig {
            min_nodes,
            max_nodes,
            nproc_per_node,
            rdzv_backend,
            rendezvous,
            local_addr: cli.local_addr.clone().unwrap_or_else(|| (host.fqdn)()),
            nproc_spec: cli.nproc_per_node.trim().to_string(),
            run_id,
            rdzv,
            token,
            node_rank: cli.node_rank,
            pref_rank: (asks_rank || rank_from_context).then_some(cli.node_rank),
            context,
            max_restarts: cli.max_restarts,
            restart_budget: cli
                .job_max_restarts
                .as_deref()
                .map(|s| s.parse().map_err(|e| bad(format!("invalid value '{s}' for '--job-max-restarts': {e}"))))
                .transpose()?,
            exclude_after: cli
                .exclude_after
                .as_deref()
                .map(|s| s.parse().map_err(|e| bad(format!("invalid value '{s}' for '--exclude-after': {e}"))))
                .transpose()?,
            role: cli.role.clone(),
            entrypoint,
            logs,
            signals,
            signals_text: cli.signals_to_handle.clone(),
            shutdown_timeout: Duration::from_secs(u64::from(shutdown_timeout)),
            virtual_local_rank: cli.virtual_local_rank,
            observe: observe::from_cli(cli)?,
            gpu_policy: crate::gpu::xid::Policy::parse(&cli.on_gpu_fault, &cli.xid_policy)
                .map_err(|e| bad(e.to_string()))?,
            on_node_fault: cli.on_node_fault.clone().filter(|c| !c.trim().is_empty()),
            numa_binding: cli.numa_binding.as_deref().map(str::parse).transpose().map_err(bad)?,
            gpus: cli.gpus.clone().filter(|g| !g.trim().is_empty()),
            health: Health::from_cli(cli)?,
            gpu_wait_timeout: Duration::from_secs(u64::from(cli.gpu_wait_timeout)),
            warm_spares: entrypoint::warm_spares(cli)?,
            hang: hang::from_cli(cli)?,
            straggler,
            in_place,
            stacks_on_failure: cli.stacks_on_failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| match k {
            "PATH" => std::env::var("PATH").ok(),
            _ => vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
        }
    }

    fn config(args: &[&str]) -> Result<LaunchConfig, ConfigError> {
        config_in(&[], args)
    }

    fn config_in(vars: &'static [(&'static str, &'static str)], args: &[&str]) -> Result<LaunchConfig, ConfigError> {
        let env = host_env(vars);
        let host = Host { env: &env, gpu_count: &|| Err("no driver".into()), cpu_count: 4, fqdn: &|| "node0".into() };
        let argv: Vec<String> = std::iter::once("muster").chain(args.iter().copied()).map(String::from).collect();
        let cli = crate::cli::parse(&argv).unwrap();
        LaunchConfig::from_cli(&cli, &host)
    }

    #[test]
    fn plain_single_node_is_implicit_standalone() {
        // Any existing file will do as the "script": python mode only checks that it is a file.
        let c = config(&["--nproc-per-node", "2", "/bin/true"]).unwrap();
        assert_eq!(c.rdzv_backend, "c10d");
        assert_eq!(c.rendezvous, Rendezvous::C10d { host: "localhost".into(), port: 0, is_host: Some(true) });
        assert_eq!(c.local_addr, "node0");
        assert_eq!(c.run_id.len(), 36);
        assert_eq!(c.entrypoint.args[..2], ["-u".to_string(), "/bin/true".to_string()]);
    }

    #[test]
    fn master_port_keeps_static() {
        let c = config(&["--master-port", "1234", "--no-python", "true"]).unwrap();
        assert_eq!(c.rendezvous, Rendezvous::Static { master_addr: "127.0.0.1".into(), master_port: 1234 });
        assert_eq!(c.run_id, "none");
        assert_eq!(c.entrypoint.name, "true");
    }

    #[test]
    fn bad_inputs_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&["--nproc-per-node", "0", "x"], "--nproc-per-node"),
            (&["--nproc-per-node", "gpu", "x"], "--nproc-per-node gpu"),
            (&["-m", "--no-python", "x"], "--no-python"),
            (&["--no-python", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")], "--no-python"),
            (&["/nonexistent/train.py"], "/nonexistent/train.py"),
            (&["--nnodes", "2", "--node-rank", "2", "--master-port", "1", "/bin/true"], "--node-rank"),
            (&["--rdzv-backend", "c10d", "--rdzv-conf", "is_host=maybe", "/bin/true"], "is_host"),
            (&["--rdzv-backend", "etcd", "--rdzv-conf", "protocol=https", "--rdzv-endpoint", "h:1", "/bin/true"], "cacert"),
            (&["--rdzv-backend", "etcd-v4", "--rdzv-endpoint", "h:1", "/bin/true"], "--rdzv-backend"),
            (&["--rdzv-endpoint", ":", "/bin/true"], "--rdzv-endpoint"),
            (&["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1:31005", "/bin/true"], "[::1:31005"),
            (&[], "script is missing"),
            (&["--local-addr", "my host", "/bin/true"], "--local-addr"),
            (&["--progress-pattern", "step", "/bin/true"], "--progress-pattern needs --hang-timeout"),
            (&["--on-hang", "report", "/bin/true"], "--on-hang needs --hang-timeout"),
            (&["--hang-timeout", "0", "/bin/true"], "'--hang-timeout': must be a number of seconds > 0"),
            (&["--hang-timeout", "5", "--progress-pattern", "step (", "/bin/true"], "'--progress-pattern': not a regular expression"),
            (&["--gate-checks", "disk", "/bin/true"], "invalid value 'disk' for '--gate-checks'"),
            (&["--on-link-drop", "restart", "/bin/true"], "invalid value 'restart' for '--on-link-drop': use report or drain"),
            (&["--on-straggler", "kill", "/bin/true"], "invalid value 'kill' for '--on-straggler': use report or drain"),
            (&["--straggler-window", "9", "/bin/true"], "--straggler-window 9: shorter than two heartbeats"),
        ];
        for (args, needle) in cases {
            let e = config(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn an_echoed_value_with_a_line_break_stays_one_line() {
        let e = config(&["--nnodes", "1\n2", "/bin/true"]).unwrap_err().to_string();
        assert_eq!(e, "invalid value '1\\n2' for '--nnodes': use N or MIN:MAX with 0 < MIN <= MAX");
    }

    #[test]
    fn rdzv_conf_reaches_the_config_typed() {
        let c = config(&[
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:31005", "--rdzv-conf", "is_host=0,join_timeout=5",
            "/bin/true",
        ])
        .unwrap();
        assert_eq!(c.rdzv.join_timeout, Duration::from_secs(5));
        assert_eq!(c.rdzv.read_timeout, Duration::from_secs(60));
        assert_eq!(c.rendezvous, Rendezvous::C10d { host: "::1".into(), port: 31005, is_host: Some(false) });
    }

    #[test]
    fn nproc_auto_falls_back_to_cpus() {
        let c = config(&["--nproc-per-node", "auto", "--no-python", "true"]).unwrap();
        assert_eq!(c.nproc_per_node, 4);
    }

    #[test]
    fn a_slurm_step_fills_what_the_user_left_out() {
        const SLURM: &[(&str, &str)] = &[
            ("SLURM_JOB_ID", "812"),
            ("SLURM_STEP_ID", "3"),
            ("SLURM_NNODES", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_JOB_NODELIST", "gpu[007-008]"),
            ("SLURM_CPUS_ON_NODE", "6"),
        ];
        let c = config_in(SLURM, &["--nproc-per-node", "cpu", "--no-python", "true"]).unwrap();
        assert_eq!((c.min_nodes, c.max_nodes, c.nproc_per_node), (2, 2, 6));
        assert_eq!(c.rendezvous, Rendezvous::C10d { host: "gpu007".into(), port: 21003, is_host: None });
        assert_eq!((c.run_id.as_str(), c.pref_rank), ("812.3", Some(1)));
        assert_eq!(
            c.context.unwrap().to_string(),
            "slurm: nnodes=2 (SLURM_NNODES) node_rank=1 (SLURM_NODEID) rdzv_backend=c10d (SLURM_JOB_NODELIST) \
             rdzv_endpoint=gpu007:21003 (SLURM_JOB_NODELIST) rdzv_id=812.3 (SLURM_JOB_ID.SLURM_STEP_ID) \
             nproc_per_node=6 (SLURM_CPUS_ON_NODE)"
        );
        // Flags win.
        let c = config_in(SLURM, &["--nnodes", "1:3", "--rdzv-id", "mine", "--no-python", "true"]).unwrap();
        assert_eq!((c.min_nodes, c.max_nodes, c.run_id.as_str()), (1, 3, "mine"));
    }

    #[test]
    fn without_a_context_a_rank_is_asked_only_when_given() {
        let c10d = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1", "--no-python", "true"];
        let c = config(&c10d).unwrap();
        assert_eq!((c.pref_rank, c.context.is_none()), (None, true));
        let c = config(&[&["--node-rank", "0"][..], &c10d].concat()).unwrap();
        assert_eq!(c.pref_rank, Some(0));
        let c = config(&["--nnodes", "2", "--master-port", "1", "--no-python", "true"]).unwrap();
        assert_eq!(c.pref_rank, Some(0), "static: the node rank is the group rank");
    }

    #[test]
    fn an_unusable_scheduler_variable_is_bad_input() {
        let e = config_in(&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0"), ("SLURM_NODEID", "x")], &["/bin/true"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("SLURM_NODEID='x' (from the slurm launch context)"), "{e}");
    }
}
