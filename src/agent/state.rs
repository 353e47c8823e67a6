//! The agent's state machine as data: the phases, the causes of a stop, the inputs, the operations and
//! effects, and the state itself. The transition function over them is `step.rs`; what each cause decides
//! lives in one file each (`worker.rs`, `peer.rs`, `gpu.rs`, `signal.rs`, `hang.rs`).

use std::collections::BTreeSet;

use nix::sys::signal::Signal;

use super::AgentError;
use crate::gpu::health::Fault;
use crate::observe::record::{InputRecord, PhaseKind, StateRecord, StopKind};
use crate::rendezvous::{RdzvError, RdzvEvent};
use crate::supervisor::failure::ProcessFailure;

/// What the node is doing. Each phase but `Done` has exactly one operation ([`Op`]).
#[derive(Debug)]
pub enum Phase {
    /// Joining a round and learning the workers' store endpoint.
    Joining,
    /// Placing and spawning the workers.
    Starting,
    /// Watching the workers and the membership.
    Running,
    /// Stopping the workers; the cause decides what follows.
    Stopping(Cause),
    /// Opening the next round (`open`) or following one another node opened, then joining it.
    Reforming { open: bool },
    /// Leaving the rendezvous and running the node-fault hook; then exit with the unhealthy-node code.
    Draining(Fault),
    /// The exit barrier (on success) and closing the rendezvous; then `end`.
    Finishing(End),
    Done(End),
}

impl Phase {
    /// The phase as observers see it (a finished agent by how it ended).
    pub fn kind(&self) -> PhaseKind {
        match self {
            Phase::Joining => PhaseKind::Rendezvous,
            Phase::Starting => PhaseKind::Starting,
            Phase::Running => PhaseKind::Running,
            Phase::Stopping(_) => PhaseKind::Stopping,
            Phase::Reforming { .. } => PhaseKind::Restarting,
            Phase::Draining(_) => PhaseKind::Draining,
            Phase::Finishing(_) => PhaseKind::Finishing,
            Phase::Done(end) => end.kind(),
        }
    }

    /// The phase as transition events name it.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// Why a running group is being stopped. When several causes meet during one stop, the stronger one wins
/// (the order of the variants), and restart-class causes merge: one incident spends one restart.
#[derive(Debug)]
pub enum Cause {
    /// The membership changed (no restart spent).
    Membership(RdzvEvent),
    /// Workers failed, a restart-class GPU fault and/or a hang among this node's ranks: spends one restart.
    Restart { failures: Vec<ProcessFailure>, fault: Option<Fault>, hang: bool },
    /// A GPU is being excluded (already in `excluded`): re-form with one worker fewer, no restart spent.
    Exclude(Fault),
    /// An operation failed for good.
    Error(AgentError),
    Drain(Fault),
    Signal(Signal),
}

impl Cause {
    fn rank(&self) -> u8 {
        match self {
            Cause::Membership(_) => 0,
            Cause::Restart { .. } => 1,
            Cause::Exclude(_) => 2,
            Cause::Error(_) => 3,
            Cause::Drain(_) => 4,
            Cause::Signal(_) => 5,
        }
    }

    /// This cause and `other`, met within one stop, as one.
    pub fn merge(self, other: Cause) -> Cause {
        match (self, other) {
            (Cause::Restart { mut failures, fault, hang }, Cause::Restart { failures: more, fault: f2, hang: h2 }) => {
                failures.extend(more);
                Cause::Restart { failures, fault: fault.or(f2), hang: hang || h2 }
            }
            (a, b) if b.rank() > a.rank() => b,
            (a, _) => a,
        }
    }

