//! The validated launch configuration: everything the agent needs, checked once, before anything starts.
//!
//! Pure apart from three lookups passed in or done at the edge (environment variables, the file system for the
//! script, NVML for `--nproc-per-node gpu|auto`), so every rule here is unit-tested. Each error names the flag
//! or value and what would be valid; the binary prints it as one line and exits 2 without starting a worker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cli::Cli;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

fn bad(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// The rendezvous keys torchrun 2.15 knows (reference §1.4).
pub const RDZV_CONF_KEYS: &[&str] = &[
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "cas_backoff_max_seconds",
    "read_timeout",
    "is_host",
    "store_type",
    "timeout",
    "protocol",
    "ssl_cert",
    "ssl_cert_key",
    "ca_cert",
    "etcd_prefix",
    "cacert",
    "cert",
    "key",
    // muster's own: how long a finished node waits for the others (torch hard-codes 300 s).
    "exit_barrier_timeout",
];

/// Signals muster can trap and forward.
const HANDLEABLE_SIGNALS: &[Signal] = &[
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Which of a worker's streams go to files (and, for tee, also to the console).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Std {
    pub out: bool,
    pub err: bool,
}

impl Std {
    fn from_digit(d: char) -> Option<Std> {
        let v = d.to_digit(10).filter(|v| *v <= 3)?;
        Some(Std { out: v & 1 != 0, err: v & 2 != 0 })
    }

    fn union(self, o: Std) -> Std {
        Std { out: self.out || o.out, err: self.err || o.err }
    }
}

/// `-r` / `-t` values: one mask for every rank, or a per-local-rank map (ranks missing from it get none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdSpec {
    All(Std),
    PerRank(BTreeMap<u32, Std>),
}

impl StdSpec {
    pub fn for_rank(&self, local_rank: u32) -> Std {
        match self {
            StdSpec::All(s) => *s,
            StdSpec::PerRank(m) => m.get(&local_rank).copied().unwrap_or_default(),
        }
    }

    fn parse(flag: &str, s: &str) -> Result<StdSpec, ConfigError> {
        let invalid = || {
            bad(format!(
                "invalid value '{s}' for '{flag}': use 0 (none), 1 (stdout), 2 (stderr), 3 (both), \
                 or a per-rank map like 0:1,1:3"
            ))
        };
        let s = s.trim();
        let mut chars = s.chars();
        if let (Some(d), None) = (chars.next(), chars.next()) {
            return Std::from_digit(d).map(StdSpec::All).ok_or_else(invalid);
        }
        // torchrun's regex allows one digit per rank only: ^(\d:[0123],)*(\d:[0123])$
        let mut map = BTreeMap::new();
        for item in s.split(',') {
            let b: Vec<char> = item.chars().collect();
            match b.as_slice() {
                [r, ':', m] if r.is_ascii_digit() => {
                    let std = Std::from_digit(*m).ok_or_else(invalid)?;
                    map.insert(r.to_digit(10).unwrap_or_default(), std);
                }
                _ => return Err(invalid()),
            }
        }
        Ok(StdSpec::PerRank(map))
    }
}

/// What the agent runs in each worker: `program args...` with `$local_rank` substituted in `args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entrypoint {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The user's arguments after the script (part of the launch fingerprint).
    pub script_args: Vec<String>,
    /// The name torchrun prints in the failure summary title.
    pub name: String,
}

/// How this node meets its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// c10d: muster's rendezvous store at `host:port`, hosted by the agent on that machine (`is_host`, or
    /// torch's heuristic when None); the group-rank-0 agent serves the workers' store on a port it binds and
    /// exports `MASTER_ADDR` = `local_addr`. `--standalone` is c10d on `localhost:0`.
    C10d { host: String, port: u16, is_host: Option<bool> },
    /// static: the store at `MASTER_ADDR:MASTER_PORT`, hosted by node rank 0 and shared with the workers;
    /// every node must be there (`--nnodes N`) and `--node-rank` is the group rank.
    Static { master_addr: String, master_port: u16 },
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    /// None: a fresh `torchelastic_*` temp directory. `/dev/null`: no files at all.
    pub log_dir: Option<PathBuf>,
    pub redirects: StdSpec,
    pub tee: StdSpec,
    pub prefix_template: Option<String>,
    pub local_ranks_filter: Option<BTreeSet<u32>>,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
}

