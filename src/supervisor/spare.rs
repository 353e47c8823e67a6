//! Warm spares (`--warm-spares MODULES`): the next start of the worker group without starting Python.
//!
//! Most of a restart is each new worker starting its interpreter and importing torch (1.5 s on a small
//! machine, tens of seconds from a network file system). With warm spares, once a start's workers have run
//! for `--warm-spares-delay`, the supervisor starts one spare per local rank: the worker's own interpreter
//! with the worker's arguments, environment and placement, running `spare.py`, which imports MODULES and
//! waits. The next start hands each spare that fits its new worker the worker's environment and standard
//! streams over a Unix socket (the descriptors as SCM_RIGHTS), and the spare becomes the worker with
//! `python -u ARGS` semantics (sys.argv, sys.path[0], `__main__`).
//!
//! A spare fits a worker when it was started with the same program, arguments, placement and environment
//! apart from the per-start variables (`env::PER_START`), so whatever its imports read from the environment
//! (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES, ...) is what the worker would have read. Every other spare is
//! killed and that worker starts cold, as does a worker whose spare died or did not take the hand-over.
//! Spares are session leaders in the job cgroup with the workers' parent-death signal and are known to the
//! orphan guard, so they never outlive the agent.

use std::collections::BTreeMap;
use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::env::{Placement, PER_START, WITHHELD};
use super::children;
use super::guard::OrphanGuard;
use crate::config::WarmConfig;

/// What a spare runs: `python -u -c BOOTSTRAP MODULES ARGS...`.
const BOOTSTRAP: &str = include_str!("spare.py");
/// `=1` in a spare's initial environment, so a tool that reads it (the fake NVML) can tell a spare, which has no
/// CUDA context yet. spare.py removes it from `os.environ` before it becomes the worker; `/proc/<pid>/environ`,
/// the initial environment, keeps showing it after the hand-over.
pub const SPARE_VAR: &str = "MUSTER_WARM_SPARE";
/// Bound on the hand-over write; the payload (the environment) fits the socket buffer even when the spare
/// is still importing and not reading yet.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(1);

/// How one worker is started: the command for a cold start, and what its spare must match.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// The contract's variables, on top of the agent's own environment.
    pub env: Vec<(String, String)>,
    pub placement: Placement,
}

impl WorkerCommand {
    /// The whole environment the worker sees; None when the agent's own environment is not all UTF-8 (it
    /// could not be handed over as JSON, so such a job starts cold).
    fn full_env(&self) -> Option<BTreeMap<String, String>> {
        let mut all = BTreeMap::new();
        for (k, v) in std::env::vars_os() {
            all.insert(k.into_string().ok()?, v.into_string().ok()?);
        }
        all.retain(|k, _| !WITHHELD.contains(&k.as_str()));
        all.extend(self.env.iter().cloned());
        Some(all)
    }

    fn fit(&self, full_env: &BTreeMap<String, String>) -> Fit {
        let mut env = full_env.clone();
        env.retain(|k, _| !PER_START.contains(&k.as_str()));
        Fit { program: self.program.clone(), args: self.args.clone(), placement: self.placement.clone(), env }
    }
}

/// Everything a spare shares with the worker it becomes.
#[derive(Debug, PartialEq)]
struct Fit {
    program: PathBuf,
    args: Vec<String>,
    placement: Placement,
    env: BTreeMap<String, String>,
}

struct Spare {
    child: tokio::process::Child,
    pid: i32,
    ctrl: UnixStream,
    fit: Fit,
}

/// A worker started from a spare.
pub struct Warm {
    pub child: tokio::process::Child,
    /// Whether the spare had finished its imports.
    pub ready: bool,
}

/// The idle spares of this agent. Dropping it kills them.
pub struct WarmSpares {
    config: Option<WarmConfig>,
    idle: Vec<Spare>,
    guard: Arc<OrphanGuard>,
    /// Whether another start of the group can come (the agent knows: restarts left, or peers that can change).
    next_start_possible: bool,
}

impl WarmSpares {
    pub fn new(config: Option<WarmConfig>, guard: Arc<OrphanGuard>) -> WarmSpares {
        WarmSpares { config, idle: Vec::new(), guard, next_start_possible: true }
    }

    /// Says whether the group can start again after the current start; spares are only started if so.
    pub fn set_next_start_possible(&mut self, possible: bool) {
        self.next_start_possible = possible;
    }

    /// How long after a start the spares for the next one are started; None when none will be.
    pub fn delay(&self) -> Option<Duration> {
        self.config.as_ref().filter(|_| self.next_start_possible).map(|c| c.delay)
    }

