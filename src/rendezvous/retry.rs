//! A rendezvous store that restarted or was briefly unreachable. The store client reconnects on the next
//! request, but a request in flight when its connection failed fails; the rendezvous operations (joining,
//! re-forming, publishing, watching the round) then try again with back-off, logging one line, until
//! `store_timeout` (`read_timeout`). Only a store gone for longer than that ends the agent, with [`RdzvError::StoreLost`].

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use tokio::time::Instant;

use super::RdzvError;
use crate::store::StoreError;

/// The first back-off after a failed attempt; it grows by half each time, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Whether `e` is about the connection rather than the request: the store restarted, closed the
/// connection, did not answer in time, or could not be reached again within the connect timeout. Anything
/// else (a wrong token, a program that is not a store, garbage, a bad rendezvous state) is final.
pub(super) fn is_connection_error(e: &RdzvError) -> bool {
    matches!(
        e,
        RdzvError::Store(
            StoreError::Closed { .. }
                | StoreError::Io { .. }
                | StoreError::Timeout { .. }
                | StoreError::Connect { .. }
                | StoreError::Broken { .. }
                | StoreError::Refused { .. }
                | StoreError::Unreachable { .. }
                | StoreError::ApiServerUnreachable { .. }
        )
    )
}

/// What a store that refuses connections (nothing listens on its port: its process ended) means to an
/// operation that needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OnRefusal {
    /// The store was hosted by the agent of node `node`, which is gone with its workers: the job cannot
    /// go on as it is.
    HostEnded { node: String },
    /// An external store (or one whose host is not known): it may be restarting, so it is asked again for
    /// this long, then given up.
    Wait(Duration),
}

/// The end of a retried operation that met a refusal at `now`, first met at `since`: `None` to go on.
pub(super) fn refusal_ends(on: &OnRefusal, addr: &str, since: Instant, now: Instant) -> Option<RdzvError> {
    match on {
        OnRefusal::HostEnded { node } => Some(RdzvError::StoreHostEnded { node: node.clone(), addr: addr.to_string() }),
        OnRefusal::Wait(patience) if now >= since + *patience => {
            Some(RdzvError::StoreRefused { addr: addr.to_string(), waited: *patience })
        }
        OnRefusal::Wait(_) => None,
    }
}

/// A number in [0, 1) that differs from agent to agent (and call to call): spreads waits that would
/// otherwise end together.
pub(super) fn jitter(now: Instant) -> f64 {
    (RandomState::new().hash_one(now) % 1000) as f64 / 1000.0
}

/// What to do after a failed attempt.
#[derive(Debug, PartialEq)]
pub(super) enum Next {
    /// Try again after this long.
    Retry(Duration),
    /// The store has been unreachable since before the deadline: give up with `StoreLost`.
    Lost,
    /// Not a connection error: the operation fails with it.
    Fail,
}

/// The decision after attempt number `attempt` (0 for the first) failed with `e` at `now`; `jitter` in
/// [0, 1) spreads the agents' retries (the back-off is scaled by 0.5 + jitter) and no wait passes the
/// deadline.
pub(super) fn decide(e: &RdzvError, attempt: u32, jitter: f64, now: Instant, deadline: Instant) -> Next {
    if !is_connection_error(e) {
        return Next::Fail;
    }
    if now >= deadline {
        return Next::Lost;
    }
    let backoff = FIRST_BACKOFF.mul_f64(1.5f64.powi(attempt.min(16) as i32)).min(MAX_BACKOFF);
    Next::Retry(backoff.mul_f64(0.5 + jitter.clamp(0.0, 1.0)).min(deadline - now))
}

/// The retries of one operation: the deadline runs from its first connection error.
pub(super) struct Retry {
    what: &'static str,
    timeout: Duration,
    deadline: Option<Instant>,
    attempt: u32,
    on_refusal: OnRefusal,
    /// Since when every attempt was refused.
    refused_since: Option<Instant>,
}

impl Retry {
    /// `what` names the operation in the log line; `timeout` is `store_timeout`.
    pub(super) fn new(what: &'static str, timeout: Duration, on_refusal: OnRefusal) -> Retry {
        Retry { what, timeout, deadline: None, attempt: 0, on_refusal, refused_since: None }
    }

    /// After a failed attempt: returns (after the back-off) when the operation should be tried again, or
    /// the error it ends with.
    pub(super) async fn after(&mut self, e: RdzvError) -> Result<(), RdzvError> {
        let now = Instant::now();
        match &e {
            RdzvError::Store(StoreError::Refused { addr }) => {
                let since = *self.refused_since.get_or_insert(now);
                if let Some(end) = refusal_ends(&self.on_refusal, &addr.to_string(), since, now) {
                    tracing::debug!("the rendezvous store refuses connections while {}", self.what);
                    return Err(end);
                }
            }
            _ => self.refused_since = None,
        }
        let deadline = *self.deadline.get_or_insert(now + self.timeout);
        match decide(&e, self.attempt, jitter(now), now, deadline) {
            Next::Retry(wait) => {
                // etcd's and the API server's clients say an outage themselves, once for all their users; a
                // refusal is said by its end (`refusal_ends`) or by the watch of the round.
                let said = matches!(
                    e,
                    RdzvError::Store(StoreError::Unreachable { .. } | StoreError::ApiServerUnreachable { .. } | StoreError::Refused { .. })
                );
                if self.attempt == 0 && said {
                    tracing::debug!("the store does not answer while {} ({e}); retrying", self.what);
                } else if self.attempt == 0 {
                    tracing::warn!(
                        "the rendezvous store does not answer while {} ({e}); retrying for up to read_timeout ({:?})",
                        self.what,
                        self.timeout
                    );
                }
                self.attempt += 1;
                tokio::time::sleep(wait).await;
                Ok(())
            }
            Next::Lost => {
                tracing::warn!("the rendezvous store did not answer for {:?} while {}: {e}", self.timeout, self.what);
                Err(RdzvError::StoreLost)
            }
            Next::Fail => Err(e),
        }
    }

