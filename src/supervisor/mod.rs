//! Worker processes: spawn, watch, stop. This is the one place that sends signals to workers
//! (design invariant 1), and the one file that says what happens when a worker dies:
//!
//! - exits are noticed when they happen (each child is awaited; no polling tick);
//! - a worker that exits 0 is done; the group has succeeded when every worker has;
//! - the first non-zero exit stops the siblings (SIGTERM to each worker's process group, the grace period,
//!   then SIGKILL), and every sibling that then exits non-zero is recorded too, as torchrun does;
//! - a forwarded signal stops the group the same way with that signal;
//! - after any stop, whatever is left in the workers' sessions (grandchildren) is SIGKILLed.
//!
//! Workers run in their own session with a parent-death signal of SIGKILL, and are spawned only from the
//! agent's main thread (the agent loop runs in `block_on` there), because the parent-death signal fires when
//! the *spawning thread* exits. `reaper.rs` covers the agent being killed outright.

pub mod env;
pub mod failure;
pub mod logs;
pub mod reaper;
pub mod spare;

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::{mpsc, oneshot};

use crate::config::Entrypoint;
use crate::template::safe_substitute;
pub use env::{GroupSpec, Placement};
use failure::ProcessFailure;
use logs::{AttemptLogs, Stream, StreamPlan, WorkerTag};
use reaper::{OrphanGuard, OWN_CHILDREN};
use spare::{WarmSpares, WorkerCommand};

/// How long the agent waits for tee pipes to drain after the workers are gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot start worker local_rank {local_rank} ({program}): {source}")]
    Spawn { local_rank: u32, program: String, source: std::io::Error },
    #[error(transparent)]
    Logs(#[from] logs::LogError),
    #[error("{0}")]
    Env(String),
}

/// How a worker group ended.
#[derive(Debug)]
pub enum GroupOutcome<M> {
    Succeeded,
    /// Failures in detection order (the root cause is chosen by timestamp).
    Failed(Vec<ProcessFailure>),
    /// A signal the agent handles arrived; it was forwarded and the group is stopped.
    Interrupted(Signal),
    /// The membership changed (a peer was lost, nodes joined, the job closed): the group is stopped.
    Changed(M),
}

#[derive(Debug)]
struct Worker {
    local_rank: u32,
    global_rank: u32,
    pid: i32,
    error_file: Option<PathBuf>,
    running: bool,
}

#[derive(Debug, Clone, Copy)]
struct Exit {
    index: usize,
    /// Exit code, or minus the signal number.
    code: i32,
    at: i64,
}

/// One start of the local worker group.
pub struct WorkerGroup {
    workers: Vec<Worker>,
    exits: mpsc::UnboundedReceiver<Exit>,
    pumps: Vec<oneshot::Receiver<()>>,
    guard: Arc<OrphanGuard>,
    binary: String,
    /// How each worker was started, for the warm spares of the next start.
    commands: Vec<WorkerCommand>,
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or_default()
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| -s)).unwrap_or(-1)
}

