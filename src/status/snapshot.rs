//! What `muster status` shows: each node's state decided from the store's view (pure), and its rendering as
//! a table or one JSON object.

use serde::Serialize;

use crate::rendezvous::{JobRestarts, JobView, KeptOut, NodeView};

/// A heartbeat this many periods old has missed at least one beat.
const STALE_PERIODS: u64 = 2;

/// The job at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub run_id: String,
    pub endpoint: String,
    pub script: String,
    pub nnodes: String,
    /// The round counter.
    pub round: u64,
    /// The round the members below belong to.
    pub sealed_round: Option<u64>,
    pub phase: JobPhase,
    /// Workers in the sealed round.
    pub world_size: u32,
    /// Members in group-rank order, then the nodes outside the sealed round.
    pub nodes: Vec<Row>,
    /// The last hang verdict, when hang detection found one.
    pub last_hang: Option<String>,
    /// The job's restarts over every node, and its budget.
    pub restarts: JobRestarts,
    /// The hosts `--exclude-after` keeps out, with their incidents.
    pub kept_out: Vec<KeptOut>,
    /// `--readmit HOST`: the host let back in, and how many of its incidents were forgotten.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readmitted: Option<Readmitted>,
    /// `--forget`: how many of the job's keys were deleted (the snapshot shows the job as it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Readmitted {
    pub host: String,
    pub forgotten: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobPhase {
    /// No round sealed yet.
    Forming,
    /// The sealed round runs.
    Running,
    /// The next round is open and not sealed yet.
    Reforming,
    /// Finished or failed for good.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// In the sealed round; None for joiners and spares.
    pub group_rank: Option<u32>,
    pub node: String,
    pub addr: Option<String>,
    pub nproc: Option<u32>,
    pub state: NodeState,
    pub restarts: Option<u32>,
    /// Rounds it joined with its workers kept in place (`--in-place`; None: not published).
    pub in_place: Option<u32>,
    /// None when the node never beat or beats without a time (an older agent).
    pub heartbeat_age_ms: Option<u64>,
    /// How long ago the node's least recently progressing rank showed progress (hang detection on).
    pub progress_age_ms: Option<u64>,
    /// The lowest share of its ranks' stack samples spent waiting in collectives over its last straggler
    /// window (`crate::straggler`): a straggler's is far below the others'.
    pub wait_percent: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// In the running round, alive, beating.
    Running,
    /// Alive, but its heartbeat missed a period: hung or stopped (its neighbours evict it after
    /// `keep_alive_max_attempt` periods).
    Stale,
    /// Its liveness key is gone: the agent died, left or was evicted.
    Lost,
    /// Has joined the open round.
    Joining,
    /// A member of the last round that has not joined the open one yet (stopping its workers).
    Reforming,
    /// Waiting for the next round: the group is full.
    Spare,
}

impl NodeState {
    fn name(self) -> &'static str {
        match self {
            NodeState::Running => "running",
            NodeState::Stale => "stale",
            NodeState::Lost => "lost",
            NodeState::Joining => "joining",
            NodeState::Reforming => "re-forming",
            NodeState::Spare => "spare",
        }
    }
}

impl JobPhase {
    fn name(self) -> &'static str {
        match self {
            JobPhase::Forming => "forming",
            JobPhase::Running => "running",
            JobPhase::Reforming => "re-forming",
            JobPhase::Closed => "closed",
        }
    }
}

/// The job's restarts against its budget, one line.
fn restarts_line(r: &JobRestarts) -> String {
    if let Some(line) = &r.over_budget {
        return format!("ended: {line}\n");
    }
    match (&r.budget, r.left) {
        (Some(spec), Some(left)) => format!(
            "job restarts: {} in all, {} counting against --job-max-restarts {spec}: {left} left\n",
            r.total, r.in_window
        ),
        _ => format!("job restarts: {} in all (no --job-max-restarts)\n", r.total),
    }
}

