//! The hang board: the keys through which the agents of a round agree on a hang (`r/<R>/hang`, the
//! incident number, raised by compare-and-set so that agents noticing the same hang at once raise it once),
//! hand group rank 0 their ranks' summaries (`r/<R>/hang/<n>/s/<group rank>`) and learn its verdict
//! (`r/<R>/hang/<n>/verdict`). The last verdict is kept for `muster status` (`hang_last`). O(1) keys watched
//! and written per node; only group rank 0 reads every node's summary, once per incident.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{RdzvError, Rendezvous};
use crate::store::{Store, WatchEvent, WatchTarget};

/// The job-level key holding the last verdict (read by `muster status`).
pub const LAST_KEY: &str = "hang_last";

/// One round's hang keys, for a task that runs beside the rendezvous.
pub struct HangBoard<S: Store> {
    store: Arc<S>,
    /// `<job prefix>r/<R>/hang`.
    key: String,
    last_key: String,
    pub round: u64,
    pub group_rank: u32,
    pub group_world_size: u32,
}

impl<S: Store> Rendezvous<S> {
    /// The board of the round this node is in (None before its first round).
    pub fn hang_board(&self) -> Option<HangBoard<S>> {
        let current = self.current.as_ref()?;
        Some(HangBoard {
            store: self.store.clone(),
            key: self.key(&format!("r/{}/hang", current.round)),
            last_key: self.key(LAST_KEY),
            round: current.round,
            group_rank: current.group_rank,
            group_world_size: current.group_world_size,
        })
    }
}

fn parse(v: Option<Vec<u8>>) -> u64 {
    v.and_then(|v| String::from_utf8(v).ok()).and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

impl<S: Store> HangBoard<S> {
    /// Every later write of the incident number.
    pub async fn watch(&self) -> Result<mpsc::UnboundedReceiver<WatchEvent>, RdzvError> {
        Ok(self.store.watch(&[WatchTarget::Key(self.key.clone())]).await?)
    }

    /// The round's latest incident (0: none).
    pub async fn current(&self) -> Result<u64, RdzvError> {
        Ok(parse(self.store.get(&self.key).await?))
    }

    /// Raises the incident after `known`; returns the incident now current (another agent's, raised first,
    /// or this one).
    pub async fn raise(&self, known: u64) -> Result<u64, RdzvError> {
        let expected = if known == 0 { Vec::new() } else { known.to_string().into_bytes() };
        let now = self.store.compare_set(&self.key, &expected, (known + 1).to_string().as_bytes()).await?;
        Ok(parse(Some(now)))
    }

    pub async fn put_summary(&self, incident: u64, summary: &[u8]) -> Result<(), RdzvError> {
        Ok(self.store.set(&format!("{}/{incident}/s/{}", self.key, self.group_rank), summary).await?)
    }

    /// Every node's summary that arrives by `deadline`, in group-rank order (missing ones left out).
    pub async fn summaries(&self, incident: u64, deadline: Instant) -> Result<Vec<Vec<u8>>, RdzvError> {
        let keys: Vec<String> = (0..self.group_world_size).map(|g| format!("{}/{incident}/s/{g}", self.key)).collect();
        for key in &keys {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.store.wait(key, left).await? {
                break;
            }
        }
        Ok(self.store.multi_get(&keys).await?.into_iter().flatten().collect())
    }

    pub async fn put_verdict(&self, incident: u64, verdict: &[u8]) -> Result<(), RdzvError> {
        self.store.set(&format!("{}/{incident}/verdict", self.key), verdict).await?;
        Ok(self.store.set(&self.last_key, verdict).await?)
    }

    /// Group rank 0's verdict on `incident`, if it comes within `timeout`.
    pub async fn verdict(&self, incident: u64, timeout: Duration) -> Result<Option<Vec<u8>>, RdzvError> {
        let key = format!("{}/{incident}/verdict", self.key);
        if !self.store.wait(&key, timeout).await? {
            return Ok(None);
        }
        Ok(self.store.get(&key).await?)
    }
}
