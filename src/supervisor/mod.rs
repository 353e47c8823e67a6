//! Worker processes: spawn, watch, stop. Every signal goes through `children.rs`, the one place that
//! signals the job's processes (invariant 1). What a death *means* (restart, re-form, give up) is `agent/worker.rs`'s decision; this
//! file notices it and carries out the stop:
//!
//! - exits are noticed when they happen (each child is awaited; no polling tick);
//! - a worker that exits 0 is done; the group has succeeded when every worker has;
//! - the first non-zero exit stops the siblings (SIGTERM to each worker's process group, the grace period,
//!   then SIGKILL), and every sibling that then exits non-zero is recorded too, as torchrun does;
//! - a forwarded signal stops the group the same way with that signal;
//! - after any stop, whatever the workers left (grandchildren, daemons in sessions of their own) is SIGKILLed.
//!
//! Workers run in their own session with a parent-death signal of SIGKILL, and are spawned only from the
//! agent's main thread (the agent loop runs in `block_on` there), because the parent-death signal fires when
//! the *spawning thread* exits. Where the job has a cgroup (`cgroup.rs`), each joins it before exec.
//! `guard.rs` covers the agent being killed outright; `reaper.rs` reaps what it adopts.

pub mod cgroup;
pub mod children;
pub mod env;
pub mod failure;
pub mod guard;
pub mod hook;
pub mod keep;
pub mod logs;
pub mod proctree;
pub mod reaper;
pub mod spare;
pub mod timer;

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::config::Entrypoint;
use crate::template::safe_substitute;
pub use env::{GroupSpec, Placement};
use failure::ProcessFailure;
use logs::{AttemptLogs, Stream, StreamPlan, WorkerTag};
use guard::OrphanGuard;
use spare::{WarmSpares, WorkerCommand};

/// How long the agent waits for tee pipes to drain after the workers are gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// SIGKILL cannot be ignored; this bound only guards against uninterruptible sleep.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    #[error("cannot start worker local_rank {local_rank} ({program}): {source}")]
    Spawn { local_rank: u32, program: String, source: std::io::Error },
    #[error("worker local_rank {local_rank} ({program}) exited before its pid could be read; not starting the group")]
    NoPid { local_rank: u32, program: String },
    #[error(transparent)]
    Logs(#[from] logs::LogError),
    #[error(transparent)]
    Timer(#[from] timer::TimerError),
    #[error("{0}")]
    Env(String),
}

/// What `WorkerGroup::watch` saw.
#[derive(Debug)]
pub enum Watch {
    /// Every worker exited 0 and their output is drained.
    Succeeded,
    /// The first non-zero exit; the other workers may still run (`stop` them).
    Failed(ProcessFailure),
}

#[derive(Debug)]
struct Worker {
    local_rank: u32,
    global_rank: u32,
    pid: i32,
    error_file: Option<PathBuf>,
    running: bool,
    /// A stop signalled it: its death by a signal is that stop's doing, not a failure.
    signalled: bool,
    /// Its output pumps, done once its pipes are drained.
    pumps: Vec<oneshot::Receiver<()>>,
    /// Whether what it left (its session) has been swept.
    swept: bool,
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
    /// For the workers started into the group later (in place, `keep.rs`).
    exit_tx: mpsc::UnboundedSender<Exit>,
    guard: Arc<OrphanGuard>,
    binary: String,
    /// How each worker was started, for the warm spares of the next start.
    commands: Vec<WorkerCommand>,
    /// When the warm spares for the next start are due (fixed at start); None once started, or if none will be.
    spares_due: Option<Instant>,
    /// Non-zero exits in detection order; the first `reported` of them were returned by `watch` or `stop`.
    failed: Vec<Exit>,
    reported: usize,
    timer: Option<timer::FileTimer>,
    /// When the first stop of this group sends SIGKILL.
    stop_deadline: Option<Instant>,
    /// What the stop under way is for (`the re-formation`), said of each worker it ends.
    stopping_for: Option<&'static str>,
}

fn now_secs() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or_default()
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| -s)).unwrap_or(-1)
}