impl LogConfig {
    /// Streams written to files for a rank (tee implies redirect).
    pub fn redirected(&self, local_rank: u32) -> Std {
        self.redirects.for_rank(local_rank).union(self.tee.for_rank(local_rank))
    }

    /// Whether this rank's output reaches the console at all.
    pub fn on_console(&self, local_rank: u32) -> bool {
        self.local_ranks_filter.as_ref().is_none_or(|f| f.contains(&local_rank))
    }

    pub fn files_disabled(&self) -> bool {
        self.log_dir.as_deref() == Some(Path::new("/dev/null"))
    }
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
    pub rdzv_conf: BTreeMap<String, String>,
    pub node_rank: u32,
    pub max_restarts: u32,
    pub role: String,
    pub entrypoint: Entrypoint,
    pub logs: LogConfig,
    pub signals: Vec<Signal>,
    /// The original `--signals-to-handle` text, exported to workers as torchrun does.
    pub signals_text: String,
    pub shutdown_timeout: Duration,
    pub virtual_local_rank: bool,
    pub event_log_console: bool,
    /// What each GPU fault does.
    pub gpu_policy: crate::gpu::xid::Policy,
    /// `--numa-binding` mode (torch's names).
    pub numa_binding: Option<String>,
    /// `--gpus`: the GPUs to use.
    pub gpus: Option<String>,
    /// The user's hook for a drained node.
    pub on_node_fault: Option<String>,
    pub gpu_wait_timeout: Duration,
    /// `--warm-spares`: None when off.
    pub warm_spares: Option<crate::supervisor::spare::WarmConfig>,
}

impl LaunchConfig {
    /// Whether the user asked for GPU placement explicitly (then an impossible one is an error; otherwise a
    /// job with more workers than GPUs, e.g. a CPU job on a GPU node, simply runs without placement).
    pub fn wants_gpu_placement(&self) -> bool {
        self.gpus.is_some() || self.numa_binding.is_some() || matches!(self.nproc_spec.as_str(), "gpu" | "auto")
    }

    /// The GPU placement for `excluded` GPUs (None: no NVML, no GPU, or not applicable to this job).
    pub fn placement(&self, nproc: u32, excluded: &BTreeSet<u32>) -> Result<Option<crate::gpu::topology::Plan>, ConfigError> {
        let plan = crate::gpu::placement::placement_for(
            nproc,
            self.numa_binding.as_deref(),
            self.gpus.as_deref(),
            excluded,
            self.virtual_local_rank,
        );
        match plan {
            Ok(None) if self.numa_binding.is_some() || self.gpus.is_some() => Err(bad(
                "'--numa-binding' and '--gpus' need NVIDIA GPUs, and NVML reports none on this node",
            )),
            Ok(plan) => Ok(plan),
            Err(e) if self.wants_gpu_placement() => Err(bad(e)),
            Err(e) => {
                tracing::info!("no GPU placement for this job: {e}");
                Ok(None)
            }
        }
    }

    /// Where agent events go (`--event-log-handler`).
    pub fn events(&self) -> crate::telemetry::Events {
        crate::telemetry::Events { console: self.event_log_console }
    }

    /// A `--rdzv-conf` duration in seconds, or the default (values were validated when parsed).
    pub fn conf_duration(&self, key: &str, default_secs: f64) -> Duration {
        let secs = self.rdzv_conf.get(key).and_then(|v| v.parse::<f64>().ok()).unwrap_or(default_secs);
        Duration::from_secs_f64(secs)
    }
}

/// The outside world `LaunchConfig::from_cli` consults, injectable for tests.
pub struct Host<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub gpu_count: &'a dyn Fn() -> Result<u32, String>,
    pub cpu_count: usize,
    pub fqdn: &'a dyn Fn() -> String,
}

pub fn parse_nnodes(s: &str) -> Result<(u32, u32), ConfigError> {
    let invalid = || bad(format!("invalid value '{s}' for '--nnodes': use N or MIN:MAX with 0 < MIN <= MAX"));
    let num = |x: &str| x.trim().parse::<u32>().map_err(|_| invalid());
    let (min, max) = match s.split(':').collect::<Vec<_>>().as_slice() {
        [n] => (num(n)?, num(n)?),
        [a, b] => (num(a)?, num(b)?),
        _ => return Err(invalid()),
    };
    if min == 0 || min > max {
        return Err(invalid());
    }
    Ok((min, max))
}

