//! torchrun-compatible command line.
//!
//! Every torchrun 2.15 option is here, in torchrun's declaration order, with both the dash and the underscore
//! spelling and the `PET_<DEST>` environment fallback (the command line wins). The arguments are read the
//! argparse way first (`argv.rs`: prefixes, repeated options, unknown options, `--`); everything after the
//! script is passed to the script untouched. Values are parsed here into simple types; checks that involve
//! several flags, the file system or the host live in `config/`.

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

mod argv;
#[cfg(test)]
mod fuzz;

pub use argv::ArgvError;

/// Flags that torchrun reads as `bool(int(os.environ["PET_X"]))`: `1` enables, `0` disables. clap itself
/// passes `true`/`false` for a flag given or absent on the command line; anything else is an error.
fn pet_flag(s: &str) -> Result<bool, String> {
    match s.trim() {
        "true" => Ok(true),
        "false" => Ok(false),
        v => v.parse::<i64>().map(|v| v != 0).map_err(|_| format!("must be 0 (off) or 1 (on), got '{s}'")),
    }
}

fn non_negative_int(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| format!("must be an integer >= 0, got '{s}'"))
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("must be a number of seconds > 0, got '{s}'")),
    }
}

fn non_negative_seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("must be a number of seconds >= 0, got '{s}'")),
    }
}

fn port(s: &str) -> Result<u16, String> {
    s.trim()
        .parse::<u16>()
        .map_err(|_| format!("must be a port number in 0..=65535, got '{s}'"))
}

/// Where a value of the command line came from, when the user gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Given {
    Flag,
    /// Its `PET_*` variable.
    Env,
}

/// The launcher's command line, as torchrun declares it.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "muster",
    version,
    about = "Per-node launcher for PyTorch distributed training: a drop-in for torchrun that stays up.",
    after_help = "Subcommands (reserved words, never taken as a script): muster store, muster plan, muster doctor, \
                  muster status, muster bench.\n\
                  Exit codes: 0 success, 1 workers failed, 2 bad input, 3 rendezvous incomplete (requeue), 4 \
                  rendezvous closed without this node, 5 the job's restart budget spent (do not requeue), 75 node unhealthy (reschedule elsewhere), 128+N stopped by \
                  signal N."
)]
#[command(args_override_self = true, disable_help_subcommand = true)]
pub struct Cli {
    /// Number of nodes: N, or MIN:MAX for an elastic job.
    #[arg(long, env = "PET_NNODES", default_value = "1:1")]
    pub nnodes: String,

    /// Workers per node: an integer, or cpu, gpu (NVIDIA GPUs seen through NVML) or auto (GPUs, else CPUs).
    #[arg(long = "nproc-per-node", alias = "nproc_per_node", env = "PET_NPROC_PER_NODE", default_value = "1")]
    pub nproc_per_node: String,

    /// Rendezvous backend: static, c10d, etcd or etcd-v2.
    #[arg(long = "rdzv-backend", alias = "rdzv_backend", env = "PET_RDZV_BACKEND", default_value = "static")]
    pub rdzv_backend: String,

    /// Rendezvous endpoint, host[:port] (an IPv6 address may be bracketed).
    #[arg(long = "rdzv-endpoint", alias = "rdzv_endpoint", env = "PET_RDZV_ENDPOINT", default_value = "")]
    pub rdzv_endpoint: String,

    /// Run id shared by every node of a job; exported as TORCHELASTIC_RUN_ID.
    #[arg(long = "rdzv-id", alias = "rdzv_id", env = "PET_RDZV_ID", default_value = "none")]
    pub rdzv_id: String,

    /// Rendezvous settings, key1=value1,key2=value2.
    #[arg(long = "rdzv-conf", alias = "rdzv_conf", env = "PET_RDZV_CONF", default_value = "")]
    pub rdzv_conf: String,

    /// Single-node job with a local rendezvous on a free port and a fresh run id.
    #[arg(long, env = "PET_STANDALONE", action = ArgAction::SetTrue, value_parser = pet_flag)]
    pub standalone: bool,