impl WorkerGroup {
    /// Starts `spec.local_world_size` workers, each from a warm spare that fits it when there is one (the
    /// other spares are killed), else cold. Must be called on the agent's main thread.
    pub fn start(
        spec: &GroupSpec,
        entry: &Entrypoint,
        attempt: &AttemptLogs,
        log_config: &crate::config::LogConfig,
        hostname: &str,
        guard: Arc<OrphanGuard>,
        spares: &mut WarmSpares,
    ) -> Result<WorkerGroup, SupervisorError> {
        debug_assert_eq!(nix::unistd::gettid(), nix::unistd::getpid(), "workers are spawned from the main thread");
        let (tx, exits) = mpsc::unbounded_channel();
        let mut group = WorkerGroup {
            workers: Vec::new(),
            exits,
            pumps: Vec::new(),
            guard,
            binary: entry.program.display().to_string(),
            commands: Vec::new(),
        };
        let parent_env = |k: &str| std::env::var(k).ok();
        let mut warm = 0;
        for local_rank in 0..spec.local_world_size {
            let error_file = attempt.error_file(local_rank);
            let env = env::worker_env(spec, local_rank, error_file.as_deref(), &parent_env)
                .map_err(SupervisorError::Env)?;
            let tag = WorkerTag { role: &spec.role, local_rank, global_rank: spec.global_rank(local_rank), hostname };
            let plans = [Stream::Out, Stream::Err].map(|s| attempt.plan(log_config, &tag, s));
            let [out, err] = plans;
            let (mut out, mut err) = (out?, err?);
            let args: Vec<String> = entry
                .args
                .iter()
                .map(|a| safe_substitute(a, &[("local_rank", &local_rank.to_string())]))
                .collect();
            let placement = spec.placements.get(local_rank as usize).cloned().unwrap_or_default();
            let cmd = WorkerCommand { program: entry.program.clone(), args, env, placement };
            let spawn_error = |source| SupervisorError::Spawn {
                local_rank,
                program: entry.program.display().to_string(),
                source,
            };
            let out_fd = out.child_fd(Stream::Out).map_err(spawn_error)?;
            let err_fd = err.child_fd(Stream::Err).map_err(spawn_error)?;
            // A spare gets the agent's stdin as a cold worker inherits it (or /dev/null when it has none).
            let stdin = || std::io::stdin().as_fd().try_clone_to_owned().or_else(|_| logs::dev_null()).ok();
            let from_spare = if spares.is_empty() {
                None
            } else {
                stdin().and_then(|stdin| spares.start(&cmd, [stdin.as_fd(), out_fd.as_fd(), err_fd.as_fd()]))
            };
            let mut child = match from_spare {
                Some(w) => {
                    warm += 1;
                    if !w.ready {
                        tracing::info!(local_rank, "warm spare still importing; the worker continues where it is");
                    }
                    w.child
                }
                None => spawn_worker(
                    &cmd.program,
                    &cmd.args,
                    &cmd.env,
                    &cmd.placement,
                    Stdio::inherit(),
                    Stdio::from(out_fd),
                    Stdio::from(err_fd),
                )
                .map_err(spawn_error)?,
            };
            group.commands.push(cmd);
            let pid = child.id().map(|p| p as i32).unwrap_or_default();
            group.guard.watch(pid);
            group.pumps.extend([out, err].into_iter().filter_map(StreamPlan::start_pump));
            let index = group.workers.len();
            let tx = tx.clone();
            tokio::spawn(async move {
                let code = match child.wait().await {
                    Ok(status) => exit_code(status),
                    Err(e) => {
                        tracing::error!(pid, "cannot wait for worker: {e}");
                        -1
                    }
                };
                if let Ok(mut own) = OWN_CHILDREN.lock() {
                    own.retain(|p| *p != pid);
                }
                let _ = tx.send(Exit { index, code, at: now_secs() });
            });
            tracing::debug!(local_rank, pid, "worker started");
            group.workers.push(Worker {
                local_rank,
                global_rank: spec.global_rank(local_rank),
                pid,
                error_file,
                running: true,
            });
        }
        spares.clear();
        if warm > 0 {
            tracing::info!("{warm} of {} worker(s) started from warm spares", spec.local_world_size);
        }
        Ok(group)
    }

    pub fn pids(&self) -> Vec<i32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    fn failure(&self, exit: Exit) -> ProcessFailure {
        let w = &self.workers[exit.index];
        tracing::warn!(
            "failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}",
            exit.code,
            w.local_rank,
            w.pid,
            self.binary
        );
        ProcessFailure::new(w.local_rank, w.global_rank, w.pid, exit.code, w.error_file.as_deref(), exit.at)
    }

    fn record(&mut self, exit: Exit) {
        self.workers[exit.index].running = false;
    }

    fn running(&self) -> usize {
        self.workers.iter().filter(|w| w.running).count()
    }

    /// Waits until the group succeeds, a worker fails, `interrupt` yields a signal or `membership`
    /// completes; in all but the first case the group is stopped before this returns. Meanwhile, after
    /// their delay, starts the warm spares for the next start.
    pub async fn wait<M>(
        &mut self,
        interrupt: &mut mpsc::UnboundedReceiver<Signal>,
        membership: impl std::future::Future<Output = M>,
        grace: Duration,
        spares: &mut WarmSpares,
    ) -> GroupOutcome<M> {
        tokio::pin!(membership);
        let spare_delay = spares.delay();
        let spares_due = tokio::time::sleep(spare_delay.unwrap_or_default());
        tokio::pin!(spares_due);
        let mut spares_started = spare_delay.is_none();
        loop {
            tokio::select! {
                _ = &mut spares_due, if !spares_started => {
                    spares_started = true;
                    // Still the main thread: the agent's future is polled by `block_on`.
                    spares.fill(&self.commands);
                }
                exit = self.exits.recv() => {
                    let Some(exit) = exit else { return GroupOutcome::Succeeded };
                    self.record(exit);
                    if exit.code == 0 {
                        if self.running() == 0 {
                            self.finish().await;
                            return GroupOutcome::Succeeded;
                        }
                        continue;
                    }
                    let mut failures = vec![self.failure(exit)];
                    for later in self.stop(Signal::SIGTERM, grace).await {
                        if later.code != 0 {
                            failures.push(self.failure(later));
                        }
                    }
                    return GroupOutcome::Failed(failures);
                }
                Some(sig) = interrupt.recv() => {
                    tracing::warn!("received {} death signal, shutting down workers", sig.as_str());
                    self.stop(sig, grace).await;
                    return GroupOutcome::Interrupted(sig);
                }
                change = &mut membership => {
                    self.stop(Signal::SIGTERM, grace).await;
                    return GroupOutcome::Changed(change);
                }
            }
        }
    }

