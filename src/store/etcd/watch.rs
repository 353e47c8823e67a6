//! This handle's watches: one gRPC watch stream per handle, as etcd's own clients keep, carrying every
//! watch of every caller (a watcher each per key or prefix, named by an id this side picks). A watcher starts
//! at the store's current revision, and its caller is told once etcd has created every watcher it asked
//! for: each write after that is delivered. (One asked to start at an earlier revision is "unsynced":
//! etcd replays the history since then to it, 512 watchers a pass, each pass reading every write since the
//! oldest start; thousands of nodes watching their round at once made those passes most of a member's
//! work.) A caller's channel closing cancels its watchers; a stream that breaks is opened again at another
//! member with each watcher resumed after the last revision it delivered (or the one it was created at), so
//! no write is missed or delivered twice; a watcher whose revision was compacted away re-reads its key or
//! prefix and reports what changed. When no member takes the stream back, every caller's channel closes:
//! the store is lost. A stream silent for a third of the lease's TTL is asked for a progress notification
//! (answered by the member alone, no raft round), and one that does not answer within another third is
//! opened again elsewhere: a stream carries no deadline, and one on the connection to a member whose host
//! was cut would otherwise stay silent until TCP keepalive gives the connection up, while unary requests
//! have already moved to another member (peers' heartbeats unheard, and healthy peers evicted). The lease's
//! keepalive waits as long for its answers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use tonic::codec::Streaming;

use super::cluster::Cluster;
use super::pb::{self, path, WatchRequest, WatchResponse};
use super::wire;
use crate::store::{StoreError, WatchEvent, WatchEventKind};

/// One key or prefix to follow, and the keys under it its events have shown to exist.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub key: Vec<u8>,
    pub prefix: bool,
    pub known: HashSet<Vec<u8>>,
}

impl Target {
    pub(super) fn new(key: Vec<u8>, prefix: bool) -> Target {
        Target { key, prefix, known: HashSet::new() }
    }
}

/// Turns etcd's keys into the caller's (the namespace taken off).
#[derive(Clone)]
pub(super) struct Namer(pub Arc<str>);

impl Namer {
    fn event(&self, deleted: bool, key: &[u8]) -> WatchEvent {
        let key = key.strip_prefix(self.0.as_bytes()).unwrap_or(key);
        let kind = if deleted { WatchEventKind::Deleted } else { WatchEventKind::Written };
        WatchEvent { kind, key: String::from_utf8_lossy(key).into_owned() }
    }
}

/// Targets to follow from now, the channel their events go to, and who is told once they are created.
struct Add {
    targets: Vec<Target>,
    tx: UnboundedSender<WatchEvent>,
    created: oneshot::Sender<()>,
}

/// The handle's side of its watch stream; dropping it ends the stream.
pub(super) struct Watches {
    adds: UnboundedSender<Add>,
}

impl Watches {
    pub(super) fn start(cluster: Arc<Cluster>, namer: Namer, lease_ttl: Duration) -> Watches {
        let (adds, rx) = mpsc::unbounded_channel();
        tokio::spawn(Hub::new(cluster, namer, lease_ttl / 3).run(rx));
        Watches { adds }
    }

    /// Follows `targets` from now into `tx`; `created` is sent once etcd has created every watcher (each
    /// write after that reaches `tx`), and dropped when the stream fails first.
    pub(super) fn add(&self, targets: Vec<Target>, tx: UnboundedSender<WatchEvent>, created: oneshot::Sender<()>) {
        // A hub that ended drops `tx` with the message: the caller's channel closes, as for a lost store.
        let _ = self.adds.send(Add { targets, tx, created });
    }
}

struct Watcher {
    caller: u64,
    target: Target,
    /// The revision to resume from: one past the last event delivered, or past the revision etcd created
    /// the watcher at; 0 (from now) until etcd has said it created it.
    next: i64,
    #[cfg(test)]
    created: Option<super::testing::Gauge>,
}

struct Caller {
    tx: UnboundedSender<WatchEvent>,
    ids: Vec<i64>,
    /// Told once every watcher of the caller is created (taken then).
    created: Option<oneshot::Sender<()>>,
    /// The task that says when the caller dropped its channel.
    closing: AbortHandle,
}

type Stream = (UnboundedSender<WatchRequest>, Streaming<WatchResponse>);

