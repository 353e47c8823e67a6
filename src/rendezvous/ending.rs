//! How the end of a job, or of its store, reaches every member.
//!
//! - **The store's host.** The agent that hosts the store says so in it (`store_host`) before it registers;
//!   every member learns it once, at its first join. A store that then refuses connections (its host's
//!   kernel answers, nothing listens) is gone with that agent and with its workers: the job cannot go on
//!   as it is, so a member ends at once (`RdzvError::StoreHostEnded`, exit 3) instead of waiting for a
//!   store that nobody will restart. With an external store (`muster store`) or etcd no agent is the host:
//!   a refusal is waited for as a restart, one liveness window at a re-formation (`retry.rs`).
//! - **A closed job.** Every agent that learns the job is closed (reads `closed`, or writes it) says so once
//!   (`closed_ack/<node>`). The host keeps serving the store after the job closed until every member still
//!   alive has said so (bounded by [`LINGER_INTERVALS`] keep-alive intervals), so that none of them finds the
//!   store gone before it has read why the job ended: every agent ends with the same line and code.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::retry::{OnRefusal, Retry};
use super::{RdzvError, Rendezvous};
use crate::store::{Store, WatchTarget};

/// How many keep-alive intervals the store's host waits, at most, for the members to acknowledge a
/// closure before it exits: long enough for a member that is stopping its workers to read it, short
/// enough that a member that died meanwhile does not hold the host.
pub const LINGER_INTERVALS: u32 = 3;

pub(super) const STORE_HOST: &str = "store_host";
const ACKS: &str = "closed_ack/";

/// Which agent hosts the store, as this node knows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum StoreHost {
    /// Not looked up yet (it is, at the first join).
    #[default]
    Unknown,
    /// The agent of this node id.
    Agent(String),
    /// No agent: an external store or etcd.
    External,
}

impl<S: Store> Rendezvous<S> {
    /// This agent hosts the store: says so before registering, so that the members know a store that
    /// refuses them is gone with this agent.
    pub async fn announce_host(&mut self) -> Result<(), RdzvError> {
        self.store.set(&self.key(STORE_HOST), self.me.id.as_bytes()).await?;
        self.store_host = StoreHost::Agent(self.me.id.clone());
        Ok(())
    }

    /// Whether this agent hosts the store.
    pub(super) fn hosts_store(&self) -> bool {
        self.store_host == StoreHost::Agent(self.me.id.clone())
    }

    /// Whether this agent has yet to learn which agent hosts the store (it reads [`STORE_HOST`] with the
    /// keys it reads once its first round is sealed).
    pub(super) fn store_host_unknown(&self) -> bool {
        self.store_host == StoreHost::Unknown
    }

    /// Learns which agent hosts the store from [`STORE_HOST`]'s value.
    pub(super) fn learn_store_host(&mut self, host: Option<Vec<u8>>) {
        self.store_host = match host {
            Some(id) => StoreHost::Agent(String::from_utf8_lossy(&id).into_owned()),
            None => StoreHost::External,
        };
    }

    /// What a refused connection means to this node's retried operations.
    pub(super) fn on_refusal(&self) -> OnRefusal {
        match &self.store_host {
            StoreHost::Agent(node) if *node != self.me.id => OnRefusal::HostEnded { node: node.clone() },
            _ => OnRefusal::Wait(self.timing.window),
        }
    }

    /// The retries of one operation named `what`, as this node's store calls for.
    pub(super) fn retry(&self, what: &'static str) -> Retry {
        Retry::new(what, self.settings.store_timeout, self.on_refusal())
    }

    /// This agent knows the job is closed: said once, for the store's host (best effort: a store that does
    /// not answer has no host left to tell).
    pub(super) async fn acknowledge_closure(&self) {
        if self.closure_acked.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Err(e) = self.store.set(&self.key(&format!("{ACKS}{}", self.me.id)), b"1").await {
            tracing::debug!("could not acknowledge the job's closure: {e}");
        }
    }

    /// On the store's host, once the job is closed: waits until every other agent still alive has
    /// acknowledged the closure, at most [`LINGER_INTERVALS`] keep-alive intervals. Elsewhere, or when the
    /// job is not closed (this agent ends by a signal or a drain), returns at once.
    pub async fn outlive_closure(&self) {
        if !self.hosts_store() || !self.closure_acked.load(Ordering::SeqCst) {
            return;
        }
        let bound = self.settings.keep_alive_interval * LINGER_INTERVALS;
        let deadline = Instant::now() + bound;
        let waited = tokio::time::timeout_at(deadline, self.acknowledged_by_all()).await;
        match waited {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("waiting for the members to read the job's closure: {e}"),
            Err(_) => tracing::info!("not every member acknowledged the job's closure within {bound:?}; ending all the same"),
        }
    }

    /// Resolves once every agent whose liveness key exists, but this one, has acknowledged the closure.
    async fn acknowledged_by_all(&self) -> Result<(), RdzvError> {
        let targets = [WatchTarget::Prefix(self.key("alive/")), WatchTarget::Prefix(self.key(ACKS))];
        let mut events = self.store.watch(&targets).await?;
        loop {
            let alive = self.alive_nodes().await?;
            let acked: HashSet<String> = self
                .store
                .list(&self.key(ACKS))
                .await?
                .into_iter()
                .filter_map(|k| k.rsplit('/').next().map(str::to_string))
                .collect();
            if alive.iter().all(|node| *node == self.me.id || acked.contains(node)) {
                return Ok(());
            }
            if events.recv().await.is_none() {
                return Err(RdzvError::StoreLost);
            }
        }
    }
}
