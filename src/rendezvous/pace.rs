//! The pace board: how the agents of a round agree on a straggler (`crate::straggler`). Each agent's last
//! complete window rides on its heartbeat (no request of its own); once per window group rank 0 reads every
//! heartbeat (one list and one `multi_get`) and judges. Under `--on-straggler drain` it names the node to
//! drain in `r/<R>/straggler` (`<agent id> <line>`), which every agent watches: O(1) keys watched per
//! node, and only group rank 0 reads every node's window.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::wire::Heartbeat;
use super::{RdzvError, Rendezvous};
use crate::store::{Store, WatchEvent, WatchTarget};

/// This node's last complete window, as one line of JSON, for the heartbeat to carry.
pub type PaceNote = Arc<Mutex<Option<String>>>;

/// One round's pace keys, for a task that runs beside the rendezvous.
pub struct PaceBoard<S: Store> {
    store: Arc<S>,
    hb_prefix: String,
    verdict_key: String,
    me: String,
    pub round: u64,
    pub group_rank: u32,
    pub group_world_size: u32,
}

impl<S: Store> Rendezvous<S> {
    /// The board of the round this node is in (None before its first round).
    pub fn pace_board(&self) -> Option<PaceBoard<S>> {
        let current = self.current.as_ref()?;
        Some(PaceBoard {
            store: self.store.clone(),
            hb_prefix: self.key("hb/"),
            verdict_key: self.key(&format!("r/{}/straggler", current.round)),
            me: self.me.id.clone(),
            round: current.round,
            group_rank: current.group_rank,
            group_world_size: current.group_world_size,
        })
    }

    /// What the heartbeat carries of this node's pace.
    pub fn pace_note(&self) -> PaceNote {
        self.pace.clone()
    }
}

impl<S: Store> PaceBoard<S> {
    /// This agent's id, as its windows and the drain verdict name it.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Every agent's last window, as its heartbeat carries it (agents without one left out).
    pub async fn windows(&self) -> Result<Vec<String>, RdzvError> {
        let beats = self.store.scan(&self.hb_prefix).await?;
        Ok(beats.iter().filter_map(|(_, v)| Heartbeat::decode(v)?.pace).collect())
    }

    /// Every later write of the drain verdict.
    pub async fn watch(&self) -> Result<mpsc::UnboundedReceiver<WatchEvent>, RdzvError> {
        Ok(self.store.watch(&[WatchTarget::Key(self.verdict_key.clone())]).await?)
    }

    /// Names agent `id` to drain, with the line it ends with.
    pub async fn put_verdict(&self, id: &str, line: &str) -> Result<(), RdzvError> {
        Ok(self.store.set(&self.verdict_key, format!("{id} {line}").as_bytes()).await?)
    }

    /// The drain verdict's line, when it names this agent.
    pub async fn verdict_for_me(&self) -> Result<Option<String>, RdzvError> {
        let Some(v) = self.store.get(&self.verdict_key).await? else { return Ok(None) };
        let text = String::from_utf8_lossy(&v);
        Ok(text.split_once(' ').filter(|(id, _)| *id == self.me).map(|(_, line)| line.to_string()))
    }
}
