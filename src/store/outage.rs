//! When a store's failures are an outage worth a line: failures for [`OUTAGE_AFTER`] in a row, said once,
//! and its end said once. A blip (a leader election, an API server slow for a second after its restart)
//! is not news; an agent that says one outage twice makes its users look for two.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Failures this long in a row are an outage, said once; a leader election (1.1–1.6 s here) is not one.
pub const OUTAGE_AFTER: Duration = Duration::from_secs(3);

/// One store's outage, shared by every request to it.
#[derive(Default)]
pub struct Outage(Mutex<State>);

#[derive(Default)]
struct State {
    since: Option<Instant>,
    said: bool,
}

impl Outage {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long failures have lasted in a row, counting this one.
    pub fn lasted(&self) -> Duration {
        self.state().since.get_or_insert_with(Instant::now).elapsed()
    }

    /// A failure: true when the outage is to be said now (it has lasted [`OUTAGE_AFTER`] and was not said).
    pub fn failed(&self) -> bool {
        let mut state = self.state();
        let since = *state.since.get_or_insert_with(Instant::now);
        let due = !state.said && since.elapsed() >= OUTAGE_AFTER;
        state.said |= due;
        due
    }

    /// Whether this outage has been said (an error need not say it again).
    pub fn said(&self) -> bool {
        self.state().said
    }

    /// An answer: the outage is over; true when it was said, so its end is to be said too.
    pub fn answered(&self) -> bool {
        std::mem::take(&mut *self.state()).said
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blip_is_not_said_and_an_outage_is_said_once() {
        let outage = Outage::default();
        assert!(!outage.failed(), "the first failure is a blip");
        assert!(!outage.answered(), "a blip's end is not said");
        *outage.state() = State { since: Some(Instant::now() - OUTAGE_AFTER), said: false };
        assert!(outage.failed());
        assert!(!outage.failed(), "said once");
        assert!(outage.said());
        assert!(outage.answered());
        assert!(!outage.said() && !outage.answered(), "the next failure starts a new outage");
    }
}
