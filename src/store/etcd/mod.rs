//! The [`Store`] trait on etcd v3's gRPC API, so a job's rendezvous outlives any one machine: one HTTP/2
//! connection per member carries every request and stream of the handle, the members fail over, writes are
//! transactions, session keys live on a lease this handle keeps alive, watches resume from their revision.
//!
//! Every key is put under the namespace (`etcd_prefix`, default `/`), so the rendezvous' keys for run `R`
//! are `/muster/R/…`. Compare-and-set and counters are transactions compared on the key's revision.

mod answer;
mod cluster;
mod connect;
mod counter;
mod lease;
pub mod local;
mod pb;
mod reads;
mod tls;
mod watch;
pub mod wire;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{timeout_at, Instant};
use tonic::Code;

pub use cluster::Credentials;
pub use tls::TlsFiles;

use self::cluster::Cluster;
use self::lease::Session;
use self::cluster::Message;
use self::pb::path;
use self::watch::{Namer, Target, Watches};
use self::wire::Compare;
use super::{Reach, Store, StoreError, WatchEvent, WatchEventKind, WatchTarget};

/// How to reach etcd and what this handle's session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `host:port` of each member's client URL.
    pub endpoints: Vec<String>,
    /// https with these files; None: http.
    pub tls: Option<TlsFiles>,
    pub credentials: Option<Credentials>,
    /// Put before every key; ends with `/`.
    pub namespace: String,
    /// The lease of the session keys: how long a node killed stays a member.
    pub lease_ttl: Duration,
    /// Bounds every request (across members and retries).
    pub request_timeout: Duration,
}

/// etcd's default `--max-txn-ops`: the most operations one transaction may hold.
const MAX_TXN_OPS: usize = 128;

pub struct EtcdStore {
    cluster: Arc<Cluster>,
    session: Arc<Session>,
    watches: Watches,
    namespace: Arc<str>,
    timeout: Duration,
    version: String,
    /// A read-only transaction may be cancelled (see `reads`).
    cancel_reads: bool,
    /// Waits past their first read, waiting for the key's event (tests wait on it: `testing`).
    #[cfg(test)]
    parked: Arc<std::sync::atomic::AtomicUsize>,
}

impl EtcdStore {
    /// Reaches a member within `connect_timeout` (else [`StoreError::Unreachable`]) and checks it is etcd.
    pub async fn connect(opts: &EtcdOptions, connect_timeout: Duration) -> Result<EtcdStore, StoreError> {
        let cluster = Arc::new(Cluster::new(&opts.endpoints, opts.tls.as_ref(), opts.credentials.clone()).await?);
        let status: pb::StatusResponse = cluster.call(path::STATUS, &pb::StatusRequest {}, Instant::now() + connect_timeout).await?;
        if status.version.is_empty() {
            return Err(StoreError::NotEtcd {
                endpoint: cluster.named.clone(),
                answer: "a status reply without a version".into(),
            });
        }
        let cancel_reads = reads::survives_cancelled_reads(&status.version);
        tracing::debug!("etcd {} at {} (read-only transactions may be cancelled: {cancel_reads})", status.version, cluster.named);
        readable(&cluster, opts, Instant::now() + connect_timeout).await?;
        Ok(EtcdStore {
            session: Session::new(cluster.clone(), opts.lease_ttl, opts.request_timeout),
            watches: Watches::start(cluster.clone(), Namer(opts.namespace.as_str().into()), opts.lease_ttl),
            cluster,
            namespace: opts.namespace.as_str().into(),
            timeout: opts.request_timeout,
            version: status.version,
            cancel_reads,
            #[cfg(test)]
            parked: Default::default(),
        })
    }

    /// The etcd version the member reached at connect reported (e.g. `3.5.17`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The members' URLs, comma-separated.
    pub fn endpoints(&self) -> &str {
        &self.cluster.named
    }

