//! What each worker runs: the interpreter (or `--no-python` program), its arguments, and `--warm-spares`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{bad, ConfigError, Host};
use crate::cli::Cli;

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
pub(super) fn warm_spares(cli: &Cli) -> Result<Option<WarmConfig>, ConfigError> {
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
    Ok(Some(WarmConfig { modules, delay: Duration::from_secs_f64(cli.warm_spares_delay) }))
}

/// `--warm-spares` and `--warm-spares-delay`: the modules each spare imports, and how long after a start the
/// spares are started.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmConfig {
    pub modules: Vec<String>,
    pub delay: Duration,
}

pub(super) fn resolve(cli: &Cli, host: &Host) -> Result<Entrypoint, ConfigError> {
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