fn parse_nproc(s: &str, host: &Host) -> Result<u32, ConfigError> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i64>() {
        return match u32::try_from(n) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad(format!(
                "invalid value '{s}' for '--nproc-per-node': use an integer > 0, cpu, gpu or auto"
            ))),
        };
    }
    let cpus = u32::try_from(host.cpu_count.max(1)).unwrap_or(u32::MAX);
    match s {
        "cpu" => Ok(cpus),
        "gpu" => match (host.gpu_count)() {
            Ok(n) if n > 0 => Ok(n),
            Ok(_) => Err(bad("'--nproc-per-node gpu': NVML reports no GPU on this node; use an integer, cpu or auto")),
            Err(e) => Err(bad(format!("'--nproc-per-node gpu': {e}; use an integer, cpu or auto"))),
        },
        "auto" => Ok((host.gpu_count)().ok().filter(|n| *n > 0).unwrap_or(cpus)),
        _ => Err(bad(format!(
            "invalid value '{s}' for '--nproc-per-node': use an integer > 0, cpu, gpu or auto"
        ))),
    }
}

/// `k1=v1,k2=v2` as torchrun parses it: keys and values trimmed, a later duplicate wins.
pub fn parse_rdzv_conf(s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    if s.trim().is_empty() {
        return Ok(out);
    }
    for item in s.split(',') {
        let (k, v) = item.split_once('=').map(|(k, v)| (k.trim(), v.trim())).unwrap_or((item.trim(), ""));
        if k.is_empty() || v.is_empty() {
            return Err(bad(format!(
                "invalid value '{s}' for '--rdzv-conf': '{item}' is not key=value; use k1=v1,k2=v2 with keys {}",
                RDZV_CONF_KEYS.join(", ")
            )));
        }
        if !RDZV_CONF_KEYS.contains(&k) {
            return Err(bad(format!(
                "unknown key '{k}' in '--rdzv-conf'; known keys: {}",
                RDZV_CONF_KEYS.join(", ")
            )));
        }
        if k == "keep_alive_max_attempt" && !v.parse::<u32>().is_ok_and(|n| n > 0) {
            return Err(bad(format!("'--rdzv-conf {k}={v}': must be an integer > 0")));
        }
        if k.ends_with("_timeout") || k == "keep_alive_interval" {
            match v.parse::<f64>() {
                Ok(x) if x > 0.0 && x.is_finite() => {}
                _ => return Err(bad(format!("'--rdzv-conf {k}={v}': must be a number of seconds > 0"))),
            }
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// `--duplicate-*-filters`: comma-separated substrings, `,,` stands for a literal comma.
fn parse_filters(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                cur.push(',');
                chars.next();
            }
            (',', _) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.retain(|f| !f.is_empty());
    out
}

fn parse_ranks_filter(s: &str) -> Result<Option<BTreeSet<u32>>, ConfigError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    s.split(',')
        .map(|r| r.trim().parse::<u32>())
        .collect::<Result<BTreeSet<_>, _>>()
        .map(Some)
        .map_err(|_| bad(format!("invalid value '{s}' for '--local-ranks-filter': use comma-separated local ranks like 0,2")))
}

pub fn parse_signals(s: &str) -> Result<Vec<Signal>, ConfigError> {
    let valid = || HANDLEABLE_SIGNALS.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    s.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let full = if name.starts_with("SIG") { name.to_string() } else { format!("SIG{name}") };
            HANDLEABLE_SIGNALS
                .iter()
                .copied()
                .find(|sig| sig.as_str() == full)
                .ok_or_else(|| bad(format!("invalid signal '{name}' in '--signals-to-handle': use {}", valid())))
        })
        .collect()
}

/// Looks a program up the way execvp would: a name with a slash is a path, otherwise each `$PATH` entry.
pub fn find_program(name: &str, path_var: Option<&str>) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    path_var?
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// `--run-path`: runpy in the worker itself, wrapped by torch's `@record` when torch is importable so the
/// error file is written as torchrun's function entrypoint does.
const RUN_PATH_BOOTSTRAP: &str = "import runpy, sys\n\
sys.argv = sys.argv[1:]\n\
run = lambda: runpy.run_path(sys.argv[0], run_name='__main__')\n\
try:\n    from torch.distributed.elastic.multiprocessing.errors import record\n    run = record(run)\n\
except ImportError:\n    pass\n\
run()\n";

