//! The processes visible in `/proc`: who is whose parent, in which session, alive or not.

use std::collections::HashMap;

/// One line of `/proc/<pid>/stat` that matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub session: i32,
    /// Clock ticks after boot: with the PID, names one process even once the PID is reused.
    pub start: u64,
}

/// Parses `/proc/<pid>/stat`; the command name may contain spaces and parentheses, so fields are counted
/// from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let _pgrp = f.next()?;
    let session = f.next()?.parse().ok()?;
    // Field 22 of stat(5); the fields after the command name start at 3.
    let start = f.nth(22 - 7)?.parse().ok()?;
    Some(ProcStat { pid, state, ppid, session, start })
}

/// Every process visible in `/proc` at one moment, with who is whose parent.
pub struct Tree {
    procs: HashMap<i32, ProcStat>,
}

impl Tree {
    /// Reads `/proc`, skipping processes that vanish while we read.
    pub fn scan() -> Tree {
        let Ok(dir) = std::fs::read_dir("/proc") else { return Tree::of(Vec::new()) };
        let procs = dir
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|t| parse_stat(&t))
            .collect();
        Tree::of(procs)
    }

    /// Reads just these processes (e.g. a cgroup's members), skipping those that are gone.
    pub fn of_pids(pids: &[i32]) -> Tree {
        Tree::of(pids.iter().filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()).filter_map(|t| parse_stat(&t)).collect())
    }

    pub(super) fn of(procs: Vec<ProcStat>) -> Tree {
        Tree { procs: procs.into_iter().map(|p| (p.pid, p)).collect() }
    }

    /// Every process read, zombies included.
    pub fn all(&self) -> impl Iterator<Item = &ProcStat> {
        self.procs.values()
    }

    pub fn get(&self, pid: i32) -> Option<&ProcStat> {
        self.procs.get(&pid)
    }

    /// The processes that have not exited (a zombie holds nothing but its PID).
    pub fn live(&self) -> impl Iterator<Item = &ProcStat> {
        self.procs.values().filter(|p| p.state != 'Z' && p.state != 'X')
    }

    /// `pid`, its parent, its parent's parent... up to init.
    pub(super) fn lineage(&self, pid: i32) -> impl Iterator<Item = &ProcStat> {
        std::iter::successors(self.procs.get(&pid), |p| self.procs.get(&p.ppid)).take(64)
    }

    /// Whether `pid` is below `ancestor`.
    pub fn descends(&self, pid: i32, ancestor: i32) -> bool {
        self.lineage(pid).skip(1).any(|p| p.pid == ancestor)
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_stat, ProcStat, Tree};

    #[test]
    fn descendants_through_adoption_and_new_sessions() {
        let p = |pid, ppid, session| ProcStat { pid, state: 'S', ppid, session, start: 0 };
        // 10 is the agent; 11 a worker; 20 its child in a session of its own; 30 a daemon adopted by the agent;
        // 40 someone else's process.
        let tree = Tree::of(vec![p(1, 0, 1), p(10, 1, 5), p(11, 10, 11), p(20, 11, 20), p(30, 10, 25), p(40, 1, 40)]);
        let cases = [(11, true), (20, true), (30, true), (40, false), (10, false), (1, false), (99, false)];
        for (pid, below_agent) in cases {
            assert_eq!(tree.descends(pid, 10), below_agent, "{pid}");
        }
        assert!(tree.descends(10, 1), "everything descends from init, the agent as PID 1 included");
        let lineage: Vec<i32> = tree.lineage(20).map(|p| p.pid).collect();
        assert_eq!(lineage, [20, 11, 10, 1]);
    }

    #[test]
    fn stat_with_odd_command_names() {
        let line = "4242 (py (worker) 1) S 17 4242 4242 0 -1 4194560 1 0 0 0 5 2 0 0 20 0 1 0 987654 1000 2";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.pid, s.state, s.ppid, s.session, s.start), (4242, 'S', 17, 4242, 987654));
        assert!(parse_stat("garbage").is_none());
    }
}
