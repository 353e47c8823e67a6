//! The metrics: one registry of Prometheus counters, gauges and histograms, and what each agent transition,
//! input and fault does to them. Everything is labelled with the run id, the host name and the node's current
//! group rank (`none` before the first round); the labels are attached when a scrape renders the text, so a
//! node re-ranked after a re-formation reports the same counters under its new rank.
//!
//! Names (OpenMetrics text; counters end in `_total`):
//! - `muster_restarts_total{cause}` (worker_failure, gpu_fault; a restart refunded because its GPU was then
//!   excluded stays counted), `muster_restarts_remaining`;
//! - `muster_rendezvous_rounds_total`, `muster_rendezvous_seconds` (time in each join), `muster_round`;
//! - `muster_membership_changes_total{cause}` (peer_lost, joiners, round_changed, closed, gpu_excluded, drained);
//! - `muster_world_size`, `muster_group_world_size`, `muster_group_rank`, `muster_local_workers`;
//! - `muster_worker_exits_total{exit_code, signal}`; `muster_gpu_faults_total{xid, fault, action, verdict}`;
//! - `muster_recovery_phase_seconds{phase}` (detect, stop, rendezvous, spawn), `muster_recovery_seconds{cause}`;
//! - `muster_productive_seconds_total` (the workers training) and `muster_lost_seconds_total{phase}`
//!   (rendezvous, spawn, warmup, detect, stop, finish): where the agent's wall time went (`goodput.rs`);
//! - `muster_state{state}`: 1 for the agent's current state, 0 for the others;
//! - `muster_rank_wait_share{rank}` (each local rank's share of stack samples spent waiting in collectives
//!   over the last straggler window), `muster_stragglers_total` (stragglers this node named as group rank 0).

use std::borrow::Cow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::goodput::{Added, LOST};

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;
type Seconds = Counter<f64, std::sync::atomic::AtomicU64>;

/// Every state the `muster_state` gauge names (the agent's phase names, final ones included).
pub const STATES: [&str; 11] = [
    "rendezvous",
    "starting",
    "running",
    "stopping",
    "restarting",
    "draining",
    "finishing",
    "succeeded",
    "failed",
    "interrupted",
    "drained",
];

/// The phases of one recovery, as the histogram labels them.
pub const PHASES: [&str; 4] = ["detect", "stop", "rendezvous", "spawn"];

/// 1 ms to about 65 s, doubling.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn label(key: &'static str, value: impl Into<String>) -> Labels {
    vec![(key, value.into())]
}

/// The agent's metrics; cheap to share (every metric is a handle on shared atomics).
#[derive(Debug)]
pub struct Metrics {
    run_id: String,
    hostname: String,
    group_rank: AtomicI64,
    restarts: Family<Labels, Counter>,
    restarts_remaining: Gauge,
    rounds: Counter,
    rendezvous_seconds: Histogram,
    round: Gauge,
    membership: Family<Labels, Counter>,
    world_size: Gauge,
    group_world_size: Gauge,
    group_rank_gauge: Gauge,
    local_workers: Gauge,
    worker_exits: Family<Labels, Counter>,
    gpu_faults: Family<Labels, Counter>,
    hangs: Family<Labels, Counter>,
    phases: Histograms,
    recoveries: Histograms,
    state: Family<Labels, Gauge>,
    productive: Seconds,
    lost: Family<Labels, Seconds>,
    wait_share: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    stragglers: Counter,
}

/// How a worker ended, as `muster_worker_exits_total` labels it: its exit code, or minus the signal number.
pub fn exit_labels(exitcode: i32) -> Labels {
    if exitcode < 0 {
        let signal = nix::sys::signal::Signal::try_from(-exitcode)
            .map(|s| s.as_str().to_string())
            .unwrap_or_else(|_| (-exitcode).to_string());
        vec![("exit_code", String::new()), ("signal", signal)]
    } else {
        vec![("exit_code", exitcode.to_string()), ("signal", String::new())]
    }
}

