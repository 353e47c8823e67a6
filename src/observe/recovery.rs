//! A recovery's phases, read off the transitions: it begins when the running group stops (the event that
//! stopped it reached the agent `detect` earlier) and ends when workers run again. Every transition in
//! between adds the time spent in the state it leaves to one phase, so the phases tile the recovery: their
//! sum is the recovery time. A recovery that ends the agent instead (drained, failed, interrupted) is none.

use std::time::{Duration, Instant};

use super::record::{PhaseKind, StopKind};

/// One recovery, finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// What stopped the group (the stop's cause, as transition events name it).
    pub cause: &'static str,
    /// detect, stop, rendezvous, spawn (see `metrics::PHASES`).
    pub phases: [Duration; 4],
    pub total: Duration,
    /// Workers kept in place (0: every worker started again).
    pub kept: u32,
}

#[derive(Debug, Default)]
pub struct Tracker {
    open: Option<(Instant, &'static str, [Duration; 4])>,
}

/// The phase that time spent in `state` counts toward, during a recovery.
fn phase_of(state: PhaseKind) -> Option<usize> {
    match state {
        PhaseKind::Stopping => Some(1),
        PhaseKind::Restarting | PhaseKind::Rendezvous => Some(2),
        PhaseKind::Starting => Some(3),
        _ => None,
    }
}

impl Tracker {
    /// The agent went `from` → `to` at `now` after `spent` in `from`; `input_at` is when the input that
    /// caused it reached the agent, `cause` the stop's cause when `to` is stopping. Returns the recovery
    /// this transition finished; `kept`, the workers the group now running kept in place.
    #[allow(clippy::too_many_arguments)]
    pub fn transition(
        &mut self,
        from: PhaseKind,
        to: PhaseKind,
        spent: Duration,
        now: Instant,
        input_at: Instant,
        cause: Option<StopKind>,
        kept: u32,
    ) -> Option<Recovery> {
        if from == PhaseKind::Running && to == PhaseKind::Stopping {
            let mut phases = [Duration::ZERO; 4];
            phases[0] = now.saturating_duration_since(input_at);
            self.open = Some((input_at.min(now), cause.map_or("", StopKind::as_str), phases));
            return None;
        }
        let (started, cause, mut phases) = self.open.take()?;
        match phase_of(from) {
            Some(i) => phases[i] += spent,
            None => return None,
        }
        if to == PhaseKind::Running {
            return Some(Recovery { cause, phases, total: now.saturating_duration_since(started), kept });
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
    fn play(path: &[(PhaseKind, u64)], detect_ms: u64) -> Vec<Recovery> {
        let mut t = Tracker::default();
        let base = Instant::now();
        let mut now = base + Duration::from_millis(detect_ms);
        let input_at = base;
        let mut done = Vec::new();
        for w in path.windows(2) {
            let ((from, spent), (to, _)) = (w[0], w[1]);
            let spent = Duration::from_millis(spent);
            if from != PhaseKind::Running {
                now += spent;
            }
            done.extend(t.transition(from, to, spent, now, input_at, Some(StopKind::WorkerFailure), 0));
        }
        done
    }

    #[test]
    fn phases_tile_the_recovery() {
        use PhaseKind::*;
        let path =
            [(Running, 0), (Stopping, 40), (Restarting, 2), (Rendezvous, 5), (Starting, 20), (Running, 0)];
        let done = play(&path, 3);
        assert_eq!(done.len(), 1);
        let ms = |d: Duration| d.as_millis() as u64;
        assert_eq!(done[0].phases.map(ms), [3, 40, 7, 20]);
        assert_eq!(ms(done[0].total), 70);
        assert_eq!(done[0].cause, "worker failure");
    }

    #[test]
    fn a_rejoin_in_the_middle_counts_toward_the_rendezvous() {
        use PhaseKind::*;
        let path = [
            (Running, 0),
            (Stopping, 10),
            (Restarting, 1),
            (Rendezvous, 5),
            (Restarting, 1),
            (Rendezvous, 5),
            (Starting, 10),
            (Running, 0),
        ];
        assert_eq!(play(&path, 0)[0].phases[2], Duration::from_millis(12));
    }

    #[test]
    fn no_recovery_without_a_running_group_before_or_after() {
        use PhaseKind::*;
        assert!(play(&[(Rendezvous, 5), (Starting, 5), (Running, 0)], 0).is_empty(), "a launch");
        assert!(play(&[(Running, 0), (Stopping, 5), (Draining, 5), (Drained, 0)], 0).is_empty());
        assert!(play(&[(Running, 0), (Stopping, 5), (Restarting, 1), (Failed, 0)], 0).is_empty());
        assert!(play(&[(Running, 0), (Finishing, 5), (Succeeded, 0)], 0).is_empty());
    }
}