/// A node's state: `member` of the sealed round, `age_ms` of its heartbeat against `interval_ms`.
pub fn node_state(node: &NodeView, member: bool, age_ms: Option<u64>) -> NodeState {
    let stale = match (age_ms, node.heartbeat.as_ref().and_then(|h| h.interval_ms)) {
        (Some(age), Some(every)) => age > every.saturating_mul(STALE_PERIODS),
        _ => false,
    };
    match () {
        _ if !node.alive => NodeState::Lost,
        _ if node.joining => NodeState::Joining,
        _ if node.waiting || !member => NodeState::Spare,
        _ if stale => NodeState::Stale,
        _ => NodeState::Running,
    }
}

impl Snapshot {
    /// The view at `now_ms` (this machine's clock; a heartbeat from a clock ahead of it is 0 ms old).
    pub fn from_view(view: &JobView, endpoint: &str, now_ms: u64) -> Snapshot {
        let phase = match view.sealed_round {
            _ if view.closed => JobPhase::Closed,
            None => JobPhase::Forming,
            Some(r) if r == view.round => JobPhase::Running,
            Some(_) => JobPhase::Reforming,
        };
        let row = |group_rank: Option<u32>, n: &NodeView| {
            let age = n.heartbeat.as_ref().and_then(|h| h.at_ms).map(|at| now_ms.saturating_sub(at));
            let mut state = node_state(n, group_rank.is_some(), age);
            if phase == JobPhase::Reforming && state == NodeState::Running {
                state = NodeState::Reforming;
            }
            Row {
                group_rank,
                node: n.id.clone(),
                addr: n.addr.clone(),
                nproc: n.nproc,
                state,
                restarts: n.restarts,
                in_place: n.in_place,
                heartbeat_age_ms: age,
                progress_age_ms: n
                    .heartbeat
                    .as_ref()
                    .and_then(|h| h.progress.iter().map(|(_, ms)| *ms).min())
                    .map(|ms| now_ms.saturating_sub(ms)),
                wait_percent: n.heartbeat.as_ref().and_then(|h| h.pace.as_deref()).and_then(lowest_wait),
            }
        };
        let mut nodes: Vec<Row> = view.members.iter().enumerate().map(|(rank, n)| row(Some(rank as u32), n)).collect();
        nodes.extend(view.others.iter().map(|n| row(None, n)));
        Snapshot {
            run_id: view.run_id.clone(),
            endpoint: endpoint.to_string(),
            script: view.fingerprint.entrypoint.clone(),
            nnodes: view.fingerprint.nnodes.clone(),
            round: view.round,
            sealed_round: view.sealed_round,
            phase,
            world_size: view.members.iter().filter_map(|m| m.nproc).sum(),
            nodes,
            last_hang: view.last_hang.clone(),
            restarts: view.restarts.clone(),
            kept_out: view.kept_out.clone(),
            readmitted: None,
            forgotten: None,
        }
    }

    /// A node whose heartbeat is current (`running`), and its heartbeat's age: the job is not over.
    pub fn beating(&self) -> Option<(String, u64)> {
        let row = self.nodes.iter().find(|r| r.state == NodeState::Running)?;
        Some((row.addr.clone().unwrap_or_else(|| row.node.clone()), row.heartbeat_age_ms.unwrap_or(0)))
    }