    pub fn kind(&self) -> StopKind {
        match self {
            Cause::Membership(RdzvEvent::Fenced { .. }) => StopKind::Fenced,
            Cause::Membership(_) => StopKind::MembershipChange,
            Cause::Restart { fault: Some(_), .. } => StopKind::GpuFault,
            Cause::Restart { hang: true, .. } => StopKind::Hang,
            Cause::Restart { .. } => StopKind::WorkerFailure,
            Cause::Exclude(_) => StopKind::GpuExcluded,
            Cause::Error(_) => StopKind::Error,
            Cause::Drain(_) => StopKind::NodeDrained,
            Cause::Signal(_) => StopKind::Signal,
        }
    }

    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// How the agent ends.
#[derive(Debug)]
pub enum End {
    Succeeded,
    /// Restarts exhausted.
    Failed(Vec<ProcessFailure>),
    Interrupted(Signal),
    Drained(Fault),
    Error(AgentError),
}

impl End {
    pub fn kind(&self) -> PhaseKind {
        match self {
            End::Succeeded => PhaseKind::Succeeded,
            End::Failed(_) | End::Error(_) => PhaseKind::Failed,
            End::Interrupted(_) => PhaseKind::Interrupted,
            End::Drained(_) => PhaseKind::Drained,
        }
    }

    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// Everything that can happen, from every source.
#[derive(Debug)]
pub enum Input {
    /// A stop signal (`crate::signals::Delivery::Stop`).
    Signal(Signal),
    /// A notice signal to forward (`crate::signals::Delivery::Notice`).
    Notice(Signal),
    Fault(Fault),
    /// Joining: the round is sealed and the workers' store is known; this node joined it with `nproc`
    /// workers.
    Joined { nproc: u32 },
    /// Joining: the membership changed before the group started.
    JoinChanged(RdzvEvent),
    /// Starting: the workers run; `gpus` are the GPUs they were placed on (None: no placement); `kept`:
    /// how many of them were kept in place from the last group.
    Started { gpus: Option<BTreeSet<u32>>, kept: u32 },
    /// Starting: a GPU the workers need does not answer (the fault the driver made of it).
    StartLost(Fault),
    /// Running: every worker exited 0.
    Succeeded,
    /// Running: a worker exited non-zero; `change`: the membership change found behind it (the round moved
    /// on, a neighbour is gone, the store is out of reach), if any.
    WorkerFailed { failure: ProcessFailure, change: Option<RdzvEvent> },
    /// Running: the membership changed.
    Membership(RdzvEvent),
    /// Running: a hang was found, captured and judged (`crate::hang`).
    Hung(Box<crate::hang::Found>),
    /// Stopping: every worker is gone; the failures seen meanwhile.
    Stopped(Vec<ProcessFailure>),
    /// Reforming: the next round is open.
    Reformed,
    /// Draining: done.
    Drained,
    /// Finishing: done.
    Finished,
    /// The phase's operation failed.
    Failed(AgentError),
}

impl Input {
    /// What the input says by itself, for the observers; `state` is the state it arrives in.
    pub fn record(&self, state: &State) -> InputRecord<'_> {
        match self {
            Input::WorkerFailed { failure, .. } => InputRecord::Exits { exitcode: failure.exitcode, count: 1 },
            Input::Stopped(failures) => InputRecord::Failures(failures),
            Input::Succeeded => InputRecord::Exits { exitcode: 0, count: u64::from(state.nproc()) },
            Input::Membership(event) | Input::JoinChanged(event) => InputRecord::Membership(crate::observe::membership_cause(event)),
            Input::Hung(found) => InputRecord::Hang(found),
            _ => InputRecord::Other,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Input::Signal(_) => "signal",
            Input::Notice(_) => "notice",
            Input::Fault(_) => "fault",
            Input::Joined { .. } => "joined",
            Input::JoinChanged(_) => "join_changed",
            Input::Started { .. } => "started",
            Input::StartLost(_) => "start_lost",
            Input::Succeeded => "succeeded",
            Input::WorkerFailed { .. } => "worker_failed",
            Input::Membership(_) => "membership",
            Input::Hung(_) => "hung",
            Input::Stopped(_) => "stopped",
            Input::Reformed => "reformed",
            Input::Drained => "drained",
            Input::Finished => "finished",
            Input::Failed(_) => "failed",
        }
    }
}

/// What the driver runs for a phase. Equal ops across a step mean the running operation goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Join with `State::nproc()` workers as it is when the join starts: a GPU excluded meanwhile lets the
    /// join finish (dropping it halfway would leave this node's record in the round) and re-forms after.
    Join,
    Start { nproc: u32, excluded: BTreeSet<u32> },
    Watch,
    /// `open_first`: the next round is opened before the first worker is stopped (see `opens_first`).
    /// `keep`: the workers that can re-form in place are kept (see `keeps_in_place`).
    Stop { sig: Signal, grace: Grace, why: StopFor, open_first: bool, keep: bool },
    /// `record`: a restart of this kind to add to the job's count first. `check`: a worker on these GPUs
    /// died by itself; the re-formation first waits a moment, so that the GPU fault behind the death (the
    /// driver's XID comes tens of milliseconds after the process it killed) is met before anything else,
    /// then asks each GPU directly: a restart-class XID joins the incident, a lost GPU drains the node (or
    /// is excluded) before it joins a round or starts a worker.
    Reform { open: bool, record: Option<StopKind>, check: Option<BTreeSet<u32>> },
    Drain(Box<Fault>),
    /// `failed`: this node failed for good, with what the others are told.
    Finish { barrier: bool, failed: Option<String> },
    None,
}

/// What a stop is for, as the line for each worker it ends says (`stopped for the re-formation`): a worker
/// the agent stopped on purpose is not a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopFor {
    /// A membership change, a fence or a GPU's exclusion: the group re-forms.
    Reformation,
    /// This node's failure, with a restart left.
    Restart,
    /// This node's failure, with none left.
    Failure,
    Drain,
    /// A signal to the agent, or an error that ends it.
    Shutdown,
}

