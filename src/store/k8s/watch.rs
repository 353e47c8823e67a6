//! Watches on the API server: one stream for every key a caller follows (`muster.dev/k in (...)`; one key
//! by its object's name) and one per prefix (the prefix's depth label), never one on the whole job, whose
//! heartbeats would reach every node: a member's beat is delivered to its two ring watchers only. A label
//! selector is evaluated on every object of the namespace (etcd has no labels: a list that is not served
//! from the server's cache reads them all), a name is one key: a wait for one key, the join's look at the
//! seal, costs the server the same at any size of job. Each stream starts where a
//! list of its objects left off (the list's resourceVersion), so every write after `follow` returns is
//! delivered and none before it; the list's keys are remembered. A stream the server ends (its timeout, a
//! restart) is opened again from the last resourceVersion it delivered; one the server answers 410 Gone
//! (the version compacted away) lists its objects again and reports what changed meanwhile against the keys
//! it knew. When no stream can be opened again within the session's TTL the caller's channel closes: the
//! store is lost.

use std::collections::HashSet;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ListParams, WatchEvent as KubeEvent, WatchParams};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::time::Instant;

use super::client::Server;
use super::names;
use super::object;
use crate::store::{StoreError, WatchEvent, WatchEventKind, WatchTarget};

/// The server ends a watch after this; it is opened again from where it was (kube's client refuses more
/// than its read timeout allows).
const STREAM_SECONDS: u32 = 280;
/// Between tries to open a stream again.
const RETRY: Duration = Duration::from_millis(500);

/// One stream's selection: how the server selects its objects, and the keys among them the caller asked
/// for.
#[derive(Debug, Clone)]
struct Group {
    select: Select,
    wanted: Filter,
}

