//! The job's restart budget (`--job-max-restarts N[/WINDOW]`). `--max-restarts` counts per agent, as
//! torchrun does, so a job of many nodes can restart far more often than it says, and a node replaced or
//! rejoining starts again from zero. The job's count lives in the rendezvous store instead: each restart
//! spent is a key `restarts/<round>-<unix ms>-<node>` = its cause, under the run's prefix, so it outlives
//! whichever agent spent it.
//!
//! One incident is one restart of the job: the round that failed is in the key, and the nodes that spent a
//! restart for the same round (a crash on one node breaks its peers' collectives too) count once. With a
//! window only the incidents of the last WINDOW count, by the wall clock of the node that recorded them (the
//! hosts' clocks differ by far less than a window worth having), and older keys are deleted as they age out.
//! When a restart takes the job over its budget, its agent closes the job with the reason, so that every
//! agent, and a node that joins later, ends with the same line and the same exit code.

use std::collections::BTreeMap;
use std::time::Duration;

use super::wire::Closure;
use super::{unix_ms, RdzvError, Rendezvous};
use crate::store::Store;

/// The key (under the run's prefix) the restarts live under.
pub(super) const RESTARTS: &str = "restarts/";

/// `--job-max-restarts`: at most `max` restarts of the job, over its whole run or within any `window`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartBudget {
    pub max: u32,
    pub window: Option<Duration>,
}

impl RestartBudget {
    /// As the flag is written (`10/1h`), for lines and the launch fingerprint.
    pub fn spec(&self) -> String {
        match self.window {
            Some(w) => format!("{}/{}", self.max, duration_text(w)),
            None => self.max.to_string(),
        }
    }
}

/// `N[/WINDOW]`: N > 0, WINDOW a whole number with s, m, h or d (a bare number is seconds).
impl std::str::FromStr for RestartBudget {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<RestartBudget, Self::Err> {
        const SYNTAX: &str = "use N or N/WINDOW with N > 0 and a window such as 90s, 10m, 1h or 2d";
        let (n, window) = match s.trim().split_once('/') {
            Some((n, w)) => (n, Some(w.trim())),
            None => (s.trim(), None),
        };
        let max = n.trim().parse::<u32>().ok().filter(|n| *n > 0).ok_or(SYNTAX)?;
        let window = match window {
            None => None,
            Some(w) => {
                let (digits, unit) = w.split_at(w.find(|c: char| !c.is_ascii_digit()).unwrap_or(w.len()));
                let scale = match unit {
                    "" | "s" => 1,
                    "m" => 60,
                    "h" => 3600,
                    "d" => 86_400,
                    _ => return Err(SYNTAX),
                };
                let secs = digits.parse::<u64>().ok().filter(|n| *n > 0).and_then(|n| n.checked_mul(scale)).ok_or(SYNTAX)?;
                Some(Duration::from_secs(secs))
            }
        };
        Ok(RestartBudget { max, window })
    }
}

/// `3600s` as `1h`, `600s` as `10m`: the largest unit that divides it.
fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => "0s".into(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// One recorded restart, as its key names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    round: u64,
    at_ms: u64,
}

/// A key's last part, `<round>-<unix ms>-<node>` (the node id may hold dashes). None: not a restart key.
fn entry(name: &str) -> Option<Entry> {
    let last = name.rsplit('/').next()?;
    let mut parts = last.splitn(3, '-');
    let round = parts.next()?.parse().ok()?;
    let at_ms = parts.next()?.parse().ok()?;
    parts.next().filter(|node| !node.is_empty())?;
    Some(Entry { round, at_ms })
}

/// The job's restarts as the keys tell them at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Tally {
    /// Incidents (rounds restarted) ever recorded and still kept.
    pub(super) total: u32,
    /// Those within the window (all of them without one).
    pub(super) in_window: u32,
    /// Keys older than the window: no longer counted, to be deleted.
    pub(super) stale: Vec<String>,
}

/// Counts `names` (the keys under `restarts/`) at `now_ms`: one per round (its earliest record), and those
/// within `window` of now. Unreadable names are not restarts and are left alone.
pub(super) fn tally(names: &[String], now_ms: u64, window: Option<Duration>) -> Tally {
    let parsed: Vec<(&String, Entry)> = names.iter().filter_map(|n| entry(n).map(|e| (n, e))).collect();
    let mut first: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, e) in &parsed {
        let at = first.entry(e.round).or_insert(e.at_ms);
        *at = (*at).min(e.at_ms);
    }
    let since = window.map(|w| now_ms.saturating_sub(u64::try_from(w.as_millis()).unwrap_or(u64::MAX)));
    // A round counts from its first record, and ages out with all of its records at once.
    let counts = |round: u64| since.is_none_or(|since| first.get(&round).is_some_and(|at| *at >= since));
    let in_window = first.keys().filter(|round| counts(**round)).count();
    let stale = parsed.iter().filter(|(_, e)| !counts(e.round)).map(|(name, _)| (*name).clone()).collect();
    Tally { total: first.len() as u32, in_window: in_window as u32, stale }
}

impl RestartBudget {
    /// The line every agent ends with once `count` restarts are over the budget.
    pub fn spent_line(&self, count: u32) -> String {
        let within = self.window.map(|w| format!(" within {}", duration_text(w))).unwrap_or_default();
        format!(
            "the job restarted {count} times{within}, over its budget (--job-max-restarts {}): it fails too \
             often; do not requeue it before the cause is fixed",
            self.spec()
        )
    }
}

