//! The rendezvous's records as stored: the launch fingerprint, a joiner's record, the seal, each member's
//! assignment and the round counter. Pure encode/decode, unit-tested.

use serde::{Deserialize, Serialize};

use super::{NodeInfo, RdzvError};

/// What every member publishes; the first member's fingerprint is the job's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub entrypoint: String,
    pub args: Vec<String>,
    /// `--nproc-per-node` as given: `gpu` matches `gpu` even when the counts differ between nodes.
    pub nproc_spec: String,
    /// `--nnodes` as the config resolved it, `MIN:MAX`.
    pub nnodes: String,
    /// `--job-max-restarts` as written (`10/1h`; empty: none): every node must count against the same
    /// budget, and `muster status` reads it here. Absent from agents before it.
    #[serde(default)]
    pub restart_budget: String,
    /// `--exclude-after` as written (empty: none): every node keeps the same memory of lemon hosts.
    #[serde(default)]
    pub exclude_after: String,
}

impl Fingerprint {
    pub(super) fn differences(&self, job: &Fingerprint) -> Vec<String> {
        let mut d = Vec::new();
        if self.entrypoint != job.entrypoint {
            d.push(format!("script '{}' (the job runs '{}')", self.entrypoint, job.entrypoint));
        }
        if self.args != job.args {
            d.push(format!("arguments {:?} (the job uses {:?})", self.args, job.args));
        }
        if self.nnodes != job.nnodes {
            d.push(format!("--nnodes {} (the job uses {})", self.nnodes, job.nnodes));
        }
        if self.nproc_spec != job.nproc_spec {
            d.push(format!("--nproc-per-node {} (the job uses {})", self.nproc_spec, job.nproc_spec));
        }
        if self.restart_budget != job.restart_budget {
            let shown = |b: &str| if b.is_empty() { "none".to_string() } else { b.to_string() };
            d.push(format!("--job-max-restarts {} (the job uses {})", shown(&self.restart_budget), shown(&job.restart_budget)));
        }
        if self.exclude_after != job.exclude_after {
            let shown = |b: &str| if b.is_empty() { "none".to_string() } else { b.to_string() };
            d.push(format!("--exclude-after {} (the job uses {})", shown(&self.exclude_after), shown(&job.exclude_after)));
        }
        d
    }
}

/// Why the job is closed (`closed`): it finished, it failed on a node out of restarts (with that node's
/// line), its restart budget is spent (with the line every agent ends with), or the store's host was
/// stopped by a signal (its number and line: every agent ends with that signal's code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closure {
    Finished,
    Failed(String),
    OverBudget(String),
    Stopped { signal: i32, line: String },
}

const OVER_BUDGET: &str = "over budget: ";
const FAILED: &str = "failed: ";
const STOPPED: &str = "stopped: ";

impl Closure {
    pub(super) fn encode(&self) -> Vec<u8> {
        match self {
            Closure::Finished => b"1".to_vec(),
            Closure::Failed(line) => format!("{FAILED}{line}").into_bytes(),
            Closure::OverBudget(line) => format!("{OVER_BUDGET}{line}").into_bytes(),
            Closure::Stopped { signal, line } => format!("{STOPPED}{signal} {line}").into_bytes(),
        }
    }

    /// Any other value is a close as agents before the reasons wrote it (`1`).
    pub(super) fn decode(v: &[u8]) -> Closure {
        let text = std::str::from_utf8(v).unwrap_or_default();
        if let Some(line) = text.strip_prefix(OVER_BUDGET) {
            return Closure::OverBudget(line.to_string());
        }
        let stopped = text.strip_prefix(STOPPED).and_then(|rest| rest.split_once(' '));
        if let Some((signal, line)) = stopped.and_then(|(n, line)| Some((n.parse().ok()?, line))) {
            return Closure::Stopped { signal, line: line.to_string() };
        }
        match text.strip_prefix(FAILED) {
            Some(line) => Closure::Failed(line.to_string()),
            None => Closure::Finished,
        }
    }

    /// What a node that finds the job closed ends with.
    pub fn error(self, run_id: &str) -> RdzvError {
        match self {
            Closure::Finished => RdzvError::Closed(run_id.to_string()),
            Closure::Failed(line) => RdzvError::FailedElsewhere(line),
            Closure::OverBudget(line) => RdzvError::RestartBudget(line),
            Closure::Stopped { signal, line } => RdzvError::StoppedElsewhere { signal, line },
        }
    }
}

/// A joiner's record for one round (`r/<R>/m/<slot>`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) node: NodeInfo,
    pub(super) slot: i64,
    pub(super) prev_rank: Option<u32>,
    /// The round `prev_rank` was held in: only the members of the latest round any joiner comes from keep
    /// their order; a node that returns from an older one (evicted while cut off) is a newcomer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) prev_round: Option<u64>,
    pub(super) pref_rank: Option<u32>,
    /// Restarts the node had spent when it joined (for `muster status`); absent from agents before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) restarts: Option<u32>,
    /// Rounds the node had joined with its workers kept in place (for `muster status`); absent from agents
    /// before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) in_place: Option<u32>,
}

/// The sealed membership, in group-rank order. Every member reads it once per round, so it is a compact
/// line per member (`<nproc> <addr> <id>`) rather than JSON: at thousands of nodes, parsing dominates.
#[derive(Debug, Clone)]
pub(super) struct Seal {
    pub(super) members: Vec<NodeInfo>,
}