    /// A heading line and one aligned row per node.
    pub fn table(&self) -> String {
        let members = self.nodes.iter().filter(|r| r.group_rank.is_some()).count();
        let spares = self.nodes.iter().filter(|r| r.state == NodeState::Spare).count();
        let round = match self.sealed_round {
            Some(s) if s != self.round => format!("round {} (round {s} sealed)", self.round),
            _ => format!("round {}", self.round),
        };
        let mut out = match &self.readmitted {
            Some(r) => format!("readmitted {}: {} incident(s) forgotten; it may join again\n", r.host, r.forgotten),
            None => String::new(),
        };
        if let Some(keys) = self.forgotten {
            out.push_str(&format!(
                "forgot job {}: {keys} key(s) deleted, its kept-out hosts' incidents kept (a job with the same id reads them); as it was:\n",
                self.run_id
            ));
        }
        out.push_str(&format!(
            "job {} at {}: {round}, {}, {members} member(s), world size {}, {spares} spare(s) waiting; {} --nnodes {}\n",
            self.run_id,
            self.endpoint,
            self.phase.name(),
            self.world_size,
            self.script,
            self.nnodes
        ));
        if let Some(line) = &self.last_hang {
            out.push_str(&format!("last {line}\n"));
        }
        out.push_str(&restarts_line(&self.restarts));
        for host in &self.kept_out {
            out.push_str(&format!("{}\n", host.line()));
        }
        let dash = || "-".to_string();
        let opt = |v: Option<u32>| v.map_or_else(dash, |v| v.to_string());
        let ago = |ms: Option<u64>| ms.map_or_else(dash, |ms| format!("{:.1}s ago", ms as f64 / 1000.0));
        // The in-place column only where a node re-formed in place, the progress column where hang detection
        // reports progress, the wait column where straggler detection reports waits.
        let shown = [
            true,
            true,
            true,
            true,
            true,
            true,
            self.nodes.iter().any(|r| r.in_place.is_some_and(|n| n > 0)),
            true,
            self.nodes.iter().any(|r| r.progress_age_ms.is_some()),
            self.nodes.iter().any(|r| r.wait_percent.is_some()),
        ];
        let head = ["GROUP_RANK", "NODE", "ADDRESS", "NPROC", "STATE", "RESTARTS", "IN PLACE", "HEARTBEAT", "PROGRESS", "WAIT"];
        let keep = |cells: Vec<String>| cells.into_iter().zip(shown).filter(|(_, s)| *s).map(|(c, _)| c).collect::<Vec<String>>();
        let mut rows = vec![keep(head.iter().map(|h| h.to_string()).collect())];
        rows.extend(self.nodes.iter().map(|r| {
            keep(vec![
                opt(r.group_rank),
                r.node.clone(),
                r.addr.clone().unwrap_or_else(dash),
                opt(r.nproc),
                r.state.name().to_string(),
                opt(r.restarts),
                opt(r.in_place),
                ago(r.heartbeat_age_ms),
                ago(r.progress_age_ms),
                r.wait_percent.map_or_else(dash, |w| format!("{w}%")),
            ])
        }));
        let columns = rows[0].len();
        let widths: Vec<usize> =
            (0..columns).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        for r in &rows {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        out
    }

    /// One JSON object, the same fields as the table.
    pub fn json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

/// The lowest wait share of a heartbeat's straggler window, in percent.
fn lowest_wait(pace: &str) -> Option<u32> {
    let window: crate::straggler::judge::NodeWindow = serde_json::from_str(pace).ok()?;
    let lowest = window.ranks.iter().filter_map(|r| r.wait_share()).min_by(f64::total_cmp)?;
    Some((lowest * 100.0).round() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::{Fingerprint, Heartbeat};

    fn node(id: &str, alive: bool, joining: bool, waiting: bool, at_ms: Option<u64>) -> NodeView {
        NodeView {
            id: id.into(),
            addr: Some("10.0.0.1".into()),
            nproc: Some(2),
            restarts: Some(1),
            in_place: None,
            alive,
            joining,
            waiting,
            heartbeat: Some(Heartbeat { beat: 3, at_ms, interval_ms: Some(5000), progress: Vec::new(), pace: None }),
        }
    }

    fn job(members: Vec<NodeView>, others: Vec<NodeView>, round: u64, sealed: Option<u64>) -> JobView {
        JobView {
            run_id: "job1".into(),
            fingerprint: Fingerprint { entrypoint: "train.py".into(), args: vec![], nproc_spec: "2".into(), nnodes: "2:3".into(), restart_budget: String::new(), exclude_after: String::new() },
            round,
            expected: None,
            closed: false,
            sealed_round: sealed,
            members,
            others,
            last_hang: None,
            restarts: JobRestarts::default(),
            kept_out: Vec::new(),
        }
    }

    #[test]
    fn the_wait_column_shows_each_members_lowest_wait_share() {
        let mut a = node("a_1_0", true, false, false, Some(9_000));
        let pace = r#"{"window":5,"node":"h","id":"a_1_0","group_rank":0,"ranks":[
            {"rank":0,"local_rank":0,"samples":100,"waiting":64},{"rank":1,"local_rank":1,"samples":100,"waiting":3}]}"#;
        if let Some(h) = a.heartbeat.as_mut() {
            h.pace = Some(pace.replace('\n', ""));
        }
        let snap = Snapshot::from_view(&job(vec![a, node("b_2_0", true, false, false, Some(9_000))], vec![], 2, Some(2)), "h:1", 10_000);
        assert_eq!(snap.nodes.iter().map(|r| r.wait_percent).collect::<Vec<_>>(), [Some(3), None]);
        let table = snap.table();
        assert!(table.contains("WAIT") && table.lines().any(|l| l.starts_with("0 ") && l.trim_end().ends_with("3%")), "{table}");
    }

    #[test]
    fn progress_and_the_last_hang_show_when_hang_detection_reports_them() {
        let mut a = node("a_1_0", true, false, false, Some(9_000));
        if let Some(h) = a.heartbeat.as_mut() {
            h.progress = vec![(0, 7_000), (1, 8_000)];
        }
        let mut view = job(vec![a, node("b_2_0", true, false, false, Some(9_000))], vec![], 2, Some(2));
        view.last_hang = Some("hang: rank 3 (node b) made no progress since 12:00:00".into());
        let table = Snapshot::from_view(&view, "h:1", 10_000).table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[1], "last hang: rank 3 (node b) made no progress since 12:00:00");
        assert_eq!(lines[2], "job restarts: 0 in all (no --job-max-restarts)");
        assert_eq!(lines[3], "GROUP_RANK  NODE   ADDRESS   NPROC  STATE    RESTARTS  HEARTBEAT  PROGRESS");
        assert_eq!(lines[4], "0           a_1_0  10.0.0.1  2      running  1         1.0s ago   3.0s ago");
        assert_eq!(lines[5], "1           b_2_0  10.0.0.1  2      running  1         1.0s ago   -");
    }