impl Metrics {
    pub fn new(run_id: &str, hostname: &str, max_restarts: u32) -> Metrics {
        let m = Metrics {
            run_id: run_id.to_string(),
            hostname: hostname.to_string(),
            group_rank: AtomicI64::new(-1),
            restarts: Family::default(),
            restarts_remaining: Gauge::default(),
            rounds: Counter::default(),
            rendezvous_seconds: seconds_histogram(),
            round: Gauge::default(),
            membership: Family::default(),
            world_size: Gauge::default(),
            group_world_size: Gauge::default(),
            group_rank_gauge: Gauge::default(),
            local_workers: Gauge::default(),
            worker_exits: Family::default(),
            gpu_faults: Family::default(),
            hangs: Family::default(),
            phases: Family::new_with_constructor(seconds_histogram),
            recoveries: Family::new_with_constructor(seconds_histogram),
            state: Family::default(),
            productive: Seconds::default(),
            lost: Family::default(),
            wait_share: Family::default(),
            stragglers: Counter::default(),
        };
        for phase in LOST {
            let _ = m.lost.get_or_create(&label("phase", phase));
        }
        // Present from the first scrape, so a dashboard's queries and rate() have a zero to start from.
        for kind in ["stalled", "stopped_first", "job_wide"] {
            let _ = m.hangs.get_or_create(&label("kind", kind));
        }
        for cause in ["worker_failure", "gpu_fault", "hang"] {
            let _ = m.restarts.get_or_create(&label("cause", cause));
        }
        for cause in ["peer_lost", "joiners", "round_changed", "closed", "fenced", "store_outage", "hang_elsewhere", "gpu_excluded", "drained"] {
            let _ = m.membership.get_or_create(&label("cause", cause));
        }
        for cause in ["worker failure", "gpu fault", "membership change", "gpu excluded"] {
            let _ = m.recoveries.get_or_create(&label("cause", cause));
        }
        for phase in PHASES {
            let _ = m.phases.get_or_create(&label("phase", phase));
        }
        for state in STATES {
            let _ = m.state.get_or_create(&label("state", state));
        }
        m.restarts_remaining.set(i64::from(max_restarts));
        m.group_rank_gauge.set(-1);
        m
    }

    /// The agent entered `state`.
    pub fn state(&self, state: &str) {
        for s in STATES {
            self.state.get_or_create(&label("state", s)).set(i64::from(s == state));
        }
    }

    pub fn restarts_left(&self, left: u32) {
        self.restarts_remaining.set(i64::from(left));
    }

    /// One restart spent; `cause` is worker_failure or gpu_fault.
    pub fn restart(&self, cause: &str) {
        self.restarts.get_or_create(&label("cause", cause)).inc();
    }

    /// A round joined after `spent` in the rendezvous.
    pub fn joined(&self, round: u64, group_rank: u32, group_world_size: u32, world_size: u32, spent: Duration) {
        self.rounds.inc();
        self.rendezvous_seconds.observe(spent.as_secs_f64());
        self.round.set(i64::try_from(round).unwrap_or(i64::MAX));
        self.group_rank.store(i64::from(group_rank), Ordering::Relaxed);
        self.group_rank_gauge.set(i64::from(group_rank));
        self.group_world_size.set(i64::from(group_world_size));
        self.world_size.set(i64::from(world_size));
    }

    pub fn local_workers(&self, n: u32) {
        self.local_workers.set(i64::from(n));
    }

    pub fn membership(&self, cause: &str) {
        self.membership.get_or_create(&label("cause", cause)).inc();
    }

    /// `count` workers ended with `exitcode` (minus the signal number when killed).
    pub fn worker_exits(&self, exitcode: i32, count: u64) {
        self.worker_exits.get_or_create(&exit_labels(exitcode)).inc_by(count);
    }

    pub fn gpu_fault(&self, xid: Option<u64>, fault: &str, action: &str, verdict: &str) {
        let labels = vec![
            ("xid", xid.map(|x| x.to_string()).unwrap_or_default()),
            ("fault", fault.to_string()),
            ("action", action.to_string()),
            ("verdict", verdict.to_string()),
        ];
        self.gpu_faults.get_or_create(&labels).inc();
    }

    /// A local rank's wait share over the last straggler window.
    pub fn wait_share(&self, rank: u32, share: f64) {
        self.wait_share.get_or_create(&label("rank", rank.to_string())).set(share);
    }

    /// A straggler this node named (group rank 0).
    pub fn straggler(&self) {
        self.stragglers.inc();
    }

    /// A hang verdict this node gave (group rank 0), by its kind.
    pub fn hang(&self, kind: &str) {
        self.hangs.get_or_create(&label("kind", kind)).inc();
    }

    /// One recovery: its phases in [`PHASES`] order, and the whole.
    pub fn recovery(&self, cause: &str, phases: [Duration; 4], total: Duration) {
        for (phase, spent) in PHASES.iter().zip(phases) {
            self.phases.get_or_create(&label("phase", *phase)).observe(spent.as_secs_f64());
        }
        self.recoveries.get_or_create(&label("cause", cause)).observe(total.as_secs_f64());
    }

    /// Time one transition added to training and to the lost phases.
    pub fn goodput(&self, added: &Added) {
        self.productive.inc_by(added.productive.as_secs_f64());
        for (phase, spent) in LOST.iter().zip(added.lost) {
            self.lost.get_or_create(&label("phase", *phase)).inc_by(spent.as_secs_f64());
        }
    }