    /// Starts one spare for each of `commands` (the workers of the current start). Must be called on the
    /// agent's main thread, as for workers.
    pub fn fill(&mut self, commands: &[WorkerCommand]) {
        let Some(config) = &self.config else { return };
        let modules = config.modules.join(",");
        let mut started = 0;
        for cmd in commands {
            // Only an interpreter run as `python -u ARGS` can be warmed (config.rs refuses the rest).
            let (Some(rest), Some(full_env)) = (cmd.args.strip_prefix(&["-u".to_string()]), cmd.full_env()) else {
                continue;
            };
            let mut args = vec!["-u".to_string(), "-c".to_string(), BOOTSTRAP.to_string(), modules.clone()];
            args.extend(rest.iter().cloned());
            let mut env = cmd.env.clone();
            env.push((SPARE_VAR.to_string(), "1".to_string()));
            let spawned = UnixStream::pair().and_then(|(ours, theirs)| {
                let stdin = Stdio::from(OwnedFd::from(theirs));
                let stdio = [stdin, Stdio::null(), Stdio::inherit()];
                let procs = self.guard.cgroup_procs();
                super::spawn_worker(&cmd.program, &args, &env, &cmd.placement, stdio, procs).map(|child| (child, ours))
            });
            match spawned {
                Ok((child, ctrl)) => {
                    // Only a child already reaped has no pid: nothing to keep.
                    let Some(pid) = child.id().map(|p| p as i32) else { continue };
                    self.guard.watch(pid);
                    self.idle.push(Spare { child, pid, ctrl, fit: cmd.fit(&full_env) });
                    started += 1;
                }
                Err(e) => tracing::warn!("cannot start a warm spare ({e}); the next start of this worker is cold"),
            }
        }
        if started > 0 {
            tracing::info!("started {started} warm spare(s) importing {modules}");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.idle.is_empty()
    }

    /// Starts the worker `cmd` from a spare that fits it, handing it `stdio` (stdin, stdout, stderr); None
    /// when no spare fits or the hand-over failed (the spare is then killed), so the caller starts it cold.
    pub fn start(&mut self, cmd: &WorkerCommand, stdio: [BorrowedFd<'_>; 3]) -> Option<Warm> {
        let full_env = cmd.full_env()?;
        let fit = cmd.fit(&full_env);
        let index = self.idle.iter().position(|s| s.fit == fit)?;
        let mut spare = self.idle.swap_remove(index);
        match hand_over(&mut spare, &full_env, stdio) {
            Ok(ready) => {
                tracing::debug!(pid = spare.pid, ready, "worker started from a warm spare");
                Some(Warm { child: spare.child, ready })
            }
            Err(e) => {
                tracing::warn!("warm spare {} could not take over ({e}); starting the worker cold", spare.pid);
                self.kill(spare);
                None
            }
        }
    }

    /// Kills every idle spare (none fits what comes next).
    pub fn clear(&mut self) {
        for spare in std::mem::take(&mut self.idle) {
            self.kill(spare);
        }
    }

    fn kill(&self, spare: Spare) {
        let _ = children::signal_group(spare.pid, Signal::SIGKILL);
        self.guard.forget(spare.pid);
        // The status is tokio's to reap (the dropped child goes to its orphan queue) or the adopted-zombie
        // reaper's; either is fine for a process nobody waits for.
        children::disown(spare.pid);
    }
}

impl Drop for WarmSpares {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Sends the spare its worker's environment and descriptors. Returns whether it had finished importing.
fn hand_over(spare: &mut Spare, env: &BTreeMap<String, String>, stdio: [BorrowedFd<'_>; 3]) -> std::io::Result<bool> {
    if let Ok(Some(status)) = spare.child.try_wait() {
        return Err(std::io::Error::other(format!("it exited: {status}")));
    }
    spare.ctrl.set_nonblocking(true)?;
    let mut byte = [0u8; 1];
    let ready = match spare.ctrl.read(&mut byte) {
        Ok(1) => true,
        Ok(_) => return Err(std::io::Error::other("it closed its socket")),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => return Err(e),
    };
    spare.ctrl.set_nonblocking(false)?;
    spare.ctrl.set_write_timeout(Some(HANDOVER_TIMEOUT))?;
    let json = serde_json::to_vec(env).map_err(std::io::Error::other)?;
    // Length-prefixed, so the spare never reads to end-of-file (see spare.py).
    let mut payload = (json.len() as u64).to_be_bytes().to_vec();
    payload.extend_from_slice(&json);
    let fds = stdio.map(|f| f.as_raw_fd());
    let sent = sendmsg::<()>(
        spare.ctrl.as_raw_fd(),
        &[IoSlice::new(&payload)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)?;
    spare.ctrl.write_all(&payload[sent..])?;
    spare.ctrl.shutdown(std::net::Shutdown::Write)?;
    Ok(ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(vars: &[(&str, &str)], cpus: Option<Vec<u32>>) -> WorkerCommand {
        WorkerCommand {
            program: PathBuf::from("/usr/bin/python3"),
            args: vec!["-u".into(), "train.py".into()],
            env: vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            placement: Placement { cpus, ..Placement::default() },
        }
    }

    fn fit(c: &WorkerCommand) -> Fit {
        c.fit(&c.full_env().expect("the test environment is UTF-8"))
    }

    #[test]
    fn a_spare_fits_the_next_start_whatever_its_per_start_values() {
        let now = command(&[("RANK", "4"), ("WORLD_SIZE", "8"), ("MASTER_PORT", "1"), ("LOCAL_RANK", "0")], None);
        let next = command(&[("RANK", "0"), ("WORLD_SIZE", "4"), ("MASTER_PORT", "2"), ("LOCAL_RANK", "0")], None);
        assert_eq!(fit(&now), fit(&next));
    }

    #[test]
    fn anything_else_that_differs_means_a_cold_start() {
        let base = command(&[("LOCAL_RANK", "0"), ("CUDA_VISIBLE_DEVICES", "0,1")], Some(vec![0, 1]));
        let other_rank = command(&[("LOCAL_RANK", "1"), ("CUDA_VISIBLE_DEVICES", "0,1")], Some(vec![0, 1]));
        let gpu_excluded = command(&[("LOCAL_RANK", "0"), ("CUDA_VISIBLE_DEVICES", "1")], Some(vec![0, 1]));
        let other_cpus = command(&[("LOCAL_RANK", "0"), ("CUDA_VISIBLE_DEVICES", "0,1")], Some(vec![2, 3]));
        let mut other_args = base.clone();
        other_args.args.push("--resume".into());
        for other in [other_rank, gpu_excluded, other_cpus, other_args] {
            assert_ne!(fit(&base), fit(&other), "{other:?}");
        }
    }
}