impl<S: Store> Rendezvous<S> {
    /// Records the restart this node spends now for the current round (`cause`: what failed; with
    /// `--exclude-after`, this host as its culprit too, `lemons.rs`) and checks the job's budget. Over it, the job is closed with the reason and the error says it: every agent
    /// ends with it. Asked again while the store does not answer, until `store_timeout`.
    pub async fn spend_restart(&self, cause: &str) -> Result<(), RdzvError> {
        let round = self.current.as_ref().map(|c| c.round).unwrap_or(0);
        let now = unix_ms().ok_or_else(|| RdzvError::State("this host's clock is before 1970".into()))?;
        let key = self.key(&format!("{RESTARTS}{round}-{now}-{}", self.me.id));
        let culprit = self.culprit_key(cause)?;
        let mut retry = self.retry("recording a restart");
        let names = loop {
            let recorded = async {
                self.store.set(&key, cause.as_bytes()).await?;
                if let Some(culprit) = &culprit {
                    self.store.set(culprit, b"1").await?;
                }
                self.store.list(&self.key(RESTARTS)).await
            };
            match recorded.await {
                Err(e) => retry.after(e.into()).await?,
                Ok(names) => break names,
            }
        };
        let budget = self.settings.restart_budget.as_ref();
        let tally = tally(&names, now, budget.and_then(|b| b.window));
        for stale in &tally.stale {
            if let Err(e) = self.store.delete(stale).await {
                tracing::debug!("deleting an aged-out restart record: {e}");
            }
        }
        match budget {
            Some(b) if tally.in_window > b.max => {
                let line = b.spent_line(tally.in_window);
                self.close_with(&Closure::OverBudget(line.clone())).await?;
                Err(RdzvError::RestartBudget(line))
            }
            Some(b) => {
                tracing::info!("the job has restarted {} time(s) of --job-max-restarts {}", tally.in_window, b.spec());
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| format!("muster/job/restarts/{k}")).collect()
    }

    #[test]
    fn restarts_count_once_per_round_and_within_the_window() {
        let min = Some(Duration::from_secs(60));
        // (keys, now, window) → (total, in window, stale)
        type Row = (&'static [&'static str], u64, Option<Duration>, (u32, u32, usize));
        let table: &[Row] = &[
            (&[], 1_000_000, None, (0, 0, 0)),
            (&["1-1000-a_1_0", "2-2000-b_2_0"], 1_000_000, None, (2, 2, 0)),
            // One incident seen on two nodes is one restart of the job.
            (&["1-1000-a_1_0", "1-1005-b-host_2_0"], 1_000_000, None, (1, 1, 0)),
            (&["1-1000-a_1_0", "4-950000-a_1_0"], 1_000_000, min, (2, 1, 1)),
            // The round counts from its first record.
            (&["3-930000-a_1_0", "3-990000-b_2_0"], 1_000_000, min, (1, 0, 2)),
            (&["7-940000-a_1_0"], 1_000_000, min, (1, 1, 0)),
            // Not restart keys: left alone.
            (&["x-1-a", "1-2", "1-2-", "junk"], 1_000_000, min, (0, 0, 0)),
        ];
        for (keys, now, window, (total, in_window, stale)) in table {
            let t = tally(&names(keys), *now, *window);
            assert_eq!((t.total, t.in_window, t.stale.len()), (*total, *in_window, *stale), "{keys:?} {window:?}");
        }
    }

    #[test]
    fn budgets_parse_as_written_or_say_what_is_valid() {
        let ok = |s: &str, max: u32, secs: Option<u64>| {
            assert_eq!(s.parse::<RestartBudget>(), Ok(RestartBudget { max, window: secs.map(Duration::from_secs) }), "{s}");
        };
        ok("10", 10, None);
        ok("10/1h", 10, Some(3600));
        ok("2/10s", 2, Some(10));
        ok("2/10", 2, Some(10));
        ok(" 3 / 15m ", 3, Some(900));
        ok("1/2d", 1, Some(172_800));
        for bad in ["", "0", "-1", "x", "2/", "2/0s", "2/1w", "2/h", "2/1.5h", "/1h", "2/1h/3"] {
            assert!(bad.parse::<RestartBudget>().unwrap_err().contains("N/WINDOW"), "{bad}");
        }
        // As written, then read back.
        for spec in ["10/1h", "2/10s", "5", "3/90s"] {
            assert_eq!(spec.parse::<RestartBudget>().map(|b| b.spec()).as_deref(), Ok(spec));
        }
    }

    #[test]
    fn a_closed_job_says_why() {
        let over = Closure::OverBudget("the job restarted 3 times".into());
        assert_eq!(Closure::decode(&over.encode()), over);
        assert_eq!(Closure::decode(&Closure::Finished.encode()), Closure::Finished);
        let failed = Closure::Failed("node n1 failed".into());
        assert_eq!(Closure::decode(&failed.encode()), failed);
        // As agents before the budget closed a job.
        assert_eq!(Closure::decode(b"1"), Closure::Finished);
        assert!(matches!(over.error("job"), RdzvError::RestartBudget(l) if l.contains("3 times")));
    }

    #[test]
    fn the_budget_is_written_as_the_flag_is() {
        let b = |max, w: Option<u64>| RestartBudget { max, window: w.map(Duration::from_secs) };
        assert_eq!(b(10, Some(3600)).spec(), "10/1h");
        assert_eq!(b(2, Some(10)).spec(), "2/10s");
        assert_eq!(b(3, Some(600)).spec(), "3/10m");
        assert_eq!(b(5, None).spec(), "5");
        assert!(b(2, Some(10)).spent_line(3).starts_with("the job restarted 3 times within 10s"));
    }
}