    /// The OpenMetrics text of every metric, with the node's labels as they are now.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        let rank = match self.group_rank.load(Ordering::Relaxed) {
            r if r < 0 => "none".to_string(),
            r => r.to_string(),
        };
        let labels: [(&'static str, String); 3] =
            [("run_id", self.run_id.clone()), ("hostname", self.hostname.clone()), ("group_rank", rank)];
        let mut r = Registry::with_labels(labels.into_iter().map(|(k, v)| (Cow::Borrowed(k), Cow::Owned(v))));
        r.register("muster_restarts", "Worker-group restarts spent, by cause", self.restarts.clone());
        r.register("muster_restarts_remaining", "Restarts left of --max-restarts", self.restarts_remaining.clone());
        r.register("muster_rendezvous_rounds", "Rendezvous rounds this node joined", self.rounds.clone());
        r.register_with_unit(
            "muster_rendezvous",
            "Time from entering the rendezvous to the round being joined",
            Unit::Seconds,
            self.rendezvous_seconds.clone(),
        );
        r.register("muster_round", "The rendezvous round this node joined last", self.round.clone());
        r.register("muster_membership_changes", "Re-formations without a restart, by cause", self.membership.clone());
        r.register("muster_world_size", "WORLD_SIZE of the current round", self.world_size.clone());
        r.register("muster_group_world_size", "Nodes in the current round", self.group_world_size.clone());
        r.register("muster_group_rank", "GROUP_RANK of this node (-1 before the first round)", self.group_rank_gauge.clone());
        r.register("muster_local_workers", "Workers this node runs", self.local_workers.clone());
        r.register("muster_worker_exits", "Worker exits, by exit code or signal", self.worker_exits.clone());
        r.register("muster_gpu_faults", "GPU faults, by XID, kind, action and verdict", self.gpu_faults.clone());
        r.register("muster_hangs", "Hang verdicts this node gave as group rank 0, by kind", self.hangs.clone());
        r.register_with_unit(
            "muster_recovery_phase",
            "Each recovery's phases: detect, stop, rendezvous, spawn",
            Unit::Seconds,
            self.phases.clone(),
        );
        r.register_with_unit(
            "muster_recovery",
            "From the event to the workers running again, by cause",
            Unit::Seconds,
            self.recoveries.clone(),
        );
        r.register("muster_state", "1 for the agent's current state", self.state.clone());
        r.register("muster_rank_wait_share", "Share of a local rank's samples spent waiting in collectives, last window", self.wait_share.clone());
        r.register("muster_stragglers", "Stragglers this node named as group rank 0", self.stragglers.clone());
        r.register_with_unit("muster_productive", "Time the workers ran past their warm-up", Unit::Seconds, self.productive.clone());
        r.register_with_unit("muster_lost", "Time not spent training, by phase", Unit::Seconds, self.lost.clone());
        let mut out = String::new();
        encode(&mut out, &r)?;
        Ok(out)
    }
}

/// Every metric name a scrape shows (a dashboard's queries must use only these). A family without a
/// series yet (no worker has exited, no GPU fault) is not shown.
pub fn names(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_names_every_metric_with_the_node_labels() {
        let m = Metrics::new("job1", "node-a", 3);
        m.state("running");
        m.joined(2, 1, 2, 4, Duration::from_millis(5));
        m.restart("worker_failure");
        m.worker_exits(1, 1);
        m.worker_exits(-9, 1);
        m.membership("peer_lost");
        m.gpu_fault(Some(79), "XID 79", "drain", "acted");
        m.recovery("worker failure", [Duration::from_millis(1); 4], Duration::from_millis(4));
        let text = m.render().unwrap();
        let names = names(&text);
        for name in [
            "muster_restarts_total",
            "muster_restarts_remaining",
            "muster_rendezvous_rounds_total",
            "muster_rendezvous_seconds_count",
            "muster_round",
            "muster_membership_changes_total",
            "muster_world_size",
            "muster_group_world_size",
            "muster_group_rank",
            "muster_local_workers",
            "muster_worker_exits_total",
            "muster_gpu_faults_total",
            "muster_recovery_phase_seconds_bucket",
            "muster_recovery_seconds_sum",
            "muster_state",
            "muster_productive_seconds_total",
            "muster_lost_seconds_total",
        ] {
            assert!(names.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.contains(r#"muster_world_size{run_id="job1",hostname="node-a",group_rank="1"} 4"#), "{text}");
        assert!(text.contains(r#"signal="SIGKILL""#), "{text}");
        assert!(text.contains(r#"state="running"} 1"#) && text.contains(r#"state="stopping"} 0"#), "{text}");
    }

    #[test]
    fn exits_are_labelled_by_code_or_signal() {
        assert_eq!(exit_labels(1), vec![("exit_code", "1".to_string()), ("signal", String::new())]);
        assert_eq!(exit_labels(-15), vec![("exit_code", String::new()), ("signal", "SIGTERM".to_string())]);
    }
}