impl StopFor {
    pub fn as_str(self) -> &'static str {
        match self {
            StopFor::Reformation => "the re-formation",
            StopFor::Restart => "the restart",
            StopFor::Failure => "the group's failure",
            StopFor::Drain => "the drain",
            StopFor::Shutdown => "the shutdown",
        }
    }
}

/// How long a stop waits between its signal and SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grace {
    /// `--shutdown-timeout`: the workers may be checkpointing.
    Shutdown,
    /// `membership_grace`: a peer is gone or hung, so no collective (nor a collective checkpoint) can
    /// complete; workers blocked in one ignore SIGTERM, and waiting for them only delays the re-formation.
    Membership,
    /// This node fenced itself: what is left of the margin before the others may evict it.
    Fenced,
}

/// What a fault came to, for its event and log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Acted,
    /// The policy says ignore.
    Ignored,
    /// The GPU is excluded (or being excluded) already.
    Excluded,
    /// No worker of this node uses the GPU.
    Unused,
    /// Part of an incident already being handled (the group restarts anyway, or the node is leaving).
    Absorbed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Acted => "acted",
            Verdict::Ignored => "ignored",
            Verdict::Excluded => "ignored: GPU excluded",
            Verdict::Unused => "ignored: GPU not used by this node",
            Verdict::Absorbed => "absorbed: incident already handled",
        }
    }
}

/// A side effect `step` asks for besides the phase's operation.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Count and report a fault with what was decided.
    Fault(Box<Fault>, Verdict),
    /// Send a notice signal to the running workers (they keep running).
    Forward(Signal),
    /// A stop of this kind spent one restart (observe counts it by cause).
    RestartSpent(StopKind),
    /// This GPU is excluded from now on (observe counts it as a membership change of this node).
    Excluded(u32),
}

/// What does not change during a run.
#[derive(Debug, Clone)]
pub struct Job {
    pub run_id: String,
    pub nproc_per_node: u32,
    pub max_restarts: u32,
    /// `--on-hang` (hang detection on or not: without it no hang is found).
    pub on_hang: crate::config::OnHang,
    /// More than one node may take part (`--nnodes` MAX > 1): the group can be re-formed by others.
    pub multi_node: bool,
    /// Every GPU index NVML reports on this node.
    pub gpus: BTreeSet<u32>,
    /// `--in-place on`: workers that can re-form in place are kept across a re-formation.
    pub in_place: bool,
}

