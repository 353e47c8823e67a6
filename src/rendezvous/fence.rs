//! Membership is a lease its holder keeps by being heard, and the holder fences itself before the lease can
//! be taken from it.
//!
//! The others evict this node once its heartbeat has not changed for `keep_alive_max_attempt` checks, one
//! per `keep_alive_interval`: never sooner than the window `W = interval × max_attempt` after its last beat
//! reached the store. This node knows when it sent each acknowledged round trip (a beat; a ping between two
//! beats only while its link is broken, so a sound link costs one request per interval), so it can act
//! before that: with no acknowledgement for `W − margin` (`margin = min(interval,
//! W/2)`) and no network path to the store's host, it is cut off and stops its workers while the others
//! still count it in (the renew-deadline < lease-duration rule). The old group's workers are gone before
//! the new group's start. Only a beat renews the membership (the others compare beats), so the fence runs
//! from the last acknowledged beat, and so does the give-up: nodes cut together end within one interval of
//! each other (the phases of their beats).
//!
//! A store that stops answering while its host still completes TCP handshakes is stopped, overloaded or
//! electing: nobody can evict anybody through it, so nothing is fenced, and once it answers again every
//! node gets a full window to be heard before anyone is declared lost (eviction only on evidence).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::Settings;
use crate::store::{Reach, Store};

/// The longest pause between two round trips of the heartbeat task: how soon a cut is noticed, whatever
/// `keep_alive_interval` (beats are still written once per interval; the round trips between are pings).
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// The longest a look for a path to the store's host may take.
const REACH_MAX: Duration = Duration::from_secs(1);

/// The timing every node derives from the same `--rdzv-conf` keys (docs/multi-node.md: "When a node is cut off:
/// timing guarantees").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `W`: how long a silent node stays a member for the others.
    pub window: Duration,
    /// How long after its last acknowledged round trip a node cut off fences itself: `W − margin`.
    pub fence_after: Duration,
    /// Between fencing and the earliest eviction: the fenced stop, the look for a path, and clock slack.
    pub margin: Duration,
    /// The heartbeat task's period while the link is broken (and how soon a waiter looks again).
    pub probe_every: Duration,
    /// Between two beats of a sound link: `keep_alive_interval`.
    pub beat_every: Duration,
    /// One round trip's bound: past it the connection is given up and the next one made afresh.
    pub request_bound: Duration,
    /// The bound of one look for a path to the store's host.
    pub reach_bound: Duration,
}

impl Timing {
    pub fn of(s: &Settings) -> Timing {
        let window = s.keep_alive_interval * s.keep_alive_max_attempt.max(1);
        let margin = s.keep_alive_interval.min(window / 2);
        Timing {
            window,
            fence_after: window - margin,
            margin,
            probe_every: s.keep_alive_interval.min(PROBE_EVERY),
            beat_every: s.keep_alive_interval,
            request_bound: s.heartbeat_timeout.min(window / 3),
            reach_bound: (margin / 3).min(REACH_MAX),
        }
    }

    /// The longest a sound link goes without an acknowledged round trip: a beat's period and its bound.
    pub fn quiet_max(&self) -> Duration {
        self.beat_every + self.request_bound
    }

    /// The grace of the fenced stop: SIGTERM, then SIGKILL, all within the margin that is left.
    pub fn fenced_grace(&self, membership_grace: Duration) -> Duration {
        membership_grace.min(self.margin / 3)
    }
}

/// What this node knows of its own link to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Link {
    /// When the last acknowledged round trip (a beat or a ping) was sent.
    pub(super) acked: Instant,
    /// When the last acknowledged beat was sent: what the others have of this node.
    pub(super) beat_acked: Instant,
    /// Since when every round trip has been acknowledged (the first of the current run's send time).
    pub(super) unbroken_since: Instant,
    /// A round trip failed since the last acknowledgement.
    pub(super) broken: bool,
}

impl Link {
    /// Registered at `now`, a round trip that succeeded: as sound as a whole window of them (a peer that
    /// dies in the first window is believed at once).
    pub(super) fn new(now: Instant, t: &Timing) -> Link {
        Link { acked: now, beat_acked: now, unbroken_since: now.checked_sub(t.window).unwrap_or(now), broken: false }
    }