    fn full(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.namespace.len() + key.len());
        full.extend_from_slice(self.namespace.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    fn name(&self, key: &[u8]) -> String {
        String::from_utf8_lossy(key.strip_prefix(self.namespace.as_bytes()).unwrap_or(key)).into_owned()
    }

    async fn call<Q: Message, R: Message>(&self, path: &'static str, body: &Q) -> Result<R, StoreError> {
        self.cluster.call(path, body, Instant::now() + self.timeout).await
    }

    async fn txn(&self, body: &pb::TxnRequest) -> Result<pb::TxnResponse, StoreError> {
        self.call(path::TXN, body).await
    }

    /// One key (without its value when `keys_only`), if it exists.
    async fn range(&self, key: &[u8], keys_only: bool) -> Result<Option<pb::KeyValue>, StoreError> {
        let reply: pb::RangeResponse = self.call(path::RANGE, &wire::range(key, false, keys_only)).await?;
        Ok(wire::first(reply))
    }

    fn failed(&self, message: String) -> StoreError {
        StoreError::Etcd { endpoint: self.cluster.named.clone(), code: 0, message }
    }
}

/// Whether this agent may read its keys: an etcd with auth on refuses a request without a user as an
/// invalid argument and one whose user lacks a role as denied; both are settings to fix (exit 2), said at
/// start rather than on the rendezvous' first request. One key is read, the namespace's own (a role that
/// covers the namespace covers it): a read of everything under it would cost etcd every node's keys at
/// every connect, O(N) a node while a whole job connects. Serializable: the member checks the user's
/// permission all the same, and answers from its own state without asking the leader (a whole job connects
/// at once).
async fn readable(cluster: &Cluster, opts: &EtcdOptions, deadline: Instant) -> Result<(), StoreError> {
    let body = pb::RangeRequest { serializable: true, ..wire::range(opts.namespace.as_bytes(), false, true) };
    const INVALID_ARGUMENT: i64 = Code::InvalidArgument as i64;
    const PERMISSION_DENIED: i64 = Code::PermissionDenied as i64;
    let why = match cluster.call::<_, pb::RangeResponse>(path::RANGE, &body, deadline).await {
        Err(StoreError::Etcd { code: INVALID_ARGUMENT, message, .. }) if opts.credentials.is_none() => {
            format!("it has auth on and needs a user ({message})")
        }
        Err(StoreError::Etcd { code: PERMISSION_DENIED, message, .. }) => {
            format!("the user may not read {} ({message}); grant it a role with read and write there", opts.namespace)
        }
        other => return other.map(drop),
    };
    let user = opts.credentials.as_ref().map(|c| c.user.clone()).unwrap_or_default();
    Err(StoreError::EtcdAuth { endpoints: cluster.named.clone(), user, why })
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.session.end();
    }
}

