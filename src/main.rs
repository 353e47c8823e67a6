//! The `muster` binary: parse, set up telemetry, run the agent, map the outcome to an exit code.
//!
//! Exit codes: `muster::exit` (docs/exit-codes.md).

use std::process::ExitCode;
use std::sync::Arc;

use muster::agent::{self, Outcome};
use muster::cli;
use muster::exit;
use muster::config::{Host, LaunchConfig};
use muster::supervisor::failure;
use muster::supervisor::guard::{GuardError, OrphanGuard};
use muster::runtime::{self, Threads};
use muster::tools::{self, ToolError};

fn main() -> ExitCode {
    ExitCode::from(tools::finish("muster", run()))
}

/// A line of bad input: nothing was started.
fn usage(e: impl std::fmt::Display) -> ToolError {
    ToolError::Usage(e.to_string())
}

/// This invocation's exit code (`muster::exit`), or how it failed before the agent ran.
fn run() -> Result<u8, ToolError> {
    // std::env::args() panics on an argument that is not UTF-8: that is bad input like any other.
    let args: Vec<String> = match std::env::args_os().map(|a| a.into_string()).collect() {
        Ok(args) => args,
        Err(bad) => return Err(usage(format_args!("argument {bad:?} is not valid UTF-8; muster takes UTF-8 arguments only"))),
    };
    // Before any thread or child exists, so the stores, the orphan guard and the tools all see it.
    muster::limits::raise_open_files();
    if let Some(code) = args.get(1).and_then(|name| tools::dispatch(name, &args[2..])) {
        return Ok(code);
    }
    let cli = match cli::parse(&args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return Ok(exit::SUCCESS);
        }
        Err(e) => return Err(usage(cli::one_line(&e))),
    };
    if let Some(shell) = &cli.print_completion {
        muster::out!("{}", cli::completion_script(shell));
        return Ok(exit::SUCCESS);
    }
    // Forked before any thread exists (NVML, loaded by the checks below, may start threads of its own); see
    // supervisor/guard.rs. On bad input it simply exits with the agent: no worker has started.
    let guard = match OrphanGuard::start() {
        Ok(g) => Arc::new(g),
        Err(e @ GuardError::BadSetting(_)) => return Err(usage(e)),
        Err(e) => return Err(ToolError::Failed(format!("error: {e}"))),
    };
    muster::telemetry::init_as(muster::telemetry::LogFormat::from_flag(&cli.log_format));
    let (cfg, gpu_job, sinks) = checked(&cli).map_err(usage)?;
    // From here on a failed write to the console is said once, in the agent's log and the event log.
    sinks.events.record_console_loss(&cfg.run_id);
    let runtime = runtime::build(Threads::PerCore)
        .map_err(|e| ToolError::Failed(format!("error: cannot start the async runtime: {e}")))?;
    // block_on polls the agent on this (main) thread, which is where workers must be spawned from.
    let outcome = runtime.block_on(agent::run(cfg, guard.clone(), gpu_job, sinks));
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    // Whatever the workers left running (a daemon in a session of its own, too) ends before the agent does.
    guard.end();
    // Tee'd lines still queued for a console that is behind; bounded, so a stalled console cannot hold the exit.
    muster::supervisor::logs::flush_console();
    say_how_it_ended(&outcome);
    Ok(exit::of::of_outcome(&outcome))
}

/// Every check of the command line before anything starts: the configuration, the first GPU placement (a
/// possible one makes this a GPU job: later placements must succeed too), the metrics port and event log.
fn checked(cli: &cli::Cli) -> Result<(LaunchConfig, bool, muster::observe::Sinks), String> {
    let env = |k: &str| std::env::var(k).ok();
    let gpu_count = || muster::gpu::device_count().map_err(|e| e.to_string());
    let host = Host {
        env: &env,
        gpu_count: &gpu_count,
        cpu_count: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        fqdn: &muster::host::fqdn,
    };
    let cfg = LaunchConfig::from_cli(cli, &host).map_err(|e| e.to_string())?;
    let gpu_job = cfg.placement(cfg.nproc_per_node, &Default::default()).map_err(|e| e.to_string())?.is_some();
    let sinks = muster::observe::open(&cfg.observe, &cfg.run_id, cfg.max_restarts).map_err(|e| e.to_string())?;
    Ok((cfg, gpu_job, sinks))
}

/// The agent's last words: the drain, the failure summary, or the error.
fn say_how_it_ended(outcome: &Result<Outcome, muster::agent::AgentError>) {
    match outcome {
        Ok(Outcome::Succeeded | Outcome::Interrupted(_)) => {}
        Ok(Outcome::Drained(fault)) => muster::errln!(
            "muster: node drained: {} on GPU {} ({}, {}); exiting with {} (node unhealthy)",
            fault.kind,
            fault.gpu.index,
            fault.gpu.uuid,
            fault.gpu.pci_bus_id,
            exit::NODE_UNHEALTHY
        ),
        Ok(Outcome::Failed { name, failures }) => {
            muster::errln!("{}", failure::summary(name, failures, &muster::host::fqdn()));
            if let (Some(root), Some(dest)) =
                (failure::root_cause(failures), std::env::var_os("TORCHELASTIC_ERROR_FILE"))
            {
                if let Err(e) = failure::copy_to_agent_error_file(root, std::path::Path::new(&dest)) {
                    muster::errln!("muster: cannot write TORCHELASTIC_ERROR_FILE {}: {e}", dest.to_string_lossy());
                }
            }
        }
        Err(e) => muster::errln!("muster: error: {e}"),
    }
}