struct Hub {
    cluster: Arc<Cluster>,
    namer: Namer,
    stream: Option<Stream>,
    /// How long the stream may be silent before it is asked to answer, and how long it then has: a third
    /// of the lease's TTL (one heartbeat interval), so a dead stream is replaced before peers' missed
    /// heartbeats add up to an eviction, at no more than one extra message per interval.
    quiet: Duration,
    /// When the stream last answered (or was opened), and whether it has been asked to since.
    heard: Instant,
    probed: bool,
    watchers: HashMap<i64, Watcher>,
    callers: HashMap<u64, Caller>,
    closing: JoinSet<u64>,
    next_id: i64,
    next_caller: u64,
}

impl Hub {
    fn new(cluster: Arc<Cluster>, namer: Namer, quiet: Duration) -> Hub {
        Hub {
            cluster,
            namer,
            stream: None,
            quiet,
            heard: Instant::now(),
            probed: false,
            watchers: HashMap::new(),
            callers: HashMap::new(),
            closing: JoinSet::new(),
            next_id: 1,
            next_caller: 1,
        }
    }

    async fn run(mut self, mut adds: UnboundedReceiver<Add>) {
        loop {
            tokio::select! {
                add = adds.recv() => match add {
                    Some(add) => self.add(add).await,
                    None => return,
                },
                reply = next_reply(&mut self.stream) => match reply {
                    Ok(Some(reply)) => {
                        (self.heard, self.probed) = (Instant::now(), false);
                        self.on_reply(reply).await
                    }
                    Ok(None) => self.reopen("the stream ended").await,
                    Err(status) => self.reopen(&status.to_string()).await,
                },
                Some(Ok(caller)) = self.closing.join_next(), if !self.closing.is_empty() => self.cancel(caller),
                () = tokio::time::sleep_until(self.heard + self.quiet), if self.stream.is_some() => self.quiet().await,
            }
        }
    }

    async fn add(&mut self, add: Add) {
        let caller = self.next_caller;
        self.next_caller += 1;
        let mut creates = Vec::new();
        let mut ids = Vec::new();
        for target in add.targets {
            let id = self.next_id;
            self.next_id += 1;
            creates.push(wire::watch_create(&target.key, target.prefix, 0, id));
            ids.push(id);
            #[cfg(test)]
            let target = Watcher { caller, target, next: 0, created: None };
            #[cfg(not(test))]
            let target = Watcher { caller, target, next: 0 };
            self.watchers.insert(id, target);
        }
        let tx = add.tx.clone();
        let closing = self.closing.spawn(async move {
            tx.closed().await;
            caller
        });
        self.callers.insert(caller, Caller { tx: add.tx, ids, created: Some(add.created), closing });
        let sent = self.stream.as_ref().is_some_and(|(tx, _)| creates.into_iter().all(|c| tx.send(c).is_ok()));
        if !sent {
            self.reopen("not open").await;
        }
    }

    /// The stream has been silent for `quiet`: asked to answer, or, asked already, opened again elsewhere.
    async fn quiet(&mut self) {
        let asked = !self.probed && self.stream.as_ref().is_some_and(|(tx, _)| tx.send(wire::watch_progress()).is_ok());
        if asked {
            (self.heard, self.probed) = (Instant::now(), true);
        } else {
            self.reopen("no answer to a progress request").await;
        }
    }

    /// Opens the stream (again) with every watcher created from where it left off; when no member takes
    /// it, every caller's channel closes.
    async fn reopen(&mut self, why: &str) {
        self.stream = None;
        if self.watchers.is_empty() {
            return;
        }
        tracing::debug!("etcd watch stream ({why}): opening it with {} watcher(s)", self.watchers.len());
        let creates = self.watchers.iter_mut().map(|(&id, w)| {
            #[cfg(test)]
            w.created.take();
            wire::watch_create(&w.target.key, w.target.prefix, w.next, id)
        });
        match self.cluster.open_stream(path::WATCH, creates.collect()).await {
            Ok(stream) => {
                self.stream = Some(stream);
                (self.heard, self.probed) = (Instant::now(), false);
            }
            Err(e) => {
                tracing::debug!("etcd watch: {e}");
                for (_, caller) in self.callers.drain() {
                    caller.closing.abort();
                }
                self.watchers.clear();
            }
        }
    }

