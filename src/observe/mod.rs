//! Observability, fed from one place: the agent's transitions (`agent::transitions::Transitions`) hand every
//! transition, input and GPU fault to an [`Observer`], which updates the metrics (`metrics.rs`), `/healthz`
//! (`health.rs`), the recovery phases (`recovery.rs`), where the time goes (`goodput.rs`) and writes the
//! event log (`events.rs`). `http.rs` serves
//! `/metrics`, `/healthz` and `/stacks`. Events, metric labels and JSON log lines carry the same identifiers: run id,
//! round, restart count and group rank.
//!
//! The effects that can fail on bad input (binding the metrics port, opening the event log) happen in
//! [`open`], before anything starts.

pub mod events;
pub mod goodput;
pub mod health;
pub mod http;
pub mod metrics;
pub mod record;
pub mod recovery;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::ObserveConfig;
use crate::gpu::health::Fault;
use crate::rendezvous::RdzvEvent;
use events::EventLog;
use goodput::{Goodput, Warmup};
use health::Health;
use metrics::Metrics;
use record::{InputRecord, PhaseKind, StateRecord};


#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(transparent)]
    Bind(#[from] http::BindError),
    #[error(transparent)]
    EventLog(#[from] events::EventLogError),
}

/// Where observations go, opened before anything starts.
pub struct Sinks {
    pub events: EventLog,
    pub metrics: Option<Arc<Metrics>>,
    pub health: Arc<Health>,
    /// The running workers, whose stacks `GET /stacks` reads.
    pub stacks: Arc<crate::hang::Registry>,
    /// When the agent started (its sinks open first): where its goodput account begins, so that a wait
    /// before the first round (an unreachable store) is time lost to the rendezvous.
    pub started: Instant,
    listener: Option<TcpListener>,
}

/// Opens the event log and binds the metrics port (blocking; before the runtime exists).
pub fn open(cfg: &ObserveConfig, run_id: &str, max_restarts: u32) -> Result<Sinks, ObserveError> {
    let listener = cfg.metrics.map(http::bind).transpose()?;
    let events = EventLog::open(cfg.console_events, cfg.event_log.as_deref())?;
    let metrics = listener.is_some().then(|| Arc::new(Metrics::new(run_id, &crate::host::hostname(), max_restarts)));
    Ok(Sinks { events, metrics, health: Arc::new(Health::default()), stacks: Arc::default(), started: Instant::now(), listener })
}

impl Sinks {
    /// Starts serving `/metrics`, `/healthz` and `/stacks` (within the runtime); logs the address.
    pub fn serve(&mut self) {
        let (Some(listener), Some(metrics)) = (self.listener.take(), self.metrics.clone()) else { return };
        match http::spawn(listener, http::Shared { metrics, health: self.health.clone(), stacks: self.stacks.clone() }) {
            Ok(addr) => tracing::info!("metrics on http://{addr}/metrics, health on http://{addr}/healthz, stacks on http://{addr}/stacks"),
            Err(e) => tracing::warn!("cannot serve the metrics endpoint: {e}; the job runs without it"),
        }
    }
}

/// The identifiers every observation carries.
#[derive(Debug, Clone, Default)]
struct Ids {
    run_id: String,
    round: Option<u64>,
    group_rank: Option<u32>,
    restart_count: u32,
}

/// An input as it arrived, before its step.
pub struct Before {
    at: Instant,
}

impl Before {
    /// When the input arrived.
    pub fn at(&self) -> Instant {
        self.at
    }
}

/// Turns the agent's transitions, inputs and faults into metrics, health, recovery phases and events.
pub struct Observer {
    events: EventLog,
    metrics: Option<Arc<Metrics>>,
    health: Arc<Health>,
    ids: Ids,
    recovery: recovery::Tracker,
    goodput: Goodput,
    /// The running workers, whose first progress ends their warm-up.
    running: Arc<crate::hang::Registry>,
    /// When the workers last started running (ms since the epoch, as progress marks are).
    running_since_ms: Option<u64>,
    /// The running start kept workers in place: its warm-up is their re-formation.
    running_in_place: bool,
    created: Instant,
}

/// A membership change's `cause` label.
pub fn membership_cause(event: &RdzvEvent) -> &'static str {
    match event {
        RdzvEvent::PeerLost(_) => "peer_lost",
        RdzvEvent::JoinersWaiting => "joiners",
        RdzvEvent::RoundChanged => "round_changed",
        RdzvEvent::Closed(_) => "closed",
        RdzvEvent::Fenced { .. } => "fenced",
        RdzvEvent::StoreOutage => "store_outage",
        RdzvEvent::HangElsewhere => "hang_elsewhere",
    }
}