impl Store for EtcdStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.call::<_, pb::PutResponse>(path::PUT, &wire::put(&self.full(key), value, None)).await.map(drop)
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.range(&self.full(key), false).await?.map(counter::visible))
    }

    /// A counter only ever added 1 to is counted by etcd (see `counter`); other adds compare-and-set.
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.add_to(&self.full(key), delta).await
    }

    /// Absent counts as empty: an empty `expected` matches a missing key (and an empty value, compared on
    /// its revision).
    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let key = self.full(key);
        let mut compare = if expected.is_empty() { Compare::Absent(&key) } else { Compare::Value(&key, expected) };
        loop {
            let put = wire::op_put(wire::put(&key, desired, None));
            let read = wire::op_range(wire::range(&key, false, false));
            let reply = self.txn(&wire::txn(&[compare.clone()], vec![put], vec![read])).await?;
            if reply.succeeded {
                return Ok(desired.to_vec());
            }
            let current = wire::ranges(reply).next().and_then(wire::first);
            match current {
                Some(kv) if expected.is_empty() && kv.value.is_empty() && compare != Compare::ModRevision(&key, kv.mod_revision) => {
                    compare = Compare::ModRevision(&key, kv.mod_revision);
                }
                Some(kv) => return Ok(kv.value),
                None => return Ok(Vec::new()),
            }
        }
    }

    /// A watcher on the handle's stream, created before the key is read: a write after the read is an
    /// event.
    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        let deadline = Instant::now() + timeout;
        let mut events = self.follow(&[WatchTarget::Key(key.to_string())]).await?;
        if self.range(&self.full(key), true).await?.is_some() {
            return Ok(true);
        }
        #[cfg(test)]
        let _parked = testing::Gauge::enter(&self.parked);
        loop {
            match timeout_at(deadline, events.recv()).await {
                Ok(Some(WatchEvent { kind: WatchEventKind::Written, .. })) => return Ok(true),
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(self.cluster.gave_up("wait", "the watch ended".to_string()));
                }
                Err(_) => return Ok(false),
            }
        }
    }

    /// In transactions of at most [`MAX_TXN_OPS`] keys each, sent together: the sealer's assignments of 4096
    /// nodes are 32 of them, one round trip each to a member busy with the round when sent one by one. Each
    /// transaction is all or nothing, the whole set is not: returns once every one has been applied.
    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.timeout;
        let mut sent = tokio::task::JoinSet::new();
        for chunk in pairs.chunks(MAX_TXN_OPS) {
            let puts = chunk.iter().map(|(k, v)| wire::op_put(wire::put(&self.full(k), v, None))).collect();
            let (cluster, body) = (self.cluster.clone(), wire::txn(&[], puts, vec![]));
            sent.spawn(async move { cluster.call::<_, pb::TxnResponse>(path::TXN, &body, deadline).await });
        }
        while let Some(done) = sent.join_next().await {
            done.map_err(|e| self.failed(format!("a write of several keys ended: {e}")))??;
        }
        Ok(())
    }

    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let reads = keys.iter().map(|k| wire::range(&self.full(k), false, false)).collect();
        let replies = self.read_all(reads).await?.into_iter();
        Ok(replies.map(|(read, _)| wire::first(read).map(counter::visible).filter(|v| !v.is_empty())).collect())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let reply: pb::RangeResponse = self.call(path::RANGE, &wire::range(&self.full(prefix), true, true)).await?;
        Ok(reply.kvs.iter().map(|kv| self.name(&kv.key)).collect())
    }

    /// One Range of the prefix, values and all.
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let reply: pb::RangeResponse = self.call(path::RANGE, &wire::range(&self.full(prefix), true, false)).await?;
        let pairs = reply.kvs.into_iter().map(|kv| (self.name(&kv.key), counter::visible(kv)));
        Ok(pairs.filter(|(_, v)| !v.is_empty()).collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let key = self.full(key);
        self.session.forget(&key);
        let reply: pb::DeleteRangeResponse = self.call(path::DELETE_RANGE, &wire::delete(&key)).await?;
        Ok(reply.deleted > 0)
    }

    /// On the session's lease; etcd's reply is its acknowledgement. A member that does not answer in
    /// time is not asked first next time (it may be a leader dying mid-request).
    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        let deadline = Instant::now() + timeout;
        let lease = tokio::time::timeout_at(deadline, self.session.lease()).await.map_err(|_| {
            self.cluster.gave_up(path::LEASE_GRANT, format!("no lease within {timeout:?}"))
        })??;
        let body = wire::put(&self.full(key), value, Some(lease));
        self.cluster.call::<_, pb::PutResponse>(path::PUT, &body, deadline).await.map(drop)
    }

    /// A serializable read: any live member answers it from its own state, without a quorum round.
    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        let body = pb::RangeRequest { serializable: true, ..wire::range(&self.full(key), false, true) };
        self.cluster.call::<_, pb::RangeResponse>(path::RANGE, &body, Instant::now() + timeout).await.map(drop)
    }

    async fn reach(&self, timeout: Duration) -> Reach {
        crate::store::reach_any(self.cluster.hosts(), timeout).await
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.session.put(self.full(key), value).await
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        self.follow(targets).await
    }
}

impl EtcdStore {
    /// Watchers of `targets` on the handle's stream, from now: returns once etcd has created them, so every
    /// write after this call returns (and any since their creation) is delivered. No read: the callers read
    /// what they need after (as etcd's own client, which resumes each watcher after the revision it was
    /// created at).
    async fn follow(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        if targets.is_empty() {
            return Ok(rx);
        }
        let wanted = targets
            .iter()
            .map(|t| match t {
                WatchTarget::Key(k) => Target::new(self.full(k), false),
                WatchTarget::Prefix(p) => Target::new(self.full(p), true),
            })
            .collect();
        let (created, done) = tokio::sync::oneshot::channel();
        self.watches.add(wanted, tx, created);
        match timeout_at(Instant::now() + self.timeout, done).await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(_)) => Err(self.cluster.gave_up(path::WATCH, "the watch stream failed before etcd created the watch".into())),
            Err(_) => Err(self.cluster.gave_up(path::WATCH, format!("etcd did not create the watch within {:?}", self.timeout))),
        }
    }
}
