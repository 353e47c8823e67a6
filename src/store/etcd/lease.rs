//! This handle's session in etcd: one lease, kept alive by one message per third of its TTL on a keepalive
//! stream (opened again on another member when it breaks, a second after a failure), and the session
//! keys put on it. A keepalive answered without a TTL is etcd's only word that the lease is gone (it
//! expired while this agent could not reach etcd): a new lease is granted and every session key put on
//! it again, as the TCP store sets them again after a reconnect. Revoked when the handle is dropped, so
//! a node that leaves is gone at once; a node killed is gone after the TTL.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::codec::Streaming;
use tonic::Code;

use super::answer;
use super::cluster::Cluster;
use super::pb::{self, path};
use super::wire;
use crate::store::StoreError;

/// An open keepalive stream: where its requests go and its replies come from.
type KeepAlives = (UnboundedSender<pb::LeaseKeepAliveRequest>, Streaming<pb::LeaseKeepAliveResponse>);

const NOT_FOUND: i64 = Code::NotFound as i64;

/// How soon a keepalive that failed is tried again. A member behind on applying its log refuses
/// keepalives for as long as it is behind (etcd: "waiting for the applied index took too long"); with
/// the next try a third of the TTL later, two refusals in a row lost the lease, and every key on it, in
/// a round of thousands of nodes. A keepalive costs the member no write.
const RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    lease: Option<i64>,
    /// Every session key (full etcd key) set and not deleted, with its value.
    keys: BTreeMap<Vec<u8>, Vec<u8>>,
}

pub(super) struct Session {
    cluster: Arc<Cluster>,
    ttl: Duration,
    timeout: Duration,
    state: Mutex<State>,
    /// Held while granting, so concurrent first uses grant one lease.
    granting: tokio::sync::Mutex<()>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
}

