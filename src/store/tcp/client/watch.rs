//! Watch connections (muster servers only): change events for keys and prefixes.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::super::frame::{EventKind, ReplyShape, Request, WatchMode};
use super::reply::{event_of, wire};
use super::Client;
use crate::store::StoreError;

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    Key(String),
    Prefix(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEventKind {
    /// Set or changed by any request.
    Written,
    /// Deleted, including by its session's end or a store clear.
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: WatchEventKind,
    pub key: String,
}

/// A connection in watch mode (muster servers only): receives change events for the keys and
/// prefixes it watches. Watch first, then read the current state on another connection, to
/// miss no change.
#[derive(Debug)]
pub struct Watcher {
    client: Client,
    /// Events that arrived while waiting for a WATCH to be acknowledged.
    events: VecDeque<WatchEvent>,
}

impl Watcher {
    pub(super) fn new(client: Client) -> Watcher {
        Watcher {
            client,
            events: VecDeque::new(),
        }
    }

    /// Adds a key or prefix to watch; returns once the server registered it. Dropped midway, the
    /// connection is broken (later calls fail with [`StoreError::Broken`]).
    pub async fn watch(&mut self, target: WatchTarget) -> Result<(), StoreError> {
        let (mode, pattern) = match &target {
            WatchTarget::Key(key) => (WatchMode::Key, wire(key)),
            WatchTarget::Prefix(prefix) => (WatchMode::Prefix, wire(prefix)),
        };
        self.client.begin()?;
        let request = Request::Watch {
            mode,
            pattern: &pattern,
        };
        let result = self.register(&request).await;
        self.client.end(result)
    }

    async fn register(&mut self, request: &Request<'_>) -> Result<(), StoreError> {
        self.client.send(request, "watch").await?;
        let deadline = Instant::now() + self.client.timeout();
        loop {
            let (kind, key) = self
                .client
                .receive(ReplyShape::Event, "watch", deadline, event_of)
                .await?;
            match kind {
                EventKind::Watching => return Ok(()),
                EventKind::Written => self
                    .events
                    .push_back(user_event(WatchEventKind::Written, &key)),
                EventKind::Deleted => self
                    .events
                    .push_back(user_event(WatchEventKind::Deleted, &key)),
            }
        }
    }

    /// The next event, or `None` if none comes within `timeout`. Cancel-safe: events are
    /// unsolicited and a partly read one stays buffered.
    pub async fn next_event(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<WatchEvent>, StoreError> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        self.client.usable()?;
        let deadline = Instant::now() + timeout;
        loop {
            let Some((kind, key)) = self
                .client
                .try_receive(ReplyShape::Event, "watch", deadline, event_of)
                .await?
            else {
                return Ok(None);
            };
            let kind = match kind {
                EventKind::Watching => continue,
                EventKind::Written => WatchEventKind::Written,
                EventKind::Deleted => WatchEventKind::Deleted,
            };
            return Ok(Some(user_event(kind, &key)));
        }
    }

    /// [`Client::set_session`] on this connection (allowed in watch mode: it has no reply).
    pub async fn set_session(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.client.set_session(key, value).await
    }
}

fn user_event(kind: WatchEventKind, key: &[u8]) -> WatchEvent {
    let key = key.strip_prefix(b"/").unwrap_or(key);
    WatchEvent {
        kind,
        key: String::from_utf8_lossy(key).into_owned(),
    }
}