    /// A round trip sent at `sent` was acknowledged; `beat`: it was a beat.
    pub(super) fn ack(&mut self, sent: Instant, beat: bool) {
        if self.broken {
            self.unbroken_since = sent;
            self.broken = false;
        }
        self.acked = self.acked.max(sent);
        if beat {
            self.beat_acked = self.beat_acked.max(sent);
        }
    }

    pub(super) fn fail(&mut self) {
        self.broken = true;
    }

    /// This node's round was sealed after `unsealed_at` (it saw the round unsealed then, or sent then the
    /// record the sealer read), and a request sent at `asked_at`, after the seal, was answered. No beat runs
    /// while a node joins, and no member watches this node's beats from before the seal, so until the
    /// round's first beat is acknowledged the fence runs from `unsealed_at` as from a beat: never later than
    /// the others' earliest eviction. A join whose requests failed leaves the link sound from `asked_at`.
    pub(super) fn joined(&mut self, unsealed_at: Instant, asked_at: Instant) {
        self.beat_acked = self.beat_acked.max(unsealed_at);
        if self.broken {
            self.unbroken_since = asked_at;
            self.broken = false;
        }
        self.acked = self.acked.max(asked_at);
    }

    /// Whether the store answers this node: no round trip failed since the last acknowledged one, sent
    /// within a beat's period and its bound.
    pub(super) fn answering(&self, now: Instant, t: &Timing) -> bool {
        !self.broken && now.saturating_duration_since(self.acked) <= t.quiet_max()
    }

    /// Whether this node has evidence that a peer is gone: its own round trips were acknowledged throughout
    /// the last window and are still. A node whose own requests failed knows the store was the problem.
    pub(super) fn may_evict(&self, now: Instant, t: &Timing) -> bool {
        self.unbroken_since + t.window <= now && self.answering(now, t)
    }

    /// When a peer that looked lost while this node's link was broken may be judged.
    pub(super) fn judge_at(&self, t: &Timing) -> Instant {
        self.unbroken_since + t.window
    }

    /// When this node fences if no beat is acknowledged before.
    pub(super) fn fence_at(&self, t: &Timing) -> Instant {
        self.beat_acked + t.fence_after
    }

    /// Where a node that fenced counts its give-up from: the fence time as the last round trip of any
    /// kind would put it (at most one beat's period after the cut).
    pub(super) fn fenced_from(&self, t: &Timing) -> Instant {
        self.acked + t.fence_after
    }
}

/// The link, shared by the heartbeat task (which writes it) and the watch of the round (which reads it).
#[derive(Debug, Clone)]
pub(super) struct SharedLink(Arc<Mutex<Link>>);

impl SharedLink {
    pub(super) fn new(t: &Timing) -> SharedLink {
        SharedLink(Arc::new(Mutex::new(Link::new(Instant::now(), t))))
    }