#[derive(Debug)]
pub struct State {
    pub job: Job,
    pub phase: Phase,
    pub restart_count: u32,
    pub excluded: BTreeSet<u32>,
    /// GPUs the current (or last) workers were placed on; None: no placement (every GPU counts as used).
    pub in_use: Option<BTreeSet<u32>>,
    /// The last stop spent a restart and no worker has started since: a GPU fault arriving now is the
    /// cause of that stop (the worker died a moment before its GPU's event), so excluding the GPU refunds it.
    pub spent_by_last_stop: bool,
    /// A restart the last stop spent, of this kind, not yet in the job's count (`--job-max-restarts`): the
    /// re-formation records it first, and ends the job if that takes it over its budget.
    pub unrecorded: Option<StopKind>,
    /// The GPUs of a group one of whose workers died by itself, not checked since (see `Op::Reform`).
    pub died_on: Option<BTreeSet<u32>>,
    /// Workers of the running group kept in place from the one before.
    pub kept: u32,
}

impl State {
    pub fn new(job: Job) -> State {
        State {
            job,
            phase: Phase::Joining,
            restart_count: 0,
            excluded: BTreeSet::new(),
            in_use: None,
            spent_by_last_stop: false,
            unrecorded: None,
            died_on: None,
            kept: 0,
        }
    }

    /// Workers this node runs now.
    pub fn nproc(&self) -> u32 {
        self.job.nproc_per_node.saturating_sub(self.excluded.len() as u32)
    }

    /// Whether another start of the group can follow this one (a restart left, or a membership change from
    /// another node): whether warm spares for it are worth their memory.
    pub fn another_start_possible(&self) -> bool {
        self.restart_count < self.job.max_restarts || self.job.multi_node
    }

    pub fn restarts_left(&self) -> u32 {
        self.job.max_restarts.saturating_sub(self.restart_count)
    }

    pub fn phase_name(&self) -> &'static str {
        self.phase.name()
    }

    /// The state as observers see it.
    pub fn record(&self) -> StateRecord {
        StateRecord {
            phase: self.phase.kind(),
            stop: match &self.phase {
                Phase::Stopping(cause) => Some(cause.kind()),
                _ => None,
            },
            succeeding: matches!(self.phase, Phase::Finishing(End::Succeeded)),
            nproc: self.nproc(),
            restart_count: self.restart_count,
            restarts_left: self.restarts_left(),
            kept: self.kept,
        }
    }

    pub fn op(&self) -> Op {
        match &self.phase {
            Phase::Joining => Op::Join,
            Phase::Starting => Op::Start { nproc: self.nproc(), excluded: self.excluded.clone() },
            Phase::Running => Op::Watch,
            Phase::Stopping(cause) => {
                let (sig, grace) = stop_signal(cause);
                let why = self.stop_for(cause);
                let keep = self.job.in_place && keeps_in_place(cause) && matches!(why, StopFor::Reformation | StopFor::Restart);
                Op::Stop { sig, grace, why, open_first: opens_first(cause), keep }
            }
            Phase::Reforming { open } => Op::Reform { open: *open, record: self.unrecorded, check: self.to_check() },
            Phase::Draining(f) => Op::Drain(Box::new(f.clone())),
            Phase::Finishing(end) => Op::Finish { barrier: matches!(end, End::Succeeded), failed: self.failed_line(end) },
            Phase::Done(_) => Op::None,
        }
    }

    /// The GPUs a worker died on, less those excluded since: what the next re-formation asks first.
    fn to_check(&self) -> Option<BTreeSet<u32>> {
        let left: BTreeSet<u32> = self.died_on.as_ref()?.difference(&self.excluded).copied().collect();
        (!left.is_empty()).then_some(left)
    }

    /// A worker died by itself: on a GPU node, its group's GPUs are checked before the next round.
    pub fn worker_died(&mut self) {
        if !self.job.gpus.is_empty() {
            self.died_on = Some(self.in_use.clone().unwrap_or_else(|| self.job.gpus.iter().copied().collect()));
        }
    }

    fn stop_for(&self, cause: &Cause) -> StopFor {
        match cause {
            Cause::Membership(_) | Cause::Exclude(_) => StopFor::Reformation,
            Cause::Restart { .. } if self.restarts_left() > 0 => StopFor::Restart,
            Cause::Restart { .. } => StopFor::Failure,
            Cause::Drain(_) => StopFor::Drain,
            Cause::Signal(_) | Cause::Error(_) => StopFor::Shutdown,
        }
    }

    /// What the other nodes are told when this one fails for good (`None` on success): its first failed
    /// rank, or the error.
    fn failed_line(&self, end: &End) -> Option<String> {
        let spent = format!("restarts spent (--max-restarts {})", self.job.max_restarts);
        match end {
            End::Succeeded | End::Interrupted(_) | End::Drained(_) => None,
            End::Failed(failures) => Some(match failures.first() {
                Some(f) => format!("rank {} (local_rank {}) exited with {}, {spent}", f.global_rank, f.local_rank, f.exitcode),
                None => format!("its workers failed, {spent}"),
            }),
            End::Error(e) => Some(e.to_string()),
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done(_))
    }

    /// Whether workers may be running (a stop is needed before anything else).
    pub fn group_running(&self) -> bool {
        matches!(self.phase, Phase::Running)
    }
}