/// What `start` needs besides the spec, the same for every worker of one start.
struct StartContext<'a> {
    spec: &'a GroupSpec,
    entry: &'a Entrypoint,
    attempt: &'a AttemptLogs,
    log_config: &'a crate::config::LogConfig,
    hostname: &'a str,
    timer_file: Option<&'a std::path::Path>,
    exits: &'a mpsc::UnboundedSender<Exit>,
}

impl WorkerGroup {
    /// Starts `spec.local_world_size` workers, each from a warm spare that fits it when there is one (the
    /// other spares are killed), else cold. Must be called on the agent's main thread. On an error the
    /// workers already started are killed.
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
            exit_tx: tx.clone(),
            guard,
            binary: entry.program.display().to_string(),
            commands: Vec::new(),
            spares_due: spares.delay().map(|d| Instant::now() + d),
            failed: Vec::new(),
            reported: 0,
            timer: None,
            stop_deadline: None,
            stopping_for: None,
        };
        let parent_env = |k: &str| std::env::var(k).ok();
        let fifo = match timer::timer_file(&parent_env, timer::agent_timer_file) {
            Some(path) => Some(timer::Fifo::create(&path)?),
            None => None,
        };
        let ctx = StartContext {
            spec,
            entry,
            attempt,
            log_config,
            hostname,
            timer_file: fifo.as_ref().map(timer::Fifo::path),
            exits: &tx,
        };
        let mut warm = 0;
        for local_rank in 0..spec.local_world_size {
            match group.start_worker(&ctx, local_rank, spares) {
                Ok(from_spare) => warm += usize::from(from_spare),
                Err(e) => {
                    group.kill_started();
                    if let Some(fifo) = &fifo {
                        let _ = std::fs::remove_file(fifo.path());
                    }
                    return Err(e);
                }
            }
        }
        spares.clear();
        let marks = attempt.progress().map(|h| {
            let ranks = group.workers.iter().map(|w| (w.pid, h.progress.marker(w.local_rank))).collect();
            timer::Marks { ranks }
        });
        group.timer = fifo.map(|f| f.serve(group.workers.iter().map(|w| w.pid).collect(), marks));
        if warm > 0 {
            tracing::info!("{warm} of {} worker(s) started from warm spares", spec.local_world_size);
        }
        Ok(group)
    }

    /// Starts one worker; returns whether it came from a warm spare.
    fn start_worker(
        &mut self,
        ctx: &StartContext,
        local_rank: u32,
        spares: &mut WarmSpares,
    ) -> Result<bool, SupervisorError> {
        let (spec, entry) = (ctx.spec, ctx.entry);
        let error_file = ctx.attempt.error_file(local_rank);
        let parent_env = |k: &str| std::env::var(k).ok();
        let mut env =
            env::worker_env(spec, local_rank, error_file.as_deref(), &parent_env).map_err(SupervisorError::Env)?;
        if let Some(path) = ctx.timer_file {
            env.push((timer::FILE_VAR.to_string(), path.display().to_string()));
        }
        let hooks = ctx.attempt.progress();
        if let Some(file) = hooks.and_then(|h| h.files.get(local_rank as usize)) {
            env.push((crate::hang::progress::FILE_VAR.to_string(), file.display().to_string()));
        }
        let global_rank = spec.global_rank(local_rank);
        let tag = WorkerTag { role: &spec.role, local_rank, global_rank, hostname: ctx.hostname };
        let watch = || hooks.and_then(|h| h.line_watch(local_rank));
        let [out, err] = [Stream::Out, Stream::Err].map(|s| ctx.attempt.plan(ctx.log_config, &tag, s, watch()));
        let (mut out, mut err) = (out?, err?);
        let args: Vec<String> =
            entry.args.iter().map(|a| safe_substitute(a, &[("local_rank", &local_rank.to_string())])).collect();
        let placement = spec.placements.get(local_rank as usize).cloned().unwrap_or_default();
        let cmd = WorkerCommand { program: entry.program.clone(), args, env, placement };
        let program = entry.program.display().to_string();
        let spawn_error = |source| SupervisorError::Spawn { local_rank, program: program.clone(), source };
        let out_fd = out.child_fd(Stream::Out).map_err(spawn_error)?;
        let err_fd = err.child_fd(Stream::Err).map_err(spawn_error)?;
        // A spare gets the agent's stdin as a cold worker inherits it (or /dev/null when it has none).
        let stdin = || std::io::stdin().as_fd().try_clone_to_owned().or_else(|_| logs::dev_null()).ok();
        let from_spare = if spares.is_empty() {
            None
        } else {
            stdin().and_then(|stdin| spares.start(&cmd, [stdin.as_fd(), out_fd.as_fd(), err_fd.as_fd()]))
        };
        let warm = from_spare.is_some();
        let mut child = match from_spare {
            Some(w) => {
                if !w.ready {
                    tracing::info!(local_rank, "warm spare still importing; the worker continues where it is");
                }
                w.child
            }
            None => {
                let (stdout, stderr) = (Stdio::from(out_fd), Stdio::from(err_fd));
                let stdio = [Stdio::inherit(), stdout, stderr];
                spawn_worker(&cmd.program, &cmd.args, &cmd.env, &cmd.placement, stdio, self.guard.cgroup_procs())
                    .map_err(spawn_error)?
            }
        };
        self.commands.push(cmd);
        // Only a child already reaped has no pid, and a pid 0 would name the agent's own group.
        let pid = child.id().ok_or_else(|| SupervisorError::NoPid { local_rank, program: program.clone() })? as i32;
        self.guard.watch(pid);
        let pumps = [out, err].into_iter().filter_map(StreamPlan::start_pump).collect();
        let index = self.workers.len();
        let tx = ctx.exits.clone();
        tokio::spawn(async move {
            let code = match child.wait().await {
                Ok(status) => exit_code(status),
                Err(e) => {
                    tracing::error!(pid, "cannot wait for worker: {e}");
                    -1
                }
            };
            children::disown(pid);
            let _ = tx.send(Exit { index, code, at: now_secs() });
        });
        tracing::debug!(local_rank, pid, "worker started");
        self.workers.push(Worker { local_rank, global_rank, pid, error_file, running: true, signalled: false, pumps, swept: false });
        Ok(warm)
    }

    /// A failed start: nothing of it may keep running.
    fn kill_started(&self) {
        for w in &self.workers {
            let _ = children::signal_group(w.pid, Signal::SIGKILL);
        }
    }

    /// Sends a notice signal (a scheduler's warning of a coming stop) to each running worker process; they
    /// keep running. The worker itself, not its process group: its children (a DataLoader's processes) did
    /// not ask for it, and an unhandled SIGUSR1 would kill them.
    pub fn notify(&self, sig: Signal) {
        for w in self.workers.iter().filter(|w| w.running) {
            tracing::info!("forwarding {} to process {} (the workers keep running)", sig.as_str(), w.pid);
            let _ = children::signal(w.pid, sig);
        }
    }

    pub fn pids(&self) -> Vec<i32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// The running workers, for reading their stacks.
    pub fn targets(&self) -> Vec<crate::hang::capture::Target> {
        self.workers
            .iter()
            .filter(|w| w.running)
            .map(|w| crate::hang::capture::Target { rank: w.global_rank, local_rank: w.local_rank, pid: w.pid })
            .collect()
    }

    fn record(&mut self, exit: Option<Exit>) {
        let Some(exit) = exit else {
            // Every exit task is gone: none can still report, so whoever has not is lost.
            let lost: Vec<usize> = (0..self.workers.len()).filter(|i| self.workers[*i].running).collect();
            for index in lost {
                tracing::error!(pid = self.workers[index].pid, "lost track of worker; counting it as failed");
                self.record(Some(Exit { index, code: -1, at: now_secs() }));
            }
            return;
        };
        let w = &mut self.workers[exit.index];
        w.running = false;
        match self.stopping_for {
            // Still in `failed`: a restart's failure summary lists every rank that did not finish.
            Some(purpose) if w.signalled && exit.code < 0 => {
                tracing::info!("stopped for {purpose} (exitcode: {}) local_rank: {} (pid: {})", exit.code, w.local_rank, w.pid);
                self.failed.push(exit);
            }
            _ if exit.code != 0 => self.failed_line(exit),
            _ => {}
        }
    }

    fn failed_line(&mut self, exit: Exit) {
        let w = &self.workers[exit.index];
        tracing::warn!("failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}", exit.code, w.local_rank, w.pid, self.binary);
        self.failed.push(exit);
    }

    fn running(&self) -> usize {
        self.workers.iter().filter(|w| w.running).count()
    }

    /// The failure record of `exit`, reading the worker's error file off the async threads.
    async fn failure(&self, exit: Exit) -> ProcessFailure {
        let w = &self.workers[exit.index];
        let (local_rank, global_rank, pid, error_file) = (w.local_rank, w.global_rank, w.pid, w.error_file.clone());
        let read = move || ProcessFailure::new(local_rank, global_rank, pid, exit.code, error_file.as_deref(), exit.at);
        match tokio::task::spawn_blocking(read).await {
            Ok(failure) => failure,
            Err(e) => {
                tracing::error!("cannot read the error file of local_rank {local_rank} ({e}); reporting the exit code");
                ProcessFailure::new(local_rank, global_rank, pid, exit.code, None, exit.at)
            }
        }
    }

    /// Cancel-safe (may be dropped at any await and called again): returns when every worker has exited 0
    /// (output pipes drained) or at the first non-zero exit not reported yet (that worker's failure; each is
    /// reported once, here or by `stop`). Once every failure is reported and nothing runs, it returns the
    /// first one again. Starts the warm spares when their delay, counted from the start, has passed. Main
    /// thread only (spares are spawned here).
    pub async fn watch(&mut self, spares: &mut WarmSpares) -> Watch {
        loop {
            if let Some(&exit) = self.failed.get(self.reported) {
                let failure = self.failure(exit).await;
                self.reported += 1;
                return Watch::Failed(failure);
            }
            if self.running() == 0 {
                self.finish(&HashSet::new()).await;
                return match self.failed.first() {
                    None => Watch::Succeeded,
                    Some(&first) => Watch::Failed(self.failure(first).await),
                };
            }
            let due = self.spares_due;
            tokio::select! {
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    self.spares_due = None;
                    spares.fill(&self.live_commands());
                }
                exit = self.exits.recv() => self.record(exit),
            }
        }
    }

    /// Stops every running worker but those in `keep` (pids kept in place; empty: none): `sig` to each
    /// process group, up to `grace` for all of them, SIGKILL to the rest, then a sweep of what they left and
    /// their output pipes drained. Returns the failures (non-zero exits) not reported by `watch`, which
    /// includes the workers that exited meanwhile; a worker the stop's signal ended is said to be `stopped
    /// for {purpose}`, not failed. With workers kept the group goes on: the incident is closed (its
    /// failures returned here, not again). Run it to completion.
    pub async fn stop(&mut self, sig: Signal, grace: Duration, purpose: &'static str, keep: &HashSet<i32>) -> Vec<ProcessFailure> {
        self.stopping_for.get_or_insert(purpose);
        let ending = |w: &Worker| !keep.contains(&w.pid);
        for w in self.workers.iter_mut().filter(|w| w.running && ending(w)) {
            tracing::info!("sending process {} closing signal {}", w.pid, sig.as_str());
            let _ = children::signal_group(w.pid, sig);
            w.signalled = true;
        }
        // A stop whose cause is upgraded (a SIGINT during a restart's stop) sends its signal but keeps the
        // first stop's deadline: one incident, one grace period.
        let deadline = *self.stop_deadline.get_or_insert(Instant::now() + grace);
        let left = |g: &WorkerGroup| g.workers.iter().filter(|w| w.running && ending(w)).count();
        while left(self) > 0 {
            match tokio::time::timeout_at(deadline, self.exits.recv()).await {
                Ok(exit) => self.record(exit),
                Err(_) => {
                    for w in self.workers.iter().filter(|w| w.running && ending(w)) {
                        tracing::warn!("unable to shutdown process {} via {}, forcefully exiting via SIGKILL", w.pid, sig.as_str());
                        let _ = children::signal_group(w.pid, Signal::SIGKILL);
                    }
                    while left(self) > 0 {
                        match tokio::time::timeout(KILL_TIMEOUT, self.exits.recv()).await {
                            Ok(exit) => self.record(exit),
                            Err(_) => {
                                tracing::error!("workers did not exit after SIGKILL (uninterruptible kernel sleep?)");
                                break;
                            }
                        }
                    }
                    break;
                }
            }
        }
        self.finish(keep).await;
        let mut failures = Vec::new();
        while let Some(&exit) = self.failed.get(self.reported) {
            failures.push(self.failure(exit).await);
            self.reported += 1;
        }
        if !keep.is_empty() {
            self.close_incident();
        }
        failures
    }

    /// Kills whatever the workers not in `keep` left (in their sessions or not), stops the file timer when
    /// none is kept, and lets their tee pipes drain.
    /// Resumable: a cancelled call leaves what it did not finish to the next.
    async fn finish(&mut self, keep: &HashSet<i32>) {
        let ending: HashSet<i32> = self.workers.iter().filter(|w| !w.swept && !keep.contains(&w.pid)).map(|w| w.pid).collect();
        if !ending.is_empty() {
            let timer = if keep.is_empty() { self.timer.take() } else { None };
            let guard = self.guard.clone();
            let sessions = ending.clone();
            let sweep = tokio::task::spawn_blocking(move || {
                if let Some(timer) = timer {
                    timer.close();
                }
                guard.sweep(&sessions)
            });
            match sweep.await {
                Ok(0) => {}
                Ok(killed) => tracing::info!(killed, "killed processes the workers left behind"),
                Err(e) => tracing::error!("cannot sweep what the workers left behind: {e}"),
            }
            for w in self.workers.iter_mut().filter(|w| ending.contains(&w.pid)) {
                self.guard.forget(w.pid);
                w.swept = true;
            }
        }
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        for w in self.workers.iter_mut().filter(|w| w.swept) {
            while let Some(pump) = w.pumps.last_mut() {
                if tokio::time::timeout_at(deadline, pump).await.is_err() {
                    tracing::warn!("worker output pipes still open after {DRAIN_TIMEOUT:?}; continuing");
                    w.pumps.clear();
                    break;
                }
                w.pumps.pop();
            }
        }
    }
}

/// `set_mempolicy(2)` mode: prefer the node, fall back to others rather than fail an allocation.
const MPOL_PREFERRED: libc::c_int = 1;

/// Spawns one worker (or warm spare): in the job cgroup (`cgroup_procs`, if there is one), its
/// own session, SIGKILL when the agent dies, its CPU and memory placement. `stdio`: stdin, stdout, stderr.
fn spawn_worker(
    program: &std::path::Path,
    args: &[String],
    env: &[(String, String)],
    placement: &Placement,
    stdio: [Stdio; 3],
    cgroup_procs: Option<std::os::fd::RawFd>,
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
    let [stdin, stdout, stderr] = stdio;
    let mut cmd = tokio::process::Command::new(program);
    for name in env::WITHHELD {
        cmd.env_remove(name);
    }
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v))).stdin(stdin).stdout(stdout).stderr(stderr);
    // SAFETY: only async-signal-safe calls (write, setsid, prctl, getppid, raise) run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(procs) = cgroup_procs {
                cgroup::join(procs)?;
            }
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
    children::spawn(&mut cmd)
}