    /// Sends `sig` to every running worker's process group, waits up to `grace` for all of them, SIGKILLs
    /// the rest, then sweeps their sessions. Returns the exits seen meanwhile.
    async fn stop(&mut self, sig: Signal, grace: Duration) -> Vec<Exit> {
        for w in self.workers.iter().filter(|w| w.running) {
            tracing::info!("sending process {} closing signal {}", w.pid, sig.as_str());
            let _ = killpg(Pid::from_raw(w.pid), sig);
        }
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + grace;
        while self.running() > 0 {
            match tokio::time::timeout_at(deadline, self.exits.recv()).await {
                Ok(Some(exit)) => {
                    self.record(exit);
                    seen.push(exit);
                }
                Ok(None) => break,
                Err(_) => {
                    for w in self.workers.iter().filter(|w| w.running) {
                        tracing::warn!("unable to shutdown process {} via {}, forcefully exiting via SIGKILL", w.pid, sig.as_str());
                        let _ = killpg(Pid::from_raw(w.pid), Signal::SIGKILL);
                    }
                    // SIGKILL cannot be ignored; this bound only guards against uninterruptible sleep.
                    while self.running() > 0 {
                        match tokio::time::timeout(Duration::from_secs(10), self.exits.recv()).await {
                            Ok(Some(exit)) => {
                                self.record(exit);
                                seen.push(exit);
                            }
                            _ => {
                                tracing::error!("workers did not exit after SIGKILL (uninterruptible kernel sleep?)");
                                break;
                            }
                        }
                    }
                    break;
                }
            }
        }
        self.finish().await;
        seen
    }

    /// Kills whatever is left in the workers' sessions and lets the tee pipes drain.
    async fn finish(&mut self) {
        let sessions: HashSet<i32> = self.workers.iter().map(|w| w.pid).collect();
        let killed = reaper::kill_sessions(&sessions, Some(std::process::id() as i32));
        if killed > 0 {
            tracing::info!(killed, "killed processes left behind in the workers' sessions");
        }
        for sid in &sessions {
            self.guard.forget(*sid);
        }
        let pumps = std::mem::take(&mut self.pumps);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            for p in pumps {
                let _ = p.await;
            }
        });
        if drained.await.is_err() {
            tracing::warn!("worker output pipes still open after {DRAIN_TIMEOUT:?}; continuing");
        }
    }
}

/// `set_mempolicy(2)` mode: prefer the node, fall back to others rather than fail an allocation.
const MPOL_PREFERRED: libc::c_int = 1;

/// Spawns one worker (or warm spare): its own session, SIGKILL when the agent dies, its CPU and memory
/// placement.
fn spawn_worker(
    program: &std::path::Path,
    args: &[String],
    env: &[(String, String)],
    placement: &Placement,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
) -> std::io::Result<tokio::process::Child> {
    let parent = nix::unistd::getpid();
    // Built before fork: the child only makes syscalls with them.
    let cpus = match &placement.cpus {
        Some(list) => {
            let mut set = nix::sched::CpuSet::new();
            for cpu in list {
                set.set(*cpu as usize).map_err(std::io::Error::from)?;
            }
            Some(set)
        }
        None => None,
    };
    let mem_mask: Option<[libc::c_ulong; 16]> = placement.mem_node.filter(|n| *n < 1024).map(|n| {
        let mut mask = [0 as libc::c_ulong; 16];
        mask[(n / 64) as usize] |= 1 << (n % 64);
        mask
    });
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(stdin).stdout(stdout).stderr(stderr);
    // SAFETY: only async-signal-safe calls (setsid, prctl, getppid, raise) run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)?;
            if nix::unistd::getppid() != parent {
                let _ = nix::sys::signal::raise(Signal::SIGKILL);
            }
            if let Some(set) = &cpus {
                nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).map_err(std::io::Error::from)?;
            }
            if let Some(mask) = &mem_mask {
                // SAFETY: the mask outlives the call; maxnode is the mask's size in bits.
                let rc = libc::syscall(libc::SYS_set_mempolicy, MPOL_PREFERRED, mask.as_ptr(), 1024 as libc::c_ulong);
                if rc != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut own = OWN_CHILDREN.lock().unwrap_or_else(|e| e.into_inner());
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        own.push(pid as i32);
    }
    Ok(child)
}