    async fn on_reply(&mut self, reply: WatchResponse) {
        let id = reply.watch_id;
        if reply.created && !reply.canceled {
            self.created(id, wire::revision(reply.header.as_ref()));
        }
        let Some(watcher) = self.watchers.get_mut(&id) else { return };
        let mut gone = false;
        if let Some(caller) = self.callers.get(&watcher.caller) {
            for e in &reply.events {
                let Some(kv) = &e.kv else { continue };
                watcher.next = watcher.next.max(kv.mod_revision + 1);
                let deleted = e.r#type == pb::EVENT_DELETE;
                match deleted {
                    true => watcher.target.known.remove(&kv.key),
                    false => watcher.target.known.insert(kv.key.clone()),
                };
                gone |= caller.tx.send(self.namer.event(deleted, &kv.key)).is_err();
            }
        }
        let caller = watcher.caller;
        if gone {
            self.cancel(caller);
        } else if reply.canceled && reply.compact_revision > 0 {
            tracing::debug!("etcd compacted revision {} of a watch (now at {})", watcher.next, reply.compact_revision);
            self.catch_up(id).await;
        } else if reply.canceled {
            // Its caller's channel closes: the store is lost to it.
            tracing::debug!("etcd cancelled a watch: {}", reply.cancel_reason);
            self.cancel(caller);
        }
    }

    /// etcd created watcher `id` at `revision`: it resumes after it; its caller is told once every watcher
    /// it asked for is created (a resumed one was created before).
    fn created(&mut self, id: i64, revision: i64) {
        let Some(w) = self.watchers.get_mut(&id) else { return };
        #[cfg(test)]
        w.created.get_or_insert_with(|| super::testing::Gauge::enter(&self.cluster.watching));
        if w.next == 0 {
            w.next = revision + 1;
        }
        let Some(caller) = self.callers.get_mut(&w.caller) else { return };
        if caller.ids.iter().all(|id| self.watchers.get(id).is_some_and(|w| w.next != 0)) {
            if let Some(created) = caller.created.take() {
                let _ = created.send(());
            }
        }
    }

    /// A watcher whose revision was compacted: its key or prefix read again, what changed reported, and the
    /// watcher created again after the read.
    async fn catch_up(&mut self, id: i64) {
        let Some(w) = self.watchers.get(&id) else { return };
        let (key, prefix, caller) = (w.target.key.clone(), w.target.prefix, w.caller);
        let read = wire::range(&key, prefix, true);
        let deadline = Instant::now() + Duration::from_secs(10);
        let now: Result<pb::RangeResponse, StoreError> = self.cluster.call(path::RANGE, &read, deadline).await;
        let (Ok(now), Some(w), Some(c)) = (now, self.watchers.get_mut(&id), self.callers.get(&caller)) else {
            self.cancel(caller);
            return;
        };
        let revision = wire::revision(now.header.as_ref());
        let present: HashSet<Vec<u8>> = now.kvs.into_iter().map(|kv| kv.key).collect();
        // A key watched since before the gap and absent after it went in it, as far as anyone can tell (its
        // events since the watch began are all this side knows of a key).
        let gone: Vec<&Vec<u8>> = match prefix {
            true => w.target.known.difference(&present).collect(),
            false => Some(&key).filter(|_| present.is_empty()).into_iter().collect(),
        };
        for gone in gone {
            let _ = c.tx.send(self.namer.event(true, gone));
        }
        for key in &present {
            let _ = c.tx.send(self.namer.event(false, key));
        }
        w.target.known = present;
        w.next = revision + 1;
        let create = wire::watch_create(&key, prefix, w.next, id);
        if self.stream.as_ref().is_none_or(|(tx, _)| tx.send(create).is_err()) {
            self.reopen("broken while catching up").await;
        }
    }

    /// The caller dropped its channel, or etcd ended one of its watchers: its watchers are cancelled and its
    /// channel closes.
    fn cancel(&mut self, caller: u64) {
        let Some(c) = self.callers.remove(&caller) else { return };
        c.closing.abort();
        for id in c.ids {
            self.watchers.remove(&id);
            if let Some((tx, _)) = &self.stream {
                let _ = tx.send(wire::watch_cancel(id));
            }
        }
    }
}

async fn next_reply(stream: &mut Option<Stream>) -> Result<Option<WatchResponse>, tonic::Status> {
    match stream {
        Some((_, replies)) => replies.message().await,
        None => std::future::pending().await,
    }
}