impl Seal {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = String::with_capacity(self.members.len() * 48);
        for m in &self.members {
            out.push_str(&format!("{} {} {}\n", m.nproc, m.addr, m.id));
        }
        out.into_bytes()
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Seal, RdzvError> {
        let text = std::str::from_utf8(bytes).map_err(|e| RdzvError::State(format!("bad seal: {e}")))?;
        // Lines end at '\n' only, as `encode` writes them: `lines()` would also eat a '\r' ending a field.
        let members = text
            .split_terminator('\n')
            .map(|l| {
                let mut f = l.splitn(3, ' ');
                match (f.next().and_then(|n| n.parse().ok()), f.next(), f.next()) {
                    (Some(nproc), Some(addr), Some(id)) => Ok(NodeInfo { id: id.into(), addr: addr.into(), nproc }),
                    _ => Err(RdzvError::State(format!("bad seal line '{l}'"))),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Seal { members })
    }
}


/// One sealed round, from this node's point of view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundInfo {
    pub round: u64,
    pub group_rank: u32,
    pub group_world_size: u32,
    pub base_global_rank: u32,
    pub world_size: u32,
    /// The next two members in rank order (those whose liveness this node watches).
    pub neighbours: Vec<NodeInfo>,
}

impl RoundInfo {
    /// One member's view of the round, as the sealer writes it to `r/<R>/a/<slot>`: O(1) bytes per node,
    /// so nobody reads the whole membership to learn its rank.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = format!("{} {} {} {}\n", self.group_rank, self.group_world_size, self.base_global_rank, self.world_size);
        out.push_str(&String::from_utf8_lossy(&Seal { members: self.neighbours.clone() }.encode()));
        out.into_bytes()
    }

    pub(super) fn decode(round: u64, bytes: &[u8]) -> Result<RoundInfo, RdzvError> {
        let bad = || RdzvError::State("bad rank assignment".into());
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let (head, rest) = text.split_once('\n').unwrap_or((text, ""));
        let n: Vec<u32> = head.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| bad())?;
        let [group_rank, group_world_size, base_global_rank, world_size] = n[..] else { return Err(bad()) };
        let neighbours = Seal::decode(rest.as_bytes())?.members;
        Ok(RoundInfo { round, group_rank, group_world_size, base_global_rank, world_size, neighbours })
    }
}

/// A heartbeat (`hb/<node>`): `<beat> <unix ms> <interval ms>[ progress=<rank>:<unix ms>,...][ pace=<json>]`. Each beat
/// differs from the last (the neighbours compare values); the time and period let a reader (`muster status`)
/// tell its age; with hang detection on, each rank's last progress (at most [`MAX_PROGRESS`] ranks). Agents
/// before the time was added wrote `<beat>` alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub beat: u64,
    /// When it was written, by the writer's clock (milliseconds since the Unix epoch).
    pub at_ms: Option<u64>,
    /// The writer's `keep_alive_interval`.
    pub interval_ms: Option<u64>,
    /// `(global rank, last progress in unix ms)` of the writer's ranks that showed progress.
    pub progress: Vec<(u32, u64)>,
    /// The writer's last complete straggler window (`crate::straggler`), as one line of JSON; always last.
    pub pace: Option<String>,
}

/// Ranks a heartbeat carries the progress of: a heartbeat stays a few hundred bytes.
pub const MAX_PROGRESS: usize = 64;

impl Heartbeat {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = match (self.at_ms, self.interval_ms) {
            (Some(at), Some(every)) => format!("{} {at} {every}", self.beat),
            _ => self.beat.to_string(),
        };
        if !self.progress.is_empty() && self.at_ms.is_some() {
            let marks: Vec<String> = self.progress.iter().take(MAX_PROGRESS).map(|(r, ms)| format!("{r}:{ms}")).collect();
            out.push_str(&format!(" progress={}", marks.join(",")));
        }
        if let Some(pace) = self.pace.as_ref().filter(|p| !p.contains('\n') && self.at_ms.is_some()) {
            out.push_str(&format!(" pace={pace}"));
        }
        out.into_bytes()
    }

    /// None when it is not a heartbeat at all.
    pub fn decode(bytes: &[u8]) -> Option<Heartbeat> {
        let text = std::str::from_utf8(bytes).ok()?;
        // The pace may hold spaces: it is the rest of the value.
        let (text, pace) = match text.split_once(" pace=") {
            Some((head, pace)) => (head, Some(pace.to_string())),
            None => (text, None),
        };
        let mut f = text.split(' ');
        let beat = f.next()?.parse().ok()?;
        let at_ms = f.next().and_then(|v| v.parse().ok());
        let interval_ms = f.next().and_then(|v| v.parse().ok());
        let progress = f
            .next()
            .and_then(|v| v.strip_prefix("progress="))
            .map(|list| {
                list.split(',')
                    .filter_map(|m| m.split_once(':'))
                    .filter_map(|(r, ms)| Some((r.parse().ok()?, ms.parse().ok()?)))
                    .take(MAX_PROGRESS)
                    .collect()
            })
            .unwrap_or_default();
        Some(Heartbeat { beat, at_ms, interval_ms, progress, pace })
    }
}

/// The round counter's value: `R` or `R/expected`.
pub(super) fn parse_round(v: &[u8]) -> (u64, Option<u32>) {
    let s = String::from_utf8_lossy(v);
    let mut it = s.trim().splitn(2, '/');
    let round = it.next().and_then(|r| r.parse().ok()).unwrap_or(0);
    let expected = it.next().and_then(|e| e.parse().ok());
    (round, expected)
}