/// `--warm-spares MODULES`: dotted Python module names, for a Python entrypoint.
fn warm_spares(cli: &Cli) -> Result<Option<crate::supervisor::spare::WarmConfig>, ConfigError> {
    let Some(text) = cli.warm_spares.as_deref().filter(|t| !t.trim().is_empty()) else { return Ok(None) };
    if cli.no_python && !cli.run_path {
        return Err(bad("'--warm-spares' needs a Python entrypoint: with '--no-python' muster runs the program itself"));
    }
    let is_identifier = |p: &str| {
        p.chars().next().is_some_and(|c| c == '_' || c.is_alphabetic()) && p.chars().all(|c| c == '_' || c.is_alphanumeric())
    };
    let modules: Vec<String> = text.split(',').map(|m| m.trim().to_string()).collect();
    if let Some(m) = modules.iter().find(|m| !m.split('.').all(is_identifier)) {
        return Err(bad(format!(
            "'--warm-spares {text}': '{m}' is not a Python module name; give names like torch,torch.distributed"
        )));
    }
    Ok(Some(crate::supervisor::spare::WarmConfig { modules, delay: Duration::from_secs_f64(cli.warm_spares_delay) }))
}

fn entrypoint(cli: &Cli, host: &Host) -> Result<Entrypoint, ConfigError> {
    let Some((script, script_args)) = cli.command.split_first() else {
        return Err(bad("the training script is missing: muster [OPTIONS] SCRIPT [ARGS]..."));
    };
    if cli.module && cli.no_python && !cli.run_path {
        return Err(bad("'-m/--module' cannot be used with '--no-python': a module needs the Python interpreter"));
    }
    let path_var = (host.env)("PATH");
    if cli.no_python && !cli.run_path {
        let program = find_program(script, path_var.as_deref()).ok_or_else(|| {
            bad(format!(
                "'--no-python': '{script}' is not an executable file{}; give a path to an executable or a \
                 program on PATH",
                if script.contains('/') { "" } else { " on PATH" }
            ))
        })?;
        return Ok(Entrypoint {
            program,
            args: script_args.to_vec(),
            script_args: script_args.to_vec(),
            name: script.clone(),
        });
    }
    let python_exec = (host.env)("PYTHON_EXEC").filter(|p| !p.is_empty());
    let program = match &python_exec {
        Some(p) => find_program(p, path_var.as_deref())
            .ok_or_else(|| bad(format!("PYTHON_EXEC='{p}' is not an executable file")))?,
        None => ["python3", "python"]
            .iter()
            .find_map(|p| find_program(p, path_var.as_deref()))
            .ok_or_else(|| bad("no Python interpreter found: put python3 on PATH or set PYTHON_EXEC"))?,
    };
    if !cli.module && !Path::new(script).is_file() {
        return Err(bad(format!("training script '{script}' does not exist or is not a file")));
    }
    let mut args = vec!["-u".to_string()];
    if cli.run_path {
        args.extend(["-c".to_string(), RUN_PATH_BOOTSTRAP.to_string()]);
    } else if cli.module {
        args.push("-m".to_string());
    }
    args.push(script.clone());
    args.extend(script_args.iter().cloned());
    // torchrun names the interpreter itself when it is not the one torchrun runs under.
    let name = python_exec.unwrap_or_else(|| script.clone());
    Ok(Entrypoint { program, args, script_args: script_args.to_vec(), name })
}

/// Host and port of `--rdzv-endpoint` as torch's `parse_rendezvous_endpoint` splits them.
fn parse_endpoint(endpoint: &str) -> Result<(String, Option<u16>), ConfigError> {
    let e = endpoint.trim();
    let (host, port) = if e.starts_with('[') && e.ends_with(']') {
        (e, None)
    } else {
        match e.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && !h.ends_with(':') => (h, Some(p)),
            _ => (e, None),
        }
    };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| bad(format!("invalid port '{p}' in '--rdzv-endpoint {endpoint}': use 0..=65535")))
        })
        .transpose()?;
    Ok((host, port))
}

