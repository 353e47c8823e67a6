//! This handle's session on the API server: one Lease, the session object, which its session keys name
//! (label and owner reference). The agent's session object is the object of its heartbeat key, so that a
//! beat is the session's renewal: one write per node per keep-alive interval at steady state, where etcd
//! needs a put and a lease keepalive. Between beats (while joining, or a handle that never beats) the
//! session renews itself once half its TTL passed without a write: longer than the keep-alive interval
//! (the TTL is keep_alive_max_attempt of them, 3 by default), so that a beating agent's renewals are its beats alone, and short
//! enough that one late renewal still leaves half a TTL before anyone may reap it. A session object deleted by a reaper while this agent
//! could not reach the server is made again, with every session key put back, as etcd's session does when
//! its lease expired. Deleted with its keys when the handle is dropped, so a node that leaves is gone at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::api::{DeleteParams, ListParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::client::Server;
use super::names;
use super::object::{self, Holder, Link};
use crate::store::StoreError;

#[derive(Default)]
struct State {
    /// The session object's uid once created (owner references need it).
    uid: Option<String>,
    /// The value its key holds (the last beat's).
    value: Vec<u8>,
    renewed: Option<Instant>,
    /// Every session key set and not deleted, with its value.
    keys: BTreeMap<String, Vec<u8>>,
}

pub(super) struct Session {
    server: Server,
    job: String,
    /// The key whose object is the session object.
    key: String,
    holder: Holder,
    state: Mutex<State>,
    /// Held while creating, so concurrent first uses create one object.
    creating: tokio::sync::Mutex<()>,
    renewer: Mutex<Option<JoinHandle<()>>>,
}

impl Session {
    pub(super) fn new(server: Server, job: String, key: String, holder: Holder) -> Arc<Session> {
        Arc::new(Session {
            server,
            job,
            key,
            holder,
            state: Mutex::default(),
            creating: tokio::sync::Mutex::new(()),
            renewer: Mutex::new(None),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session object's name.
    pub(super) fn name(&self) -> String {
        names::object_name(&self.job, &self.key)
    }

    pub(super) fn is_session_key(&self, key: &str) -> bool {
        key == self.key
    }

    /// The session object's uid, creating it (and starting its renewals) on first use.
    async fn uid(self: &Arc<Self>) -> Result<String, StoreError> {
        if let Some(uid) = self.state().uid.clone() {
            return Ok(uid);
        }
        let _creating = self.creating.lock().await;
        if let Some(uid) = self.state().uid.clone() {
            return Ok(uid);
        }
        let value = self.state().value.clone();
        let uid = self.write(&value).await?;
        let mut renewer = self.renewer.lock().unwrap_or_else(PoisonError::into_inner);
        if renewer.is_none() {
            *renewer = Some(tokio::spawn(renew(Arc::downgrade(self), self.holder.ttl / 2)));
        }
        Ok(uid)
    }

    /// Writes the session object with `value`, renewed now: a patch (unconditional), or a create where it
    /// is gone (first use, or reaped). Returns its uid.
    async fn write(&self, value: &[u8]) -> Result<String, StoreError> {
        let lease = object::lease(&self.job, &self.key, value, None, Link::Holder(&self.holder));
        let name = self.name();
        let written = super::overwrite(&self.server, &name, &lease, "beat").await?;
        let uid = written.metadata.uid.ok_or_else(|| self.server.failed("beat", format!("the Lease {name} came back without a uid")))?;
        let recreated = {
            let mut state = self.state();
            let recreated = state.uid.as_ref().is_some_and(|old| *old != uid);
            state.uid = Some(uid.clone());
            state.value = value.to_vec();
            state.renewed = Some(Instant::now());
            recreated
        };
        if recreated {
            self.restore().await?;
        }
        Ok(uid)
    }

    /// The heartbeat: the session object's value, renewed.
    pub(super) async fn beat(self: &Arc<Self>, value: &[u8]) -> Result<(), StoreError> {
        self.uid().await?;
        self.write(value).await.map(drop)
    }

    /// A session key: written with the session's label and owner, and remembered to be put back.
    pub(super) async fn put(self: &Arc<Self>, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let uid = self.uid().await?;
        let name = self.name();
        let link = Link::SessionKey { session: &name, uid: Some(&uid) };
        super::write(&self.server, &self.job, key, value, link).await?;
        self.state().keys.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    pub(super) fn forget(&self, key: &str) {
        self.state().keys.remove(key);
    }

    /// After a reaper deleted the session (this agent was cut off longer than its TTL): its keys again, on
    /// the new object.
    async fn restore(&self) -> Result<(), StoreError> {
        let (keys, uid) = {
            let state = self.state();
            (state.keys.clone(), state.uid.clone())
        };
        tracing::info!("the rendezvous session was reaped while this agent could not renew it; putting its {} keys back", keys.len());
        let name = self.name();
        for (key, value) in keys {
            let link = Link::SessionKey { session: &name, uid: uid.as_deref() };
            super::write(&self.server, &self.job, &key, &value, link).await?;
        }
        Ok(())
    }

    fn due(&self, every: Duration) -> bool {
        self.state().renewed.is_none_or(|at| at.elapsed() >= every)
    }

    /// Stops renewing, deletes nothing (a test's SIGKILL).
    #[cfg(test)]
    pub(super) fn halt(&self) {
        if let Some(renewer) = self.renewer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            renewer.abort();
        }
    }

    /// Deletes the session object and its keys, in the background (the handle is going).
    pub(super) fn end(&self) {
        if let Some(renewer) = self.renewer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            renewer.abort();
        }
        if self.state().uid.is_none() {
            return;
        }
        let (server, name, selector) = (self.server.clone(), self.name(), names::session_selector(&self.job, &self.name()));
        tokio::spawn(async move {
            let gone = server.call("delete", server.leases.delete(&name, &DeleteParams::default())).await;
            let keys = server.call("delete_collection", server.leases.delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))).await;
            if let Err(e) = gone.map(drop).and(keys.map(drop)) {
                tracing::debug!("cannot delete the rendezvous session {name}: {e}");
            }
        });
    }
}

/// Renews the session every `every` that no beat did, while the session lives.
async fn renew(session: std::sync::Weak<Session>, every: Duration) {
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(session) = session.upgrade() else { return };
        if session.due(every) {
            let value = session.state().value.clone();
            if let Err(e) = session.write(&value).await {
                tracing::debug!("cannot renew the rendezvous session: {e}");
                next = Instant::now() + Duration::from_secs(1).min(every);
                continue;
            }
        }
        next = session.state().renewed.unwrap_or_else(Instant::now) + every;
    }
}
