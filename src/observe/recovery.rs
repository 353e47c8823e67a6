//! A recovery's phases, read off the transitions: it begins when the running group stops (the event that
//! stopped it reached the agent `detect` earlier) and ends when workers run again. Every transition in
//! between adds the time spent in the state it leaves to one phase, so the phases tile the recovery: their
//! sum is the recovery time. A recovery that ends the agent instead (drained, failed, interrupted) is none.

use std::time::{Duration, Instant};

/// One recovery, finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// What stopped the group (the stop's cause, as transition events name it).
    pub cause: String,
    /// detect, stop, rendezvous, spawn (see `metrics::PHASES`).
    pub phases: [Duration; 4],
    pub total: Duration,
}

#[derive(Debug, Default)]
pub struct Tracker {
    open: Option<(Instant, String, [Duration; 4])>,
}

/// The phase that time spent in `state` counts toward, during a recovery.
fn phase_of(state: &str) -> Option<usize> {
    match state {
        "stopping" => Some(1),
        "restarting" | "rendezvous" => Some(2),
        "starting" => Some(3),
        _ => None,
    }
}

impl Tracker {
    /// The agent went `from` → `to` at `now` after `spent` in `from`; `input_at` is when the input that
    /// caused it reached the agent, `cause` the stop's cause when `to` is stopping. Returns the recovery
    /// this transition finished.
    pub fn transition(
        &mut self,
        from: &str,
        to: &str,
        spent: Duration,
        now: Instant,
        input_at: Instant,
        cause: &str,
    ) -> Option<Recovery> {
        if from == "running" && to == "stopping" {
            let mut phases = [Duration::ZERO; 4];
            phases[0] = now.saturating_duration_since(input_at);
            self.open = Some((input_at.min(now), cause.to_string(), phases));
            return None;
        }
        let (started, cause, mut phases) = self.open.take()?;
        match phase_of(from) {
            Some(i) => phases[i] += spent,
            None => return None,
        }
        if to == "running" {
            return Some(Recovery { cause, phases, total: now.saturating_duration_since(started) });
        }
        if phase_of(to).is_some() {
            self.open = Some((started, cause, phases));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plays `path` (state, ms spent in it before the next) with the input arriving `detect_ms` before the
    /// stop; returns what the tracker finished.
    fn play(path: &[(&str, u64)], detect_ms: u64) -> Vec<Recovery> {
        let mut t = Tracker::default();
        let base = Instant::now();
        let mut now = base + Duration::from_millis(detect_ms);
        let input_at = base;
        let mut done = Vec::new();
        for w in path.windows(2) {
            let ((from, spent), (to, _)) = (w[0], w[1]);
            let spent = Duration::from_millis(spent);
            if from != "running" {
                now += spent;
            }
            done.extend(t.transition(from, to, spent, now, input_at, "worker failure"));
        }
        done
    }

    #[test]
    fn phases_tile_the_recovery() {
        let path =
            [("running", 0), ("stopping", 40), ("restarting", 2), ("rendezvous", 5), ("starting", 20), ("running", 0)];
        let done = play(&path, 3);
        assert_eq!(done.len(), 1);
        let ms = |d: Duration| d.as_millis() as u64;
        assert_eq!(done[0].phases.map(ms), [3, 40, 7, 20]);
        assert_eq!(ms(done[0].total), 70);
        assert_eq!(done[0].cause, "worker failure");
    }

    #[test]
    fn a_rejoin_in_the_middle_counts_toward_the_rendezvous() {
        let path = [
            ("running", 0),
            ("stopping", 10),
            ("restarting", 1),
            ("rendezvous", 5),
            ("restarting", 1),
            ("rendezvous", 5),
            ("starting", 10),
            ("running", 0),
        ];
        assert_eq!(play(&path, 0)[0].phases[2], Duration::from_millis(12));
    }

    #[test]
    fn no_recovery_without_a_running_group_before_or_after() {
        assert!(play(&[("rendezvous", 5), ("starting", 5), ("running", 0)], 0).is_empty(), "a launch");
        assert!(play(&[("running", 0), ("stopping", 5), ("draining", 5), ("drained", 0)], 0).is_empty());
        assert!(play(&[("running", 0), ("stopping", 5), ("restarting", 1), ("failed", 0)], 0).is_empty());
        assert!(play(&[("running", 0), ("finishing", 5), ("succeeded", 0)], 0).is_empty());
    }
}