    /// The operation made progress: a later connection error starts a new deadline.
    pub(super) fn reset(&mut self) {
        if self.attempt > 0 {
            tracing::info!("the rendezvous store answers again ({})", self.what);
        }
        self.deadline = None;
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::net::SocketAddr;

    use super::*;
    use crate::store::tcp::frame::FrameError;

    #[test]
    fn connection_errors_are_retried_and_the_rest_is_final() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 29500));
        let d = Duration::from_secs(1);
        let store = |e: StoreError| RdzvError::Store(e);
        let table: Vec<(RdzvError, bool)> = vec![
            (store(StoreError::Closed { addr, op: "list_keys" }), true),
            (store(StoreError::Io { addr, op: "get", source: io::ErrorKind::ConnectionReset.into() }), true),
            (store(StoreError::Timeout { addr, op: "add", timeout: d }), true),
            (store(StoreError::Connect { addr, timeout: d, last: "refused".into() }), true),
            (store(StoreError::Broken { addr }), true),
            (store(StoreError::Refused { addr }), true),
            (store(StoreError::Unreachable { endpoints: "e".into(), op: "get", last: "refused".into(), said: false }), true),
            (store(StoreError::Etcd { endpoint: "e".into(), code: 3, message: "bad".into() }), false),
            (store(StoreError::Tls { endpoint: "e".into(), reason: "no cert".into() }), false),
            (store(StoreError::WrongToken { addr }), false),
            (store(StoreError::NotAStore { addr, answer: "it answered garbage" }), false),
            (store(StoreError::Handshake { addr, expected: 1, got: 2 }), false),
            (store(StoreError::Protocol { addr, op: "get", source: FrameError::Malformed("x") }), false),
            (store(StoreError::WaitTimeout { addr, op: "wait", timeout: d, keys: "k".into() }), false),
            (RdzvError::StoreLost, false),
            (RdzvError::State("bad seal".into()), false),
            (RdzvError::Closed("job".into()), false),
            (RdzvError::Mismatch("args".into()), false),
        ];
        for (e, retried) in table {
            assert_eq!(is_connection_error(&e), retried, "{e}");
        }
    }

    #[test]
    fn a_refusal_ends_a_hosted_store_at_once_and_an_external_one_after_its_patience() {
        let at = Instant::now();
        let s = |n: u64| at + Duration::from_secs(n);
        let host = OnRefusal::HostEnded { node: "n0_7_0".into() };
        let external = OnRefusal::Wait(Duration::from_secs(15));
        // (policy, first refused, now) -> the error it ends with, if any
        let table: [(&OnRefusal, Instant, Instant, Option<&str>); 4] = [
            (&host, at, at, Some("node n0_7_0, whose agent hosted the store at n0:29500, is gone")),
            (&external, at, at, None),
            (&external, at, s(14), None),
            (&external, at, s(15), Some("refused connections for 15s")),
        ];
        for (on, since, now, want) in table {
            let got = refusal_ends(on, "n0:29500", since, now).map(|e| e.to_string());
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.contains(w), "{on:?}: {g}"),
                _ => panic!("{on:?} at {:?}: {got:?}", now - since),
            }
        }
    }

    #[test]
    fn back_off_grows_to_a_cap_and_never_passes_the_deadline() {
        let closed = RdzvError::Store(StoreError::Closed { addr: SocketAddr::from(([127, 0, 0, 1], 1)), op: "get" });
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let ms = |n| Next::Retry(Duration::from_millis(n));
        let table = [
            // (attempt, jitter, now, deadline, expected)
            (0, 0.5, now, later, ms(100)),
            (1, 0.5, now, later, ms(150)),
            (0, 0.0, now, later, ms(50)),
            (0, 0.999, now, later, Next::Retry(Duration::from_millis(100).mul_f64(1.499))),
            (30, 0.5, now, later, ms(2000)),
            (30, 0.5, now, now + Duration::from_millis(300), ms(300)),
            (3, 0.5, later, later, Next::Lost),
        ];
        for (attempt, jitter, at, deadline, expected) in table {
            assert_eq!(decide(&closed, attempt, jitter, at, deadline), expected, "attempt {attempt}");
        }
        assert_eq!(decide(&RdzvError::State("x".into()), 0, 0.5, now, later), Next::Fail);
    }
}