    #[test]
    fn the_in_place_column_shows_once_a_node_re_formed_in_place() {
        let a = NodeView { in_place: Some(0), ..node("a_1_0", true, false, false, Some(9_000)) };
        let b = NodeView { in_place: Some(3), ..node("b_2_0", true, false, false, Some(9_000)) };
        let without = Snapshot::from_view(&job(vec![a.clone()], vec![], 2, Some(2)), "h:1", 10_000).table();
        assert!(!without.contains("IN PLACE"), "{without}");
        let table = Snapshot::from_view(&job(vec![a, b], vec![], 2, Some(2)), "h:1", 10_000).table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[2], "GROUP_RANK  NODE   ADDRESS   NPROC  STATE    RESTARTS  IN PLACE  HEARTBEAT");
        assert_eq!(lines[3], "0           a_1_0  10.0.0.1  2      running  1         0         1.0s ago");
        assert_eq!(lines[4], "1           b_2_0  10.0.0.1  2      running  1         3         1.0s ago");
    }

    #[test]
    fn node_states_follow_liveness_rounds_and_heartbeat_age() {
        let cases = [
            // (alive, joining, waiting, member, age ms) -> state
            ((true, false, false, true, Some(1000)), NodeState::Running),
            ((true, false, false, true, None), NodeState::Running),
            ((true, false, false, true, Some(10_001)), NodeState::Stale),
            ((false, false, false, true, Some(100)), NodeState::Lost),
            ((false, true, false, true, Some(100)), NodeState::Lost),
            ((true, true, false, true, Some(100)), NodeState::Joining),
            ((true, true, false, false, Some(100)), NodeState::Joining),
            ((true, false, true, false, Some(100)), NodeState::Spare),
        ];
        for ((alive, joining, waiting, member, age), want) in cases {
            let n = node("n", alive, joining, waiting, Some(0));
            assert_eq!(node_state(&n, member, age), want, "{alive} {joining} {waiting} {member} {age:?}");
        }
    }

    #[test]
    fn a_running_job_renders_as_a_table_and_as_json() {
        let view = job(
            vec![node("a_1_0", true, false, false, Some(9_000)), node("b_2_0", true, false, false, None)],
            vec![node("c_3_0", true, false, true, Some(9_500))],
            2,
            Some(2),
        );
        let s = Snapshot::from_view(&view, "127.0.0.1:29400", 10_000);
        assert_eq!(s.phase, JobPhase::Running);
        assert_eq!(s.world_size, 4);
        let table = s.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "job job1 at 127.0.0.1:29400: round 2, running, 2 member(s), world size 4, 1 spare(s) waiting; \
             train.py --nnodes 2:3"
        );
        assert_eq!(lines[1], "job restarts: 0 in all (no --job-max-restarts)");
        assert_eq!(lines[2], "GROUP_RANK  NODE   ADDRESS   NPROC  STATE    RESTARTS  HEARTBEAT");
        assert_eq!(lines[3], "0           a_1_0  10.0.0.1  2      running  1         1.0s ago");
        assert_eq!(lines[4], "1           b_2_0  10.0.0.1  2      running  1         -");
        assert_eq!(lines[5], "-           c_3_0  10.0.0.1  2      spare    1         0.5s ago");
        let budget = JobRestarts { total: 3, in_window: 2, budget: Some("10/1h".into()), left: Some(8), over_budget: None };
        let with = Snapshot::from_view(&JobView { restarts: budget, ..view.clone() }, "h:1", 10_000).table();
        assert!(with.contains("job restarts: 3 in all, 2 counting against --job-max-restarts 10/1h: 8 left"), "{with}");
        let json: serde_json::Value = serde_json::from_str(&s.json().expect("json")).expect("valid JSON");
        assert_eq!(json["phase"], "running");
        assert_eq!(json["round"], 2);
        assert_eq!(json["nodes"][0]["group_rank"], 0);
        assert_eq!(json["nodes"][0]["state"], "running");
        assert_eq!(json["nodes"][0]["heartbeat_age_ms"], 1000);
        assert_eq!(json["nodes"][1]["heartbeat_age_ms"], serde_json::Value::Null);
        assert_eq!(json["nodes"][2]["group_rank"], serde_json::Value::Null);
        assert_eq!(json["nodes"][2]["state"], "spare");
    }

    #[test]
    fn an_open_round_shows_who_rejoined_and_who_is_lost() {
        let view = job(
            vec![node("a", true, true, false, Some(0)), node("b", true, false, false, Some(0)), node("c", false, false, false, Some(0))],
            vec![node("d", true, true, false, Some(0))],
            4,
            Some(3),
        );
        let s = Snapshot::from_view(&view, "h:1", 100);
        assert_eq!(s.phase, JobPhase::Reforming);
        let states: Vec<NodeState> = s.nodes.iter().map(|r| r.state).collect();
        assert_eq!(states, [NodeState::Joining, NodeState::Reforming, NodeState::Lost, NodeState::Joining]);
        assert!(s.table().starts_with("job job1 at h:1: round 4 (round 3 sealed), re-forming, 3 member(s), world size 6"));
        let closed = Snapshot::from_view(&JobView { closed: true, ..view.clone() }, "h:1", 100);
        assert_eq!(closed.phase, JobPhase::Closed);
        let forming = Snapshot::from_view(&job(vec![], vec![node("a", true, true, false, None)], 0, None), "h:1", 0);
        assert_eq!((forming.phase, forming.world_size, forming.nodes[0].state), (JobPhase::Forming, 0, NodeState::Joining));
    }
}