    pub(super) fn get(&self) -> Link {
        *self.lock()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Link> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Resolves when this node is cut off from the store, with the link as it was then. Holds (says so once)
/// while the store's host is reachable. Cancel-safe: it only reads the link and asks the network.
pub(super) async fn cut_off<S: Store>(link: SharedLink, store: Arc<S>, t: Timing) -> Link {
    let mut held = false;
    loop {
        let at = link.get().fence_at(&t);
        if Instant::now() < at {
            tokio::time::sleep_until(at).await;
            continue;
        }
        let reach = store.reach(t.reach_bound).await;
        if reach == Reach::NoPath && link.get().fence_at(&t) <= Instant::now() {
            return link.get();
        }
        // A refusal is a store that ended: the watch of the round says what that means (`ending.rs`). A
        // store that answers has a beat on its way (a round's first, after a long join).
        let now = Instant::now();
        if !held && reach == Reach::Path && link.get().fence_at(&t) <= now && !link.get().answering(now, &t) {
            held = true;
            // INFO: the store's client has said the outage already.
            tracing::info!(
                "the rendezvous store has not acknowledged a heartbeat for {:?}, but its host (with etcd: a \
                 member's) still completes TCP handshakes (a stopped, overloaded or electing store): nobody can \
                 evict this node through it, so the workers keep running",
                link.get().beat_acked.elapsed()
            );
        }
        tokio::time::sleep(t.probe_every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(interval: u64, attempts: u32, heartbeat_timeout: u64) -> Settings {
        Settings {
            run_id: "t".into(),
            min_nodes: 1,
            max_nodes: 1,
            join_timeout: Duration::from_secs(60),
            last_call_timeout: Duration::from_secs(1),
            exit_barrier_timeout: Duration::from_secs(1),
            keep_alive_interval: Duration::from_secs(interval),
            keep_alive_max_attempt: attempts,
            heartbeat_timeout: Duration::from_secs(heartbeat_timeout),
            store_timeout: Duration::from_secs(60),
            node_rank: None,
            strict_rank: false,
            restart_budget: None,
            exclude_after: None,
        }
    }

    #[test]
    fn a_cut_node_fences_before_the_earliest_eviction() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (interval, attempts, heartbeat_timeout) -> (window, fence_after, probe_every, request_bound, reach_bound)
        let table = [
            ((5, 3, 5), (s(15), s(10), s(1), s(5), s(1))),
            ((1, 3, 5), (s(3), s(2), s(1), s(1), ms(333))),
            ((2, 1, 5), (s(2), s(1), s(1), ms(666), ms(333))),
            ((10, 6, 5), (s(60), s(50), s(1), s(5), s(1))),
        ];
        for ((i, m, h), (window, fence_after, probe, bound, reach)) in table {
            let t = Timing::of(&settings(i, m, h));
            assert_eq!((t.window, t.fence_after, t.probe_every), (window, fence_after, probe), "{i}x{m}");
            assert_eq!(t.request_bound.as_millis(), bound.as_millis(), "{i}x{m}");
            assert_eq!(t.reach_bound.as_millis(), reach.as_millis(), "{i}x{m}");
            // The look for a path and the fenced stop fit in what is left before an eviction can happen.
            assert!(t.fence_after + t.reach_bound + t.fenced_grace(s(3)) < t.window, "{i}x{m}");
        }
    }

    #[test]
    fn eviction_needs_a_whole_window_of_own_round_trips() {
        let t = Timing::of(&settings(1, 3, 5));
        let start = Instant::now();
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        let mut link = Link { acked: start, beat_acked: start, unbroken_since: start, broken: false };
        link.ack(at(0.5), true);
        assert!(!link.may_evict(at(1.0), &t), "not a whole window yet");
        link.ack(at(3.0), true);
        assert!(link.may_evict(at(3.1), &t), "a window of answered round trips");
        link.fail();
        assert!(!link.may_evict(at(3.2), &t), "its own round trip just failed");
        link.ack(at(4.0), true);
        assert!(!link.may_evict(at(4.5), &t), "heard again, but not for a window");
        assert_eq!(link.judge_at(&t), at(7.0));
        link.ack(at(7.0), true);
        assert!(link.may_evict(at(7.0), &t));
        assert!(!link.may_evict(at(9.5), &t), "nothing answered for longer than a probe and its bound");
        assert_eq!(link.fence_at(&t), at(9.0));
        // A ping renews nothing the others can see: the fence still runs from the last beat, the give-up
        // from the ping.
        link.ack(at(8.0), false);
        assert_eq!((link.fence_at(&t), link.fenced_from(&t)), (at(9.0), at(10.0)));
        // Joined after a long wait: the fence runs from when the round was last seen unsealed, the link is
        // sound again from the answered request after the seal.
        link.fail();
        link.joined(at(20.0), at(30.0));
        assert_eq!((link.fence_at(&t), link.broken), (at(22.0), false));
        assert!(link.answering(at(30.5), &t) && !link.may_evict(at(30.5), &t), "answering, but not for a window");
        link.ack(at(32.5), true);
        assert!(link.may_evict(at(33.0), &t), "a window after the answer, beats acknowledged");
        link.joined(at(10.0), at(11.0));
        assert_eq!((link.fence_at(&t), link.acked, link.unbroken_since), (at(34.5), at(32.5), at(30.0)), "never back");
        let registered = Link::new(at(10.0), &t);
        assert!(registered.may_evict(at(10.0), &t), "registering was a round trip: a death right after is believed");
    }
}