/// A completion the phase's operation cannot produce: a bug, reported as the agent's error.
pub(super) fn unexpected(phase: Phase, input: &str) -> Phase {
    let name = phase.name();
    Phase::Done(End::Error(AgentError::Internal(format!("input '{input}' in phase '{name}'"))))
}

/// The signal a stop sends and how long it waits before SIGKILL.
/// Whether a stop opens the next round before it stops a worker: for a change this node saw and the others
/// may not have yet (a neighbour lost, joiners waiting, a hang named elsewhere, a GPU excluded here). Their
/// workers fail as soon as these stop; with the round already moved, each of them reads that failure as
/// this change's (`change_behind_failure`) rather than as its own, and spends no restart. Not when the store
/// does not answer (fenced, an outage: the stop cannot wait for it), nor for a restart, whose count the
/// re-formation records before it opens the round.
fn opens_first(cause: &Cause) -> bool {
    matches!(
        cause,
        Cause::Membership(RdzvEvent::PeerLost(_) | RdzvEvent::JoinersWaiting | RdzvEvent::HangElsewhere) | Cause::Exclude(_)
    )
}

/// Whether a stop for `cause` keeps the workers that can re-form in place: a change of membership seen
/// while the store answers, or workers of this node that died by themselves. Never a fence (the node must
/// stop its workers before the others may evict it), a hang (its ranks are stuck), a GPU fault or an
/// exclusion (the worker's GPU is gone or changes), a drain, a signal or an error: those restart cold or end.
fn keeps_in_place(cause: &Cause) -> bool {
    matches!(
        cause,
        Cause::Membership(RdzvEvent::PeerLost(_) | RdzvEvent::JoinersWaiting | RdzvEvent::RoundChanged | RdzvEvent::StoreOutage)
            | Cause::Restart { fault: None, hang: false, .. }
    )
}

fn stop_signal(cause: &Cause) -> (Signal, Grace) {
    match cause {
        Cause::Signal(sig) => (*sig, Grace::Shutdown),
        Cause::Membership(RdzvEvent::Fenced { .. }) => (Signal::SIGTERM, Grace::Fenced),
        // A hung collective cannot complete, so neither can a checkpoint that needs one; nor can one whose
        // peers went with the store's host.
        Cause::Membership(_)
        | Cause::Restart { hang: true, .. }
        | Cause::Error(AgentError::Rendezvous(RdzvError::StoreHostEnded { .. })) => (Signal::SIGTERM, Grace::Membership),
        _ => (Signal::SIGTERM, Grace::Shutdown),
    }
}