impl LaunchConfig {
    pub fn from_cli(cli: &Cli, host: &Host) -> Result<LaunchConfig, ConfigError> {
        let (min_nodes, max_nodes) = parse_nnodes(&cli.nnodes)?;
        let nproc_per_node = parse_nproc(&cli.nproc_per_node, host)?;
        let mut rdzv_conf = parse_rdzv_conf(&cli.rdzv_conf)?;
        let signals = parse_signals(&cli.signals_to_handle)?;
        let entrypoint = entrypoint(cli, host)?;

        if let Some(specs) = cli.logs_specs.as_deref().filter(|s| *s != "default") {
            return Err(bad(format!("invalid value '{specs}' for '--logs-specs': muster has only 'default'")));
        }

        // torchrun 2.15: --standalone, and the implicit standalone of a single-node static job with no
        // endpoint and no master port, both become c10d on localhost:0 with a fresh run id.
        let implicit_standalone = !cli.standalone
            && cli.rdzv_backend == "static"
            && cli.rdzv_endpoint.is_empty()
            && cli.master_port.is_none()
            && max_nodes == 1;
        let standalone = cli.standalone || implicit_standalone;
        let (backend, endpoint, run_id) = if standalone {
            ("c10d".to_string(), "localhost:0".to_string(), uuid::Uuid::new_v4().to_string())
        } else {
            (cli.rdzv_backend.clone(), cli.rdzv_endpoint.clone(), cli.rdzv_id.clone())
        };

        let rendezvous = match backend.as_str() {
            "static" => {
                if cli.node_rank >= max_nodes {
                    return Err(bad(format!(
                        "invalid value '{}' for '--node-rank': must be < --nnodes ({max_nodes})",
                        cli.node_rank
                    )));
                }
                let (addr, port) = if cli.rdzv_endpoint.is_empty() {
                    (cli.master_addr.clone(), cli.master_port.or(Some(29500)))
                } else {
                    parse_endpoint(&cli.rdzv_endpoint)?
                };
                let master_port = port.ok_or_else(|| {
                    bad(format!("'--rdzv-endpoint {}': the static backend needs host:port", cli.rdzv_endpoint))
                })?;
                rdzv_conf.insert("rank".to_string(), cli.node_rank.to_string());
                let master_addr = addr.trim_start_matches('[').trim_end_matches(']').to_string();
                Rendezvous::Static { master_addr, master_port }
            }
            "c10d" => {
                let (h, port) = parse_endpoint(&endpoint)?;
                let is_host = match rdzv_conf.get("is_host").map(|v| v.to_ascii_lowercase()) {
                    None => None,
                    Some(v) if ["1", "true", "t", "yes", "y"].contains(&v.as_str()) => Some(true),
                    Some(v) if ["0", "false", "f", "no", "n"].contains(&v.as_str()) => Some(false),
                    Some(v) => return Err(bad(format!("'--rdzv-conf is_host={v}': use true or false"))),
                };
                let host = if h.is_empty() { "localhost".to_string() } else { h };
                let is_host = if standalone { Some(true) } else { is_host };
                Rendezvous::C10d { host, port: port.unwrap_or(29400), is_host }
            }
            "etcd" | "etcd-v2" => {
                return Err(bad(format!(
                    "'--rdzv-backend {backend}' is not available in this muster version yet; use c10d or static"
                )))
            }
            other => {
                return Err(bad(format!(
                    "invalid value '{other}' for '--rdzv-backend': use static, c10d, etcd or etcd-v2"
                )))
            }
        };
        if cli.node_rank != 0 && backend != "static" {
            tracing::warn!("--node-rank is only used by the static rendezvous backend; ignoring it");
        }
        rdzv_conf.entry("timeout".to_string()).or_insert_with(|| "900".to_string());

        let shutdown_timeout = match cli.shutdown_timeout {
            Some(s) => s,
            None => match (host.env)("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
                Some(v) => v.trim().parse::<u32>().map_err(|_| {
                    bad(format!("TORCH_ELASTIC_SHUTDOWN_TIMEOUT='{v}': must be an integer number of seconds >= 0"))
                })?,
                None => 30,
            },
        };

        let logs = LogConfig {
            log_dir: cli.log_dir.as_deref().filter(|d| !d.is_empty()).map(PathBuf::from),
            redirects: StdSpec::parse("--redirects", &cli.redirects)?,
            tee: StdSpec::parse("--tee", &cli.tee)?,
            prefix_template: cli
                .log_line_prefix_template
                .clone()
                .or_else(|| (host.env)("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
                .filter(|t| !t.is_empty()),
            local_ranks_filter: parse_ranks_filter(&cli.local_ranks_filter)?,
            duplicate_stdout_filters: parse_filters(&cli.duplicate_stdout_filters),
            duplicate_stderr_filters: parse_filters(&cli.duplicate_stderr_filters),
        };
        if let Some(dir) = logs.log_dir.as_deref().filter(|_| !logs.files_disabled()) {
            if dir.exists() && !dir.is_dir() {
                return Err(bad(format!("'--log-dir {}' is a file, not a directory", dir.display())));
            }
        }

        Ok(LaunchConfig {
            min_nodes,
            max_nodes,
            nproc_per_node,
            rdzv_backend: backend,
            rendezvous,
            local_addr: cli.local_addr.clone().unwrap_or_else(|| (host.fqdn)()),
            nproc_spec: cli.nproc_per_node.trim().to_string(),
            run_id,
            rdzv_conf,
            node_rank: cli.node_rank,
            max_restarts: cli.max_restarts,
            role: cli.role.clone(),
            entrypoint,
            logs,
            signals,
            signals_text: cli.signals_to_handle.clone(),
            shutdown_timeout: Duration::from_secs(u64::from(shutdown_timeout)),
            virtual_local_rank: cli.virtual_local_rank,
            event_log_console: cli.event_log_handler == "console",
            gpu_policy: crate::gpu::xid::Policy::parse(&cli.on_gpu_fault, &cli.xid_policy)
                .map_err(|e| bad(e.to_string()))?,
            on_node_fault: cli.on_node_fault.clone().filter(|c| !c.trim().is_empty()),
            numa_binding: cli.numa_binding.clone(),
            gpus: cli.gpus.clone().filter(|g| !g.trim().is_empty()),
            gpu_wait_timeout: Duration::from_secs(u64::from(cli.gpu_wait_timeout)),
            warm_spares: warm_spares(cli)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn host_env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| match k {
            "PATH" => std::env::var("PATH").ok(),
            _ => vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
        }
    }

    fn config(args: &[&str]) -> Result<LaunchConfig, ConfigError> {
        let env = host_env(&[]);
        let host = Host { env: &env, gpu_count: &|| Err("no driver".into()), cpu_count: 4, fqdn: &|| "node0".into() };
        let cli = Cli::try_parse_from(std::iter::once("muster").chain(args.iter().copied())).unwrap();
        LaunchConfig::from_cli(&cli, &host)
    }

    #[test]
    fn nnodes_forms() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
        for bad in ["0", "3:2", "a", "1:2:3", "", "0:1"] {
            assert!(parse_nnodes(bad).unwrap_err().to_string().contains("--nnodes"), "{bad}");
        }
    }

    #[test]
    fn std_specs_follow_torchrun() {
        assert_eq!(StdSpec::parse("-r", "3").unwrap(), StdSpec::All(Std { out: true, err: true }));
        let m = StdSpec::parse("-t", "0:1,1:2").unwrap();
        assert_eq!(m.for_rank(0), Std { out: true, err: false });
        assert_eq!(m.for_rank(1), Std { out: false, err: true });
        assert_eq!(m.for_rank(2), Std::default());
        for bad in ["4", "10:1", "0:4", "0:1,", "x"] {
            assert!(StdSpec::parse("-t", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rdzv_conf_parses_and_names_known_keys() {
        let c = parse_rdzv_conf(" join_timeout = 5 ,is_host=1,join_timeout=7").unwrap();
        assert_eq!(c["join_timeout"], "7");
        let e = parse_rdzv_conf("foo").unwrap_err().to_string();
        assert!(e.contains("--rdzv-conf") && e.contains("join_timeout"), "{e}");
        assert!(parse_rdzv_conf("bogus=1").unwrap_err().to_string().contains("known keys"));
        assert!(parse_rdzv_conf("read_timeout=0").is_err());
    }

    #[test]
    fn filters_unescape_double_commas() {
        assert_eq!(parse_filters("a,b,,c,"), ["a", "b,c"]);
        assert!(parse_filters("").is_empty());
    }

    #[test]
    fn signals_are_validated() {
        assert_eq!(parse_signals("SIGTERM, USR1").unwrap(), [Signal::SIGTERM, Signal::SIGUSR1]);
        assert!(parse_signals("SIGKILL").unwrap_err().to_string().contains("SIGUSR2"));
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
            (&["--rdzv-backend", "etcd", "--rdzv-endpoint", "h:1", "/bin/true"], "etcd"),
            (&[], "script is missing"),
        ];
        for (args, needle) in cases {
            let e = config(args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }

    #[test]
    fn nproc_auto_falls_back_to_cpus() {
        let c = config(&["--nproc-per-node", "auto", "--no-python", "true"]).unwrap();
        assert_eq!(c.nproc_per_node, 4);
    }
}
