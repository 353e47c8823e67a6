//! Watches over the gateway: one streamed POST per target (the gateway carries one watch per request), all
//! feeding one channel. A stream that breaks (its member died) is opened again at another member from the
//! revision after the last event seen, so nothing is missed or repeated; one whose start revision was
//! compacted away is caught up from a fresh read of the target (keys gone since are reported deleted,
//! keys present as written). When no member accepts a stream, every stream of the watch ends and the
//! channel closes: the store is lost, as the `Store` trait says.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc::UnboundedSender;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::cluster::{chain, Cluster};
use super::wire::{self, EventKind, RangeReply, WatchMessage};
use crate::store::{WatchEvent, WatchEventKind};

/// One watched key, or every key under it.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub key: Vec<u8>,
    pub prefix: bool,
    /// The keys of the target that exist at the watch's start revision.
    pub known: HashSet<Vec<u8>>,
}

/// Names events as the `Store` user knows its keys: without the namespace.
#[derive(Clone)]
pub(super) struct Namer(pub Arc<str>);

impl Namer {
    fn event(&self, kind: EventKind, key: &[u8]) -> WatchEvent {
        let key = key.strip_prefix(self.0.as_bytes()).unwrap_or(key);
        let kind = match kind {
            EventKind::Put => WatchEventKind::Written,
            EventKind::Delete => WatchEventKind::Deleted,
        };
        WatchEvent { kind, key: String::from_utf8_lossy(key).into_owned() }
    }
}

/// Starts following every target, each from its start revision (the one after the read that found its keys).
pub(super) fn spawn(cluster: Arc<Cluster>, targets: Vec<(Vec<Target>, i64)>, namer: Namer, tx: UnboundedSender<WatchEvent>) {
    let siblings: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
    let mut handles = Vec::new();
    for (target, start) in targets.into_iter().flat_map(|(chunk, start)| chunk.into_iter().map(move |t| (t, start))) {
        let follower = Follower { cluster: cluster.clone(), target, next: start, namer: namer.clone(), tx: tx.clone() };
        let siblings = siblings.clone();
        let task = tokio::spawn(async move {
            follower.run().await;
            // This target can no longer be followed: end the whole watch, so its channel closes.
            for sibling in siblings.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                sibling.abort();
            }
        });
        handles.push(task.abort_handle());
    }
    siblings.lock().unwrap_or_else(PoisonError::into_inner).extend(handles);
}

struct Follower {
    cluster: Arc<Cluster>,
    target: Target,
    /// The first revision not yet delivered.
    next: i64,
    namer: Namer,
    tx: UnboundedSender<WatchEvent>,
}

enum End {
    /// The receiver was dropped: the watch is over.
    Dropped,
    Compacted,
    Broken(String),
}

impl Follower {
    async fn run(mut self) {
        loop {
            let body = wire::watch_create(&self.target.key, self.target.prefix, self.next);
            let response = match self.cluster.open_stream(&body).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("etcd watch: {e}");
                    return;
                }
            };
            match self.read(response).await {
                End::Dropped => return,
                End::Compacted => {
                    if let Err(e) = self.catch_up().await {
                        tracing::debug!("etcd watch could not catch up after a compaction: {e}");
                        return;
                    }
                }
                End::Broken(why) => tracing::debug!("etcd watch stream broke ({why}); opening it again at {}", self.next),
            }
        }
    }

    /// Delivers the stream's events until it ends.
    async fn read(&mut self, mut response: reqwest::Response) -> End {
        let mut buffer: Vec<u8> = Vec::new();
        // Counts this stream among the cluster's open ones from etcd's "created" to the stream's end.
        #[cfg(test)]
        let mut created = None;
        loop {
            let chunk = tokio::select! {
                chunk = response.chunk() => chunk,
                () = self.tx.closed() => return End::Dropped,
            };
            let bytes = match chunk {
                Ok(Some(bytes)) => bytes,
                Ok(None) => return End::Broken("the stream ended".into()),
                Err(e) => return End::Broken(chain(&e)),
            };
            buffer.extend_from_slice(&bytes);
            while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=at).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match wire::parse_watch_line(&line) {
                    Ok(WatchMessage::Created) => {
                        #[cfg(test)]
                        created.get_or_insert_with(|| super::testing::Gauge::enter(&self.cluster.watching));
                    }
                    Ok(WatchMessage::Events { events, .. }) => {
                        for e in events {
                            self.next = self.next.max(e.mod_revision + 1);
                            match e.kind {
                                EventKind::Put => self.target.known.insert(e.key.clone()),
                                EventKind::Delete => self.target.known.remove(&e.key),
                            };
                            if self.tx.send(self.namer.event(e.kind, &e.key)).is_err() {
                                return End::Dropped;
                            }
                        }
                    }
                    Ok(WatchMessage::Compacted { compact_revision }) => {
                        tracing::debug!("etcd compacted revision {} of a watch (now at {compact_revision})", self.next);
                        return End::Compacted;
                    }
                    Ok(WatchMessage::Ended(why)) => return End::Broken(why),
                    Err(e) => return End::Broken(format!("an unreadable watch line: {e}")),
                }
            }
        }
    }

    /// After a compaction: what changed since is unknown, so every key now present counts as written and
    /// every key known before and gone now as deleted; the stream resumes after that read.
    async fn catch_up(&mut self) -> Result<(), crate::store::StoreError> {
        let body = wire::range(&self.target.key, self.target.prefix, true);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let now: RangeReply = self.cluster.call("/v3/kv/range", &body, deadline).await?;
        let present: HashSet<Vec<u8>> = now.kvs.into_iter().map(|kv| kv.key).collect();
        for gone in self.target.known.difference(&present) {
            let _ = self.tx.send(self.namer.event(EventKind::Delete, gone));
        }
        for key in &present {
            let _ = self.tx.send(self.namer.event(EventKind::Put, key));
        }
        self.target.known = present;
        self.next = now.header.revision + 1;
        Ok(())
    }
}