impl Group {
    /// Exactly `keys` (not empty): read by name, watched by their labels (one by its name).
    fn keys(job: &str, keys: Vec<String>) -> Group {
        Group { select: Select::keys(job, &keys), wanted: Filter::Keys(keys.into_iter().collect()) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Select {
    /// Every object under a prefix: one label selector, for the list and the watch.
    Prefix(String),
    /// These objects: watched by their key labels (one by its name), read by their names.
    Keys { names: Vec<String>, selector: String },
}

impl Select {
    fn keys(job: &str, keys: &[String]) -> Select {
        let names = keys.iter().map(|k| names::object_name(job, k)).collect();
        Select::Keys { names, selector: names::keys_selector(job, keys) }
    }

    fn watch(&self) -> WatchParams {
        let params = WatchParams::default().timeout(STREAM_SECONDS);
        match self {
            Select::Keys { names, .. } if names.len() == 1 => params.fields(&by_name(&names[0])),
            Select::Prefix(selector) | Select::Keys { selector, .. } => params.labels(selector),
        }
    }
}

/// The field selector of one object: the server reads it as one key of etcd's.
fn by_name(name: &str) -> String {
    format!("metadata.name={name}")
}

#[derive(Debug, Clone)]
enum Filter {
    Keys(HashSet<String>),
    Prefix(String),
}

impl Filter {
    fn wants(&self, key: &str) -> bool {
        match self {
            Filter::Keys(keys) => keys.contains(key),
            Filter::Prefix(prefix) => names::under(key, prefix),
        }
    }
}

fn groups(job: &str, targets: &[WatchTarget]) -> Vec<Group> {
    let keys: Vec<String> = targets.iter().filter_map(|t| if let WatchTarget::Key(k) = t { Some(k.clone()) } else { None }).collect();
    let mut groups = Vec::new();
    if !keys.is_empty() {
        groups.push(Group::keys(job, keys));
    }
    for target in targets {
        if let WatchTarget::Prefix(p) = target {
            groups.push(Group { select: Select::Prefix(names::prefix_selector(job, p)), wanted: Filter::Prefix(p.clone()) });
        }
    }
    groups
}

/// Follows `targets` from now: returns once the server has accepted every stream.
pub(super) async fn follow(server: &Server, job: &str, targets: &[WatchTarget], lost_after: Duration) -> Result<UnboundedReceiver<WatchEvent>, StoreError> {
    let (tx, rx) = mpsc::unbounded_channel();
    for group in groups(job, targets) {
        let (known, version) = list(server, &group, Read::Current).await?;
        let stream = open(server, &group, &version).await?.map_err(|s| server.rejected("watch", s))?;
        let follower = Follower { server: server.clone(), group, known, version, tx: tx.clone(), lost_after };
        tokio::spawn(follower.run(stream));
    }
    Ok(rx)
}

/// Whether `key` exists by `deadline`: a list (it may be there already; if not, the version to watch
/// from), then one watch of it from that version until it is written. Two requests when the key comes
/// (a join's look costs the server little), where a [`follow`] and a read would cost three and a task.
/// The list is the server's cache as it is: a key it has not seen yet comes by the watch from there, and a
/// busy server answers at once rather than after catching up with etcd (at 256 nodes joining, seconds).
pub(super) async fn wait_for(server: &Server, job: &str, key: &str, deadline: Instant) -> Result<bool, StoreError> {
    let group = Group::keys(job, vec![key.to_string()]);
    loop {
        let (known, version) = list(server, &group, Read::Cached).await?;
        if !known.is_empty() {
            return Ok(true);
        }
        let mut stream = match open(server, &group, &version).await? {
            Ok(stream) => stream,
            // Compacted between the list and the watch: list again.
            Err(s) if s.code == 410 => continue,
            Err(s) => return Err(server.rejected("watch", s)),
        };
        loop {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Err(_) => return Ok(false),
                Ok(Some(Ok(KubeEvent::Added(_) | KubeEvent::Modified(_)))) => return Ok(true),
                Ok(Some(Ok(KubeEvent::Deleted(_) | KubeEvent::Bookmark(_)))) => {}
                // The stream ended or broke (a restart, 410 Gone): list again, if there is time.
                Ok(Some(Ok(KubeEvent::Error(_)) | Err(_)) | None) => break,
            }
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// How current a list must be.
#[derive(Clone, Copy)]
enum Read {
    /// As of now: what a follower reports changes against.
    Current,
    /// The server's cache, whatever version it holds: what a watch from its version completes.
    Cached,
}

/// The keys of `group` that exist, and a resourceVersion to watch from: every change after it is one the
/// reading may not show. A prefix is one list by label; keys are read by name, the first alone (its version
/// is the one returned), the rest together after it (a change between two reads comes by the watch as
/// well: the caller re-reads what an event names).
async fn list(server: &Server, group: &Group, read: Read) -> Result<(HashSet<String>, String), StoreError> {
    let (first, rest) = match &group.select {
        Select::Prefix(selector) => (ListParams::default().labels(selector), Vec::new()),
        Select::Keys { names, .. } => {
            let mut params = names.iter().map(|n| ListParams::default().fields(&by_name(n)));
            (params.next().unwrap_or_default(), params.collect())
        }
    };
    let params = |p: ListParams| match read {
        Read::Current => p,
        Read::Cached => p.match_any(),
    };
    let found = server.call("list", server.leases.list(&params(first))).await?;
    let version = found.metadata.resource_version.clone().unwrap_or_default();
    let rest: Vec<ListParams> = rest.into_iter().map(params).collect();
    let more = futures::future::try_join_all(rest.iter().map(|p| server.call("list", server.leases.list(p)))).await?;
    let known = std::iter::once(found)
        .chain(more)
        .flat_map(|list| list.items)
        .filter_map(|l| object::entry(&l).ok())
        .map(|e| e.key)
        .filter(|k| group.wanted.wants(k))
        .collect();
    Ok((known, version))
}

type Events = std::pin::Pin<Box<dyn Stream<Item = Result<KubeEvent<Lease>, kube::Error>> + Send>>;

/// The stream from `version`; Err(410) inside: that version is compacted away.
async fn open(server: &Server, group: &Group, version: &str) -> Result<Result<Events, kube::core::Status>, StoreError> {
    Ok(server.request("watch", server.leases.watch(&group.select.watch(), version)).await?.map(StreamExt::boxed))
}

struct Follower {
    server: Server,
    group: Group,
    known: HashSet<String>,
    version: String,
    tx: UnboundedSender<WatchEvent>,
    lost_after: Duration,
}

/// What one event of a stream asks of its follower.
enum Next {
    Go,
    /// The version is gone: list again.
    Relist,
    /// The stream ended or failed: open it again.
    Reopen,
}

impl Follower {
    async fn run(mut self, mut stream: Events) {
        loop {
            let next = tokio::select! {
                event = stream.next() => self.take(event),
                () = self.tx.closed() => return,
            };
            match next {
                Next::Go => continue,
                Next::Relist if self.relist().await.is_err() => return,
                Next::Relist | Next::Reopen => {}
            }
            match self.reopen().await {
                Some(s) => stream = s,
                None => return,
            }
        }
    }

    fn take(&mut self, event: Option<Result<KubeEvent<Lease>, kube::Error>>) -> Next {
        let (kind, lease) = match event {
            Some(Ok(KubeEvent::Added(l) | KubeEvent::Modified(l))) => (WatchEventKind::Written, l),
            Some(Ok(KubeEvent::Deleted(l))) => (WatchEventKind::Deleted, l),
            Some(Ok(KubeEvent::Bookmark(b))) => {
                self.version = b.metadata.resource_version;
                return Next::Go;
            }
            Some(Ok(KubeEvent::Error(status))) if status.code == 410 => return Next::Relist,
            Some(Ok(KubeEvent::Error(status))) => {
                tracing::debug!("a watch of the API server ended: {status}");
                return Next::Reopen;
            }
            Some(Err(e)) => {
                tracing::debug!("a watch of the API server failed: {e}");
                return Next::Reopen;
            }
            None => return Next::Reopen,
        };
        if let Some(v) = &lease.metadata.resource_version {
            self.version = v.clone();
        }
        if let Ok(entry) = object::entry(&lease) {
            if self.group.wanted.wants(&entry.key) {
                match kind {
                    WatchEventKind::Written => self.known.insert(entry.key.clone()),
                    WatchEventKind::Deleted => self.known.remove(&entry.key),
                };
                let _ = self.tx.send(WatchEvent { kind, key: entry.key });
            }
        }
        Next::Go
    }

    /// After a 410: the keys now, and an event for each that appeared or went meanwhile (a key written
    /// again in the gap is reported written: the caller re-reads what it follows).
    async fn relist(&mut self) -> Result<(), ()> {
        let deadline = Instant::now() + self.lost_after;
        loop {
            match list(&self.server, &self.group, Read::Current).await {
                Ok((now, version)) => {
                    for key in now.iter() {
                        let _ = self.tx.send(WatchEvent { kind: WatchEventKind::Written, key: key.clone() });
                    }
                    for key in self.known.difference(&now) {
                        let _ = self.tx.send(WatchEvent { kind: WatchEventKind::Deleted, key: key.clone() });
                    }
                    (self.known, self.version) = (now, version);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    tracing::debug!("cannot list the watched keys again: {e}");
                    return Err(());
                }
                Err(_) => tokio::time::sleep(RETRY).await,
            }
        }
    }

    /// The stream again from the last version delivered, or None (the channel closes) once the server has
    /// not taken it back for `lost_after`.
    async fn reopen(&mut self) -> Option<Events> {
        let deadline = Instant::now() + self.lost_after;
        loop {
            if self.tx.is_closed() {
                return None;
            }
            match open(&self.server, &self.group, &self.version).await {
                Ok(Ok(stream)) => return Some(stream),
                Ok(Err(_gone)) => {
                    if self.relist().await.is_err() {
                        return None;
                    }
                }
                Err(e) if Instant::now() >= deadline => {
                    tracing::debug!("the API server did not take a watch back within {:?}: {e}", self.lost_after);
                    return None;
                }
                Err(_) => tokio::time::sleep(RETRY).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_one_stream_and_each_prefix_has_its_own() {
        let targets = [
            WatchTarget::Key("j/round".into()),
            WatchTarget::Prefix("j/waiting/".into()),
            WatchTarget::Key("j/alive/a".into()),
            WatchTarget::Prefix("j/acks/".into()),
        ];
        let groups = groups("j/", &targets);
        assert_eq!(groups.len(), 3);
        assert!(groups[0].wanted.wants("j/alive/a") && !groups[0].wanted.wants("j/alive/b"));
        let keys = ["j/round".to_string(), "j/alive/a".to_string()];
        let names = keys.iter().map(|k| names::object_name("j/", k)).collect();
        assert_eq!(groups[0].select, Select::Keys { names, selector: names::keys_selector("j/", &keys) });
        assert_eq!(groups[0].select.watch().label_selector, Some(names::keys_selector("j/", &keys)));
        assert!(groups[1].wanted.wants("j/waiting/x") && !groups[1].wanted.wants("j/acks/x"));
        assert_eq!(groups[2].select, Select::Prefix(names::prefix_selector("j/", "j/acks/")));
    }

    #[test]
    fn one_key_is_selected_by_its_name() {
        let groups = groups("j/", &[WatchTarget::Key("j/r/3/sealed".into())]);
        assert_eq!(groups.len(), 1);
        assert!(groups[0].wanted.wants("j/r/3/sealed") && !groups[0].wanted.wants("j/r/3/sealer"));
        let watch = groups[0].select.watch();
        assert_eq!(watch.field_selector, Some(format!("metadata.name={}", names::object_name("j/", "j/r/3/sealed"))));
        assert_eq!(watch.label_selector, None);
    }
}