    /// Worker-group restarts allowed on this node after a worker failure.
    #[arg(long = "max-restarts", alias = "max_restarts", env = "PET_MAX_RESTARTS", default_value = "0",
          value_parser = non_negative_int, allow_hyphen_values = true)]
    pub max_restarts: u32,

    /// muster: restarts allowed to the whole job, over its run or within any WINDOW (`10/1h`; WINDOW in s,
    /// m, h or d), counted in the rendezvous store across every node, a replaced one too, one per incident.
    /// Past it every agent ends with exit code 5: the job fails too often to be worth requeueing.
    /// `--max-restarts` still bounds each node's own restarts.
    #[arg(long = "job-max-restarts", env = "MUSTER_JOB_MAX_RESTARTS", value_name = "N[/WINDOW]")]
    pub job_max_restarts: Option<String>,

    /// muster: keep out a host that caused K incidents of the job (within WINDOW: `2/1h`): its worker failed
    /// first in a restarted round, its GPU faulted, its ranks hung, or it drained. Recorded in the rendezvous
    /// store with each incident; the host is refused at its next join (exit code 75) and the job goes on
    /// without it. `muster status` lists the hosts kept out; `muster status --readmit HOST` lets one back in.
    #[arg(long = "exclude-after", env = "MUSTER_EXCLUDE_AFTER", value_name = "K[/WINDOW]")]
    pub exclude_after: Option<String>,

    /// Accepted for compatibility (must be > 0): muster notices worker exits and peer changes as they happen.
    #[arg(long = "monitor-interval", alias = "monitor_interval", env = "PET_MONITOR_INTERVAL",
          default_value = "0.1", value_parser = positive_seconds, allow_hyphen_values = true)]
    pub monitor_interval: f64,

    /// Multiprocessing start method; torchrun uses it only for --run-path, muster never needs it.
    #[arg(long = "start-method", alias = "start_method", env = "PET_START_METHOD", default_value = "spawn",
          value_parser = ["spawn", "fork", "forkserver"])]
    pub start_method: String,

    /// Where agent events go: null (nowhere), console (JSON lines on stderr) or dynamic_rendezvous.
    #[arg(long = "event-log-handler", alias = "event_log_handler", env = "PET_EVENT_LOG_HANDLER",
          default_value = "null", value_parser = ["null", "console", "dynamic_rendezvous"])]
    pub event_log_handler: String,

    /// Role name: ROLE_NAME and the log prefix [<role><local_rank>]:.
    #[arg(long, env = "PET_ROLE", default_value = "default")]
    pub role: String,

    /// Run the script as a Python module (python -u -m SCRIPT).
    #[arg(short = 'm', long, env = "PET_MODULE", action = ArgAction::SetTrue, value_parser = pet_flag)]
    pub module: bool,

    /// Execute the script directly, without the Python interpreter.
    #[arg(long = "no-python", alias = "no_python", env = "PET_NO_PYTHON", action = ArgAction::SetTrue,
          value_parser = pet_flag)]
    pub no_python: bool,

    /// Run the script through runpy.run_path (Python); takes precedence over --no-python.
    #[arg(long = "run-path", alias = "run_path", env = "PET_RUN_PATH", action = ArgAction::SetTrue,
          value_parser = pet_flag)]
    pub run_path: bool,

    /// Base directory for worker logs and error files (default: a new torchelastic_* temp directory).
    #[arg(long = "log-dir", alias = "log_dir", env = "PET_LOG_DIR")]
    pub log_dir: Option<String>,

    /// Redirect worker streams to files: 0 none, 1 stdout, 2 stderr, 3 both, or a per-rank map 0:1,1:2.
    #[arg(short = 'r', long, env = "PET_REDIRECTS", default_value = "0")]
    pub redirects: String,

    /// Like --redirects, and also copy each line to the console with a [<role><local_rank>]: prefix.
    #[arg(short = 't', long, env = "PET_TEE", default_value = "0")]
    pub tee: String,

    /// Prefix template for tee'd lines: $role_name, $rank, $local_rank, $hostname.
    #[arg(long = "log-line-prefix-template", alias = "log_line_prefix_template",
          env = "PET_LOG_LINE_PREFIX_TEMPLATE")]
    pub log_line_prefix_template: Option<String>,

    /// Only these local ranks reach the console (comma-separated); files are unaffected.
    #[arg(long = "local-ranks-filter", alias = "local_ranks_filter", env = "PET_LOCAL_RANKS_FILTER",
          default_value = "")]
    pub local_ranks_filter: String,

    /// Tee'd stdout lines containing any of these substrings also go to filtered_stdout.log (',,' escapes ',').
    #[arg(long = "duplicate-stdout-filters", alias = "duplicate_stdout_filters",
          env = "PET_DUPLICATE_STDOUT_FILTERS", default_value = "")]
    pub duplicate_stdout_filters: String,

    /// Same as --duplicate-stdout-filters for stderr, into filtered_stderr.log.
    #[arg(long = "duplicate-stderr-filters", alias = "duplicate_stderr_filters",
          env = "PET_DUPLICATE_STDERR_FILTERS", default_value = "")]
    pub duplicate_stderr_filters: String,

    /// This node's rank (static rendezvous only).
    #[arg(long = "node-rank", alias = "node_rank", env = "PET_NODE_RANK", default_value = "0",
          value_parser = non_negative_int, allow_hyphen_values = true)]
    pub node_rank: u32,

    /// Address of the rank-0 node (static rendezvous only).
    #[arg(long = "master-addr", alias = "master_addr", env = "PET_MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,

    /// Port of the rank-0 node (static rendezvous only; default 29500).
    #[arg(long = "master-port", alias = "master_port", env = "PET_MASTER_PORT", value_parser = port)]
    pub master_port: Option<u16>,

    /// This node's address: its id in the rendezvous and MASTER_ADDR when it hosts the store (default: FQDN).
    #[arg(long = "local-addr", alias = "local_addr", env = "PET_LOCAL_ADDR")]
    pub local_addr: Option<String>,

    /// Logs specification; only the default one exists in muster.
    #[arg(long = "logs-specs", alias = "logs_specs")]
    pub logs_specs: Option<String>,

    /// CPU binding per local rank: node, socket, exclusive or core-complex.
    #[arg(long = "numa-binding", alias = "numa_binding",
          value_parser = ["node", "socket", "exclusive", "core-complex"])]
    pub numa_binding: Option<String>,

    /// Signals forwarded to the workers before shutting down (comma-separated names).
    #[arg(long = "signals-to-handle", alias = "signals_to_handle", env = "PET_SIGNALS_TO_HANDLE",
          default_value = "SIGTERM,SIGINT,SIGHUP,SIGQUIT")]
    pub signals_to_handle: String,

    /// Seconds between the stop signal and SIGKILL (default: $TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30).
    #[arg(long = "shutdown-timeout", alias = "shutdown_timeout", env = "PET_SHUTDOWN_TIMEOUT",
          value_parser = non_negative_int, allow_hyphen_values = true)]
    pub shutdown_timeout: Option<u32>,

    /// Give each worker LOCAL_RANK=0 and only its own device in CUDA_VISIBLE_DEVICES.
    #[arg(long = "virtual-local-rank", alias = "virtual_local_rank", env = "PET_VIRTUAL_LOCAL_RANK",
          action = ArgAction::SetTrue, value_parser = pet_flag)]
    pub virtual_local_rank: bool,

    /// muster: the GPUs this node uses, as NVML indices or UUIDs (default: every visible GPU), e.g. 0,2,4.
    #[arg(long, env = "MUSTER_GPUS")]
    pub gpus: Option<String>,

    /// muster: what a fault that needs a GPU reset (XID 48, 95, 119, ...) does: exclude the GPU and go on with
    /// one worker fewer, or drain the node.
    #[arg(long = "on-gpu-fault", env = "MUSTER_ON_GPU_FAULT", default_value = "drain",
          value_parser = ["exclude", "drain"])]
    pub on_gpu_fault: String,

    /// muster: per-XID overrides of the fault policy, XID=ACTION,... with ACTION ignore|restart|exclude|drain.
    #[arg(long = "xid-policy", env = "MUSTER_XID_POLICY", default_value = "")]
    pub xid_policy: String,

    /// muster: command run (through sh -c) when this node drains for a GPU fault; it gets MUSTER_FAULT_* in its
    /// environment (GPU UUID, PCI id, XID, kind, hostname).
    #[arg(long = "on-node-fault", env = "MUSTER_ON_NODE_FAULT")]
    pub on_node_fault: Option<String>,

    /// muster: the health gate run before every join, checks from `storage,shm,network,gpu` (or `all`,
    /// `none`); a failing check drains the node (exit code 75, the --on-node-fault hook with
    /// MUSTER_FAULT_KIND=<check>). `gpu` is opt-in: it fails a pending row remap, which a contained XID 94
    /// leaves while the fault policy restarts the workers on that GPU.
    #[arg(long = "gate-checks", env = "MUSTER_GATE_CHECKS", default_value = "storage,shm,network", value_name = "LIST")]
    pub gate_checks: String,

    /// muster: a directory the storage check probes too (the checkpoint directory, say); repeatable.
    #[arg(long = "gate-path", env = "MUSTER_GATE_PATH", value_name = "PATH")]
    pub gate_path: Vec<std::path::PathBuf>,

    /// muster: seconds the whole health gate may take; a check that has not answered by then fails.
    #[arg(long = "gate-timeout", env = "MUSTER_GATE_TIMEOUT", default_value = "5", value_parser = positive_seconds)]
    pub gate_timeout: f64,

    /// muster: MiB of free /dev/shm the shm check wants per local worker.
    #[arg(long = "gate-shm-min", env = "MUSTER_GATE_SHM_MIN", default_value = "128", value_parser = non_negative_int)]
    pub gate_shm_min: u32,

    /// muster: what a link that drops while the workers run does (the interface that carries --local-addr
    /// losing its carrier or flapping, an InfiniBand port going down or its link_downed counter rising;
    /// watched while the `network` check is on): `report` (default) says so and training goes on, `drain`
    /// drains the node as a failed health check does (exit code 75, the --on-node-fault hook with
    /// MUSTER_FAULT_KIND=network).
    #[arg(long = "on-link-drop", env = "MUSTER_ON_LINK_DROP", default_value = "report", value_name = "report|drain")]
    pub on_link_drop: String,

    /// muster: seconds over which each rank's time is judged for stragglers (a sample of each rank's main
    /// thread, its stack and kernel state, every 250 ms or 16 times a window, never pausing it, and its GPU's
    /// clocks); group rank 0 names a rank that hardly waits on the others (in a collective, or inside DDP's
    /// backward) while they mostly wait on it, or whose GPU is slowed. Default 60 (or two
    /// keep_alive_interval's, if longer); 0 turns it off.
    #[arg(long = "straggler-window", env = "MUSTER_STRAGGLER_WINDOW", value_parser = non_negative_seconds,
          allow_hyphen_values = true, value_name = "SECONDS")]
    pub straggler_window: Option<f64>,

    /// muster: what a named straggler does: `report` (default) names it once per stretch, `drain` drains
    /// its node once it stays one through a second window (exit code 75, the --on-node-fault hook with
    /// MUSTER_FAULT_KIND=straggler); the job goes on without it (elastic MIN, or a spare).
    #[arg(long = "on-straggler", env = "MUSTER_ON_STRAGGLER", default_value = "report", value_name = "report|drain")]
    pub on_straggler: String,

    /// muster: seconds to wait, before starting workers, for a GPU to be released by other processes.
    #[arg(long = "gpu-wait-timeout", env = "MUSTER_GPU_WAIT_TIMEOUT", default_value = "30",
          value_parser = non_negative_int, allow_hyphen_values = true)]
    pub gpu_wait_timeout: u32,

    /// muster: keep one idle Python interpreter per local worker with these modules already imported
    /// (comma-separated, e.g. `torch`), so the next start of the group (a restart, or a group re-formed after a
    /// peer left or joined) skips the interpreter start and the imports. Each spare costs the memory of its
    /// imports. Python entrypoints only.
    #[arg(long = "warm-spares", env = "MUSTER_WARM_SPARES", value_name = "MODULES")]
    pub warm_spares: Option<String>,

    /// muster: seconds after the workers start before the warm spares are started, so that the spares' imports
    /// do not slow the workers' own start.
    #[arg(long = "warm-spares-delay", env = "MUSTER_WARM_SPARES_DELAY", default_value = "5",
          value_parser = non_negative_seconds, value_name = "SECONDS")]
    pub warm_spares_delay: f64,

    /// muster: re-form in place. Workers that use the `muster_inplace` Python API keep their processes, memory
    /// and step when the job's membership changes (a peer lost or joined, a worker dead on this node): each
    /// is handed its new ranks and re-joins the process group; only what failed starts again. Scripts that
    /// do not use the API restart as under torchrun. `off` restarts every worker, always.
    #[arg(long = "in-place", env = "MUSTER_IN_PLACE", default_value = "on", value_name = "on|off")]
    pub in_place: String,

    /// muster: seconds a worker kept in place has to re-form (re-join the process group and restore the
    /// state) before it is stopped and started cold.
    #[arg(long = "in-place-timeout", env = "MUSTER_IN_PLACE_TIMEOUT", default_value = "60",
          value_parser = positive_seconds, value_name = "SECONDS")]
    pub in_place_timeout: f64,

    /// muster: a rank that shows no progress for this many seconds is hung: every local rank's Python stack is
    /// captured, group rank 0 names the culprit, and `--on-hang` acts. Progress is a line matching
    /// `--progress-pattern`, a touch of `$MUSTER_PROGRESS_FILE`, or a torch file-timer request; a rank is
    /// judged from its first sign of progress on. Off by default.
    #[arg(long = "hang-timeout", env = "MUSTER_HANG_TIMEOUT", value_parser = non_negative_seconds,
          value_name = "SECONDS")]
    pub hang_timeout: Option<f64>,

    /// muster: a regular expression; a line of a worker's output (stdout or stderr) matching it is progress.
    /// The workers' output then goes through the agent's pipes; the console and the log files get exactly
    /// the same bytes.
    #[arg(long = "progress-pattern", env = "MUSTER_PROGRESS_PATTERN", value_name = "REGEX")]
    pub progress_pattern: Option<String>,

    /// muster: what a hang does after its stacks are captured: restart the group (spends a restart, as a
    /// worker failure does) or report it and keep the workers running.
    #[arg(long = "on-hang", env = "MUSTER_ON_HANG", value_parser = ["restart", "report"])]
    pub on_hang: Option<String>,

    /// muster: when a worker fails, capture the other local workers' Python stacks before they are stopped
    /// (into the attempt's `stacks/`), delaying the stop by at most 2 s.
    #[arg(long = "stacks-on-failure", env = "MUSTER_STACKS_ON_FAILURE", action = ArgAction::SetTrue,
          value_parser = pet_flag)]
    pub stacks_on_failure: bool,

    /// muster: serve Prometheus metrics (`/metrics`) and a health check (`/healthz`: 200 while running or
    /// re-forming, 503 when failing or draining) on this port; 0 lets the kernel pick one (the address is
    /// logged). Off by default.
    #[arg(long = "metrics-port", env = "MUSTER_METRICS_PORT", value_parser = port, value_name = "PORT")]
    pub metrics_port: Option<u16>,

    /// muster: the IP address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 for every interface).
    #[arg(long = "metrics-host", env = "MUSTER_METRICS_HOST", value_name = "ADDR")]
    pub metrics_host: Option<String>,

    /// muster: append every agent transition, GPU fault and recovery (with its phases) to this file, one JSON
    /// object per line with timestamp, run id, round, restart count and group rank.
    #[arg(long = "event-log", env = "MUSTER_EVENT_LOG", value_name = "PATH")]
    pub event_log: Option<String>,

    /// muster: the agent's own log lines as text or json (one object per line, with the run id, round, group
    /// rank and restart count).
    #[arg(long = "log-format", env = "MUSTER_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Print a shell completion script and exit (bash, zsh or tcsh).
    #[arg(long = "print-completion", alias = "print_completion", value_parser = ["bash", "zsh", "tcsh"])]
    pub print_completion: Option<String>,

    /// The training script (or module, or binary), then its arguments, passed through untouched.
    #[arg(value_name = "SCRIPT [ARGS]...", trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,

    /// The options the user gave (by field name), and how; the others have their defaults. A launch context
    /// (`context::fill`) fills only those not given.
    #[arg(skip)]
    pub given: std::collections::BTreeMap<String, Given>,
}