fn kind_name(kind: crate::hang::verdict::Kind) -> &'static str {
    use crate::hang::verdict::Kind;
    match kind {
        Kind::Stalled => "stalled",
        Kind::WaitedOn => "waited_on",
        Kind::StoppedFirst => "stopped_first",
        Kind::JobWide => "job_wide",
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Observer {
    pub fn new(sinks: &Sinks, run_id: &str) -> Observer {
        Observer {
            events: sinks.events.clone(),
            metrics: sinks.metrics.clone(),
            health: sinks.health.clone(),
            ids: Ids { run_id: run_id.to_string(), ..Ids::default() },
            recovery: recovery::Tracker::default(),
            goodput: Goodput::default(),
            running: sinks.stacks.clone(),
            running_since_ms: None,
            running_in_place: false,
            created: sinks.started,
        }
    }

    fn ids(&self) -> Value {
        let i = &self.ids;
        json!({ "run_id": i.run_id, "round": i.round, "restart_count": i.restart_count, "group_rank": i.group_rank })
    }

    fn emit(&self, name: &str, fields: Value) {
        let mut event = self.ids();
        if let (Some(e), Value::Object(f)) = (event.as_object_mut(), fields) {
            e.extend(f);
        }
        self.events.emit(name, event);
    }

    /// The node joined `round` after `spent` in the rendezvous.
    pub fn joined(&mut self, round: &crate::rendezvous::RoundInfo, spent: Duration) {
        self.ids.round = Some(round.round);
        self.ids.group_rank = Some(round.group_rank);
        let span = tracing::Span::current();
        span.record("round", round.round);
        span.record("group_rank", round.group_rank);
        if let Some(m) = &self.metrics {
            m.joined(round.round, round.group_rank, round.group_world_size, round.world_size, spent);
        }
    }

    /// Counts what the input itself says (worker exits, membership, a hang) as it arrives.
    pub fn before(&self, input: InputRecord) -> Before {
        if let Some(m) = &self.metrics {
            match input {
                InputRecord::Exits { exitcode, count } => m.worker_exits(exitcode, count),
                InputRecord::Failures(failures) => failures.iter().for_each(|f| m.worker_exits(f.exitcode, 1)),
                InputRecord::Membership(cause) => m.membership(cause),
                InputRecord::Hang(found) if found.judged => m.hang(kind_name(found.verdict.kind)),
                _ => {}
            }
        }
        if let InputRecord::Hang(found) = input {
            self.hang(found);
        }
        Before { at: Instant::now() }
    }

    /// A stop of this kind spent a restart (`step`'s effect).
    pub fn restart_spent(&self, kind: record::StopKind) {
        if let Some(m) = &self.metrics {
            m.restart(kind.restart_label());
        }
    }

    /// A GPU was excluded (`step`'s effect): a membership change of this node.
    pub fn gpu_excluded(&self) {
        if let Some(m) = &self.metrics {
            m.membership("gpu_excluded");
        }
    }

    /// After a step: the restart count the logs carry and the restarts left.
    pub fn after(&mut self, state: &StateRecord) {
        self.ids.restart_count = state.restart_count;
        if let Some(m) = &self.metrics {
            m.restarts_left(state.restarts_left);
        }
    }

    /// A hang found: the verdict (from the node that gave it) and what this node takes part with.
    fn hang(&self, found: &crate::hang::Found) {
        self.emit(
            "muster.agent.hang",
            json!({ "incident": found.incident, "kind": kind_name(found.verdict.kind), "suspects": found.verdict.suspects,
                    "verdict": found.verdict.line, "judged_here": found.judged, "suspect_here": found.here,
                    "stacks": found.stacks.as_ref().map(|p| p.display().to_string()) }),
        );
    }

    /// A GPU fault and what was decided; `count` is how many of its kind this GPU has had.
    pub fn fault(&self, fault: &Fault, verdict: &str, count: u64) {
        if let Some(m) = &self.metrics {
            m.gpu_fault(fault.kind.xid(), &fault.kind.to_string(), fault.action.as_str(), verdict);
        }
        self.emit(
            "muster.gpu.fault",
            json!({ "gpu": fault.gpu.index, "uuid": fault.gpu.uuid, "pci_bus_id": fault.gpu.pci_bus_id,
                    "fault": fault.kind.to_string(), "xid": fault.kind.xid(), "action": fault.action.as_str(),
                    "verdict": verdict, "count": count }),
        );
    }

    /// The agent went `from` → `to` at `now`, `spent` after entering `from`; `input_at` is when the input
    /// that caused it arrived (None for the first and set-up transitions). `state` is None when set-up failed.
    pub fn transition(&mut self, t: Transition, state: Option<&StateRecord>, detail: Value) {
        let Transition { from, to, spent, now, input_at } = t;
        let (from_name, to_name) = (from.as_str(), to.as_str());
        tracing::debug!(from = from_name, to = to_name, spent_ms = ms(spent), "transition");
        tracing::Span::current().record("restart", self.ids.restart_count);
        let mut fields = json!({ "from": from_name, "to": to_name, "spent_ms": ms(spent) });
        if let (Some(f), Value::Object(d)) = (fields.as_object_mut(), detail) {
            f.extend(d);
        }
        self.emit("muster.agent.transition", fields);
        // A set-up that failed (no state) is never healthy.
        self.health.set(state.is_some_and(health::healthy), to_name);
        let cause = state.and_then(|s| s.stop);
        let kept = state.map_or(0, |s| s.kept);
        if let Some(r) = self.recovery.transition(from, to, spent, now, input_at.unwrap_or(now), cause, kept) {
            self.recovered(&r);
        }
        self.account(from, to, spent, now.saturating_duration_since(input_at.unwrap_or(now)), kept > 0);
        let Some(m) = &self.metrics else { return };
        m.state(to_name);
        match (to, state) {
            (PhaseKind::Running, Some(s)) => m.local_workers(s.nproc),
            (PhaseKind::Draining, _) => {
                m.membership("drained");
                m.local_workers(0);
            }
            (PhaseKind::Running | PhaseKind::Stopping | PhaseKind::Starting, _) => {}
            _ => m.local_workers(0),
        }
    }

    /// Adds the time spent in `from` to the goodput; `waited`: how long before now the input that caused
    /// this transition arrived; `kept`: the state entered has workers kept in place. Said each time the
    /// workers run again, and at the end.
    fn account(&mut self, from: PhaseKind, to: PhaseKind, spent: Duration, waited: Duration, kept: bool) {
        let detect = if from == PhaseKind::Running && to == PhaseKind::Stopping { waited } else { Duration::ZERO };
        let since_ms = |at: u64, since: u64| Duration::from_millis(at.saturating_sub(since));
        let warmup = match (from, self.running.progress(), self.running_since_ms) {
            (PhaseKind::Running, _, Some(since)) if self.running_in_place => {
                Warmup::Reformed(self.running.reformed_ms().map(|at| since_ms(at, since)))
            }
            (PhaseKind::Running, Some(progress), Some(since)) => match progress.first_ms() {
                Some(first) => Warmup::Until(since_ms(first, since)),
                None => Warmup::NoProgress,
            },
            _ => Warmup::NotMeasured,
        };
        let added = self.goodput.add(from, spent, detect, warmup);
        if let Some(m) = &self.metrics {
            m.goodput(&added);
        }
        if to == PhaseKind::Running {
            self.running_since_ms = crate::rendezvous::unix_ms();
            self.running_in_place = kept;
        }
        let end = matches!(to, PhaseKind::Succeeded | PhaseKind::Failed | PhaseKind::Interrupted | PhaseKind::Drained);
        if !(to == PhaseKind::Running || end) {
            return;
        }
        let g = &self.goodput;
        let lost: serde_json::Map<String, Value> = goodput::LOST.iter().zip(g.lost).map(|(name, d)| (format!("{name}_s"), json!(d.as_secs_f64()))).collect();
        let mut fields = json!({ "final": end, "goodput": g.ratio(), "productive_s": g.productive.as_secs_f64(),
                                 "wall_s": self.created.elapsed().as_secs_f64() });
        if let Some(f) = fields.as_object_mut() {
            f.insert("lost".into(), Value::Object(lost));
        }
        self.emit("muster.agent.goodput", fields);
        if end {
            tracing::info!("{}", g.line());
        }
    }

    /// A recovery's line, event and metrics; one that kept workers in place is its own kind: `{cause}, in
    /// place` in the line and the metric's label, `in_place` (the workers kept) in the event.
    fn recovered(&self, r: &recovery::Recovery) {
        let [detect, stop, rendezvous, spawn] = r.phases;
        let kind = if r.kept > 0 { format!("{}, in place", r.cause) } else { r.cause.to_string() };
        let kept = if r.kept > 0 { format!("; {} worker(s) kept in place", r.kept) } else { String::new() };
        tracing::info!(
            "recovered from {kind} in {:.1} ms (detect {:.1}, stop {:.1}, rendezvous {:.1}, spawn {:.1}){kept}",
            ms(r.total),
            ms(detect),
            ms(stop),
            ms(rendezvous),
            ms(spawn)
        );
        self.emit(
            "muster.agent.recovery",
            json!({ "cause": r.cause, "recovery_ms": ms(r.total), "detect_ms": ms(detect), "stop_ms": ms(stop),
                    "rendezvous_ms": ms(rendezvous), "spawn_ms": ms(spawn), "in_place": r.kept }),
        );
        if let Some(m) = &self.metrics {
            m.recovery(&kind, r.phases, r.total);
        }
    }

    /// Writes out the event log (the agent is done).
    pub fn close(&self) {
        self.events.close();
    }
}

/// One transition, timed.
pub struct Transition {
    pub from: PhaseKind,
    pub to: PhaseKind,
    pub spent: Duration,
    pub now: Instant,
    pub input_at: Option<Instant>,
}