impl Session {
    pub(super) fn new(cluster: Arc<Cluster>, ttl: Duration, timeout: Duration) -> Arc<Session> {
        Arc::new(Session {
            cluster,
            ttl,
            timeout,
            state: Mutex::default(),
            granting: tokio::sync::Mutex::new(()),
            keepalive: Mutex::new(None),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// The lease, granted (and its keepalive started) on first use.
    pub(super) async fn lease(self: &Arc<Self>) -> Result<i64, StoreError> {
        if let Some(id) = self.state().lease {
            return Ok(id);
        }
        let _granting = self.granting.lock().await;
        if let Some(id) = self.state().lease {
            return Ok(id);
        }
        let id = self.grant().await?;
        self.state().lease = Some(id);
        let mut keepalive = self.keepalive.lock().unwrap_or_else(PoisonError::into_inner);
        if keepalive.is_none() {
            *keepalive = Some(tokio::spawn(keep_alive(Arc::downgrade(self))));
        }
        Ok(id)
    }

    async fn grant(&self) -> Result<i64, StoreError> {
        let ttl = self.ttl.as_secs().max(2);
        let request = pb::LeaseGrantRequest { ttl: i64::try_from(ttl).unwrap_or(i64::MAX) };
        let reply: pb::LeaseGrantResponse = self.cluster.call(path::LEASE_GRANT, &request, self.deadline()).await?;
        if reply.id == 0 {
            return Err(StoreError::Etcd { endpoint: self.cluster.named.clone(), code: 0, message: "lease grant gave no ID".into() });
        }
        Ok(reply.id)
    }

    /// Puts `key` on the lease, recording it first so a lease granted again in between puts it too.
    pub(super) async fn put(self: &Arc<Self>, key: Vec<u8>, value: &[u8]) -> Result<(), StoreError> {
        self.state().keys.insert(key.clone(), value.to_vec());
        let mut lease = self.lease().await?;
        for _ in 0..2 {
            match self.cluster.call::<_, pb::PutResponse>(path::PUT, &wire::put(&key, value, Some(lease)), self.deadline()).await {
                Err(StoreError::Etcd { code: NOT_FOUND, .. }) => lease = self.replace(lease).await?,
                other => return other.map(drop),
            }
        }
        Err(StoreError::Etcd { endpoint: self.cluster.named.clone(), code: NOT_FOUND, message: "the lease was lost twice in a row".into() })
    }

    pub(super) fn forget(&self, key: &[u8]) {
        self.state().keys.remove(key);
    }

    /// One keepalive; on a lost lease, a new one with every session key on it.
    /// One keepalive on `stream` (opened first when there is none): a stream that fails is dropped, and the
    /// next keepalive opens another.
    async fn refresh(self: &Arc<Self>, stream: &mut Option<KeepAlives>) -> Result<(), StoreError> {
        let Some(lease) = self.state().lease else { return Ok(()) };
        let request = pb::LeaseKeepAliveRequest { id: lease };
        let deadline = Instant::now() + self.ttl / 3;
        let sent = stream.as_ref().is_some_and(|(tx, _)| tx.send(request.clone()).is_ok());
        if !sent {
            *stream = Some(self.cluster.open_stream(path::LEASE_KEEPALIVE, vec![request]).await?);
        }
        let Some((_, replies)) = stream.as_mut() else { return Ok(()) };
        let reply = match tokio::time::timeout_at(deadline, replies.message()).await {
            Ok(Ok(Some(reply))) => reply,
            Ok(Ok(None)) => Err(self.cluster.gave_up(path::LEASE_KEEPALIVE, "the stream ended".into()))?,
            Ok(Err(status)) => Err(self.cluster.gave_up(path::LEASE_KEEPALIVE, answer::of_status(&status).to_string()))?,
            Err(_) => Err(self.cluster.gave_up(path::LEASE_KEEPALIVE, format!("no answer within {:?}", self.ttl / 3)))?,
        };
        if reply.ttl <= 0 {
            self.replace(lease).await?;
        }
        Ok(())
    }

    /// etcd says `lost` is gone: one new lease, however many callers found it gone at once, under the
    /// granting lock. Every session key is put on it before it becomes the lease others use and the
    /// keepalive keeps: a second grant racing this one would leave the keys on a lease nobody keeps alive,
    /// and they would vanish one TTL later. Abandoned half-way (an error, a cancelled caller), `lost`
    /// stays the lease, so the next keepalive or put replaces it again.
    async fn replace(self: &Arc<Self>, lost: i64) -> Result<i64, StoreError> {
        let _granting = self.granting.lock().await;
        if let Some(current) = self.state().lease.filter(|&id| id != lost) {
            return Ok(current);
        }
        let lease = self.grant().await?;
        let keys = self.state().keys.clone();
        for (key, value) in &keys {
            self.cluster.call::<_, pb::PutResponse>(path::PUT, &wire::put(key, value, Some(lease)), self.deadline()).await?;
        }
        self.state().lease = Some(lease);
        tracing::warn!(
            "this agent's etcd lease expired (etcd was out of reach for longer than its TTL, {:?}); \
             {} session key(s) set again on a new lease",
            self.ttl,
            keys.len()
        );
        Ok(lease)
    }

    /// The lease the keepalive keeps now.
    #[cfg(test)]
    pub(super) fn current(&self) -> Option<i64> {
        self.state().lease
    }

    /// Stops the keepalive and forgets the lease without revoking it, as a SIGKILLed agent leaves it.
    #[cfg(test)]
    pub(super) fn abandon(&self) {
        if let Some(task) = self.keepalive.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        self.state().lease = None;
    }

    /// Revokes the lease (bounded, in the background: called from `Drop`).
    pub(super) fn end(&self) {
        if let Some(task) = self.keepalive.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
        let Some(lease) = self.state().lease.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let cluster = self.cluster.clone();
        runtime.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(2);
            let body = pb::LeaseRevokeRequest { id: lease };
            if let Err(e) = cluster.call::<_, pb::LeaseRevokeResponse>(path::LEASE_REVOKE, &body, deadline).await {
                tracing::debug!("revoking the etcd lease: {e}");
            }
        });
    }
}

/// How long after the last keepalive the next is sent: a third of the TTL, or [`RETRY_AFTER`] after a
/// failure (never later than the third).
fn next_keepalive(every: Duration, failed: bool) -> Duration {
    match failed {
        true => every.min(RETRY_AFTER),
        false => every,
    }
}

/// Keeps the lease alive until the session is gone. Failures are the cluster's to report (an outage is
/// said once there); a lease that expired meanwhile is replaced by `refresh`.
async fn keep_alive(session: std::sync::Weak<Session>) {
    let mut stream = None;
    let mut failed = false;
    loop {
        let Some(every) = session.upgrade().map(|s| s.ttl / 3) else { return };
        tokio::time::sleep(next_keepalive(every, failed)).await;
        let Some(s) = session.upgrade() else { return };
        failed = match s.refresh(&mut stream).await {
            Ok(()) => false,
            Err(e) => {
                stream = None;
                tracing::debug!("etcd lease keepalive: {e}");
                true
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_keepalive_is_retried_within_a_second() {
        let s = Duration::from_secs;
        // (a third of the TTL, the last one failed) -> the next in
        let table = [((s(5), false), s(5)), ((s(5), true), s(1)), ((Duration::from_millis(700), true), Duration::from_millis(700))];
        for ((every, failed), want) in table {
            assert_eq!(next_keepalive(every, failed), want, "{every:?} {failed}");
        }
    }
}