impl Cli {
    /// How the user gave the option whose field is `id` (None: it has its default).
    pub fn given(&self, id: &str) -> Option<Given> {
        self.given.get(id).copied()
    }
}

/// The launcher's command line (`args[0]` is the program name), read as torchrun's argparse reads it: a
/// repeated option takes its last value, an unknown or ambiguous option is an error naming it.
pub fn parse(args: &[String]) -> Result<Cli, clap::Error> {
    let mut cmd = Cli::command();
    cmd.build();
    let (program, rest) = args.split_first().map_or(("muster", &[][..]), |(p, r)| (p.as_str(), r));
    let normalized =
        argv::normalize(&cmd, rest).map_err(|e| cmd.error(clap::error::ErrorKind::UnknownArgument, e))?;
    let matches = cmd.try_get_matches_from(std::iter::once(program.to_string()).chain(normalized))?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    cli.given = matches
        .ids()
        .filter_map(|id| match matches.value_source(id.as_str()) {
            Some(clap::parser::ValueSource::CommandLine) => Some((id.to_string(), Given::Flag)),
            Some(clap::parser::ValueSource::EnvVariable) => Some((id.to_string(), Given::Env)),
            _ => None,
        })
        .collect();
    Ok(cli)
}

/// Parses the arguments of a tool subcommand (`muster NAME ARGS...`, `args` after NAME): the arguments, or
/// the exit code once clap has printed the help or version (0) or the one-line error (2).
pub fn parse_subcommand<T: Parser>(name: &str, args: &[String]) -> Result<T, u8> {
    T::try_parse_from(std::iter::once(format!("muster {name}")).chain(args.iter().cloned())).map_err(|e| {
        if e.use_stderr() {
            crate::errln!("muster {name}: error: {}", one_line(&e));
            crate::exit::USAGE
        } else {
            let _ = e.print();
            crate::exit::SUCCESS
        }
    })
}

/// `--print-completion SHELL`: the completion script for muster's command line (torchrun prints shtab's and
/// exits the same way, before looking at anything else).
pub fn completion_script(shell: &str) -> String {
    let mut cmd = Cli::command();
    let shell = match shell {
        "zsh" => clap_complete::Shell::Zsh,
        "tcsh" => return tcsh_completion(cmd),
        _ => clap_complete::Shell::Bash,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "muster", &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// tcsh has a `complete` builtin and no clap generator: every long option (both spellings) after `--`,
/// files otherwise.
fn tcsh_completion(mut cmd: clap::Command) -> String {
    cmd.build();
    let mut longs: Vec<&str> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| (l, a.get_all_aliases().unwrap_or_default())))
        .flat_map(|(l, aliases)| std::iter::once(l).chain(aliases))
        .collect();
    longs.sort_unstable();
    format!("complete muster 'c/--/({})/' 'p/*/f/'\n", longs.join(" "))
}

/// A command-line error reduced to one line that names the flag and what is valid.
pub fn one_line(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid command line");
    first.trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        super::parse(&std::iter::once("muster").chain(args.iter().copied()).map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn dash_and_underscore_spellings_are_the_same_option() {
        let a = parse(&["--nproc-per-node", "3", "x.py"]).unwrap();
        let b = parse(&["--nproc_per_node=3", "x.py"]).unwrap();
        assert_eq!(a.nproc_per_node, "3");
        assert_eq!(b.nproc_per_node, "3");
    }

    #[test]
    fn everything_after_the_script_goes_to_the_script() {
        let c = parse(&["--standalone", "train.py", "--standalone", "-m", "--lr", "0.1"]).unwrap();
        assert!(c.standalone);
        assert!(!c.module);
        assert_eq!(c.command, ["train.py", "--standalone", "-m", "--lr", "0.1"]);
    }

    #[test]
    fn unambiguous_prefixes_are_accepted() {
        let c = parse(&["--stand", "--nnod", "2", "x.py"]).unwrap();
        assert!(c.standalone);
        assert_eq!(c.nnodes, "2");
    }

    #[test]
    fn a_repeated_option_takes_the_last_value() {
        let c = parse(&[
            "--nproc-per-node", "2", "--nproc_per_node=3", "--standalone", "--standalone", "-r", "1", "--redirects=2",
            "--max-restarts=1", "--max_restarts", "4", "x.py",
        ])
        .unwrap();
        assert_eq!((c.nproc_per_node.as_str(), c.redirects.as_str(), c.max_restarts), ("3", "2", 4));
        assert!(c.standalone);
    }

    #[test]
    fn the_script_gets_its_arguments_after_argparse_double_dash_rule() {
        assert_eq!(parse(&["x.py", "--", "--", "a"]).unwrap().command, ["x.py", "--", "a"]);
        assert_eq!(parse(&["-m", "pkg.mod", "--", "--depth=24"]).unwrap().command, ["pkg.mod", "--depth=24"]);
        assert_eq!(parse(&["--", "x.py", "--", "a"]).unwrap().command, ["x.py", "--", "a"]);
    }

    #[test]
    fn help_and_version_are_reached_by_prefix_too() {
        for (args, kind) in [
            (&["--help"][..], clap::error::ErrorKind::DisplayHelp),
            (&["--he"][..], clap::error::ErrorKind::DisplayHelp),
            (&["-h", "x.py"][..], clap::error::ErrorKind::DisplayHelp),
            (&["--version"][..], clap::error::ErrorKind::DisplayVersion),
        ] {
            assert_eq!(parse(args).unwrap_err().kind(), kind, "{args:?}");
        }
    }

    #[test]
    fn launcher_errors_are_one_line() {
        let line = one_line(&parse(&["--frobnicate", "x.py"]).unwrap_err());
        assert!(line.starts_with("unrecognized arguments: --frobnicate"), "{line}");
    }

    #[test]
    fn negative_restarts_name_the_flag() {
        let e = parse(&["--max-restarts", "-1", "x.py"]).unwrap_err();
        let line = one_line(&e);
        assert!(line.contains("--max-restarts") && line.contains(">= 0"), "{line}");
    }

    #[test]
    fn completion_scripts_name_every_option() {
        for shell in ["bash", "zsh", "tcsh"] {
            let script = completion_script(shell);
            for option in ["--nproc-per-node", "--rdzv-endpoint", "--warm-spares", "--max-restarts"] {
                let bare = option.trim_start_matches("--");
                assert!(script.contains(option) || script.contains(&format!(" {bare} ")), "{shell}: {option}");
            }
        }
        assert!(completion_script("tcsh").contains(" nproc_per_node "), "underscore spellings too");
    }

    #[test]
    fn given_options_are_known_by_field_name() {
        let c = parse(&["--nnodes", "2", "--rdzv_id=x", "x.py"]).unwrap();
        assert_eq!(c.given("nnodes"), Some(Given::Flag));
        assert_eq!(c.given("rdzv_id"), Some(Given::Flag));
        assert_eq!(c.given("node_rank"), None);
        assert_eq!(c.given("standalone"), None);
    }

    #[test]
    fn pet_flag_follows_torchrun_int_semantics() {
        assert_eq!(pet_flag("1"), Ok(true));
        assert_eq!(pet_flag("0"), Ok(false));
        assert_eq!(pet_flag("2"), Ok(true));
        assert!(pet_flag("yes").is_err());
        assert_eq!(pet_flag("true"), Ok(true));
    }
}
