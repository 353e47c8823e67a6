//! The [`Store`] trait on the Kubernetes API server, so that a job on Kubernetes needs neither a special
//! pod nor an etcd of its own: the cluster's control plane is the rendezvous. Each key is one
//! `coordination.k8s.io/v1` Lease of the job's namespace (`names`, `object`); compare-and-set and a
//! counter's add are updates conditional on the object's resourceVersion; watches resume
//! from a resourceVersion and list again on 410 Gone (`watch`); the session is a Lease its holder renews,
//! the heartbeat's own object (`session`), and sessions not renewed are reaped by the agents (`reap`). The
//! API server has no transactions: a write of several keys is several writes, sent together.

mod access;
mod client;
mod names;
mod object;
mod owner;
mod reap;
mod session;
mod watch;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use client::Credentials;

use self::client::Server;
use self::object::{Entry, Holder, Link};
use self::session::Session;
use super::{Reach, Store, StoreError, WatchEvent, WatchTarget};

/// How to reach the API server and what this handle's session is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeOptions {
    pub credentials: Credentials,
    /// The namespace of the job's objects; None: the pod's, or the kubeconfig context's.
    pub namespace: Option<String>,
    /// The run's own prefix (`muster/<run id>/`): every object of the job carries its label.
    pub job: String,
    /// The key this handle beats (the agent's heartbeat key): its object is the session object. None: a
    /// session object of the handle's own.
    pub session_key: Option<String>,
    /// Written as the session object's holder (the agent's id).
    pub holder: String,
    /// How long a killed node's session lasts.
    pub lease_ttl: Duration,
    /// Bounds every request.
    pub request_timeout: Duration,
    /// The most nodes of the job: paces the reapers' sweeps from the start.
    pub peers: u32,
    /// The pod this agent runs in (`POD_NAME`, from the downward API): its controller (a Job, PyTorchJob,
    /// Volcano Job) owns the job's objects, so they go with it. None: the last agent deletes them.
    pub pod: Option<String>,
    /// Keys under this prefix are never owned (the lemon memory, which a requeued job keeps).
    pub unowned: String,
}

/// Writes at most this many keys at once (a sealer's assignments): the API server's default
/// max-requests-inflight is 400 for the whole cluster.
const CONCURRENT: usize = 32;

/// Keys a list of `multi_get` selects at most (a label selector's set; the URL stays a few KiB).
const MULTI_GET: usize = 64;
/// Keys `multi_get` reads one by one at most, all at once: a read by name is one key of etcd's, where a
/// list by label reads every object of the namespace (the join's looks: two or three keys, from every
/// joiner).
const BY_NAME: usize = 4;

/// How far apart the adds of a job's nodes are spread, a node: the first try waits at most this times
/// `peers` (about 60 adds a second, what the API server applied to one object on 2 cores while 1024
/// nodes joined), and a lost one retries within that, at most. The server applies one object's writes one
/// at a time: N joiners adding to it at once must be spread where they start, or N-1 of them lose each
/// write.
const ADD_SPREAD: Duration = Duration::from_millis(16);

pub struct KubeStore {
    server: Server,
    job: Arc<str>,
    session: Arc<Session>,
    reaper: JoinHandle<()>,
    lost_after: Duration,
    /// The most nodes of the job: how far its adds are spread.
    peers: u32,
}

impl KubeStore {
    /// Makes the client and checks, within `connect_timeout`, that the server answers and grants every
    /// verb the rendezvous uses on Leases in the namespace.
    pub async fn connect(opts: &KubeOptions, connect_timeout: Duration) -> Result<KubeStore, StoreError> {
        let server = Server::connect(&opts.credentials, opts.namespace.as_deref(), opts.request_timeout).await?;
        match tokio::time::timeout(connect_timeout, access::check(&server)).await {
            Ok(checked) => checked?,
            Err(_) => return Err(server.unreachable("review", format!("no answer within {connect_timeout:?}"))),
        }
        let owner = match &opts.pod {
            Some(pod) => owner::find(&server, pod, opts.unowned.clone()).await?,
            None => None,
        };
        let server = server.owned_by(owner);
        let session_key = opts.session_key.clone().unwrap_or_else(|| format!("{}sessions/{}", opts.job, uuid::Uuid::new_v4().simple()));
        let holder = Holder { id: opts.holder.clone(), ttl: opts.lease_ttl };
        let session = Session::new(server.clone(), opts.job.clone(), session_key, holder);
        let reaper = reap::start(server.clone(), opts.job.clone(), opts.lease_ttl, opts.peers, session.name());
        Ok(KubeStore { server, job: opts.job.as_str().into(), session, reaper, lost_after: opts.lease_ttl, peers: opts.peers })
    }

    /// The API server's URL and the namespace, for the banner.
    pub fn describe(&self) -> String {
        format!("{} (namespace {})", self.server.url, self.server.namespace)
    }

    /// The API server's `/metrics` text (the user needs `get` on that URL: the bench reads the server's own
    /// counts with it).
    pub async fn metrics(&self) -> Result<String, StoreError> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| self.server.failed("metrics", e))?;
        self.server.call("metrics", self.server.client.request_text(request)).await
    }

    async fn read(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        let name = names::object_name(&self.job, key);
        match self.server.request("get", self.server.leases.get(&name)).await? {
            Ok(lease) => object::entry(&lease)
                .map(Some)
                .map_err(|e| self.server.failed("get", e)),
            Err(s) if s.is_not_found() => Ok(None),
            Err(s) => Err(self.server.rejected("get", s)),
        }
    }

    /// A write conditional on `current` (None: the key is absent): whether it won.
    async fn write_if(&self, key: &str, current: Option<&Entry>, value: &[u8]) -> Result<bool, StoreError> {
        let answer = match current {
            None => {
                let lease = object::lease(&self.job, key, value, None, Link::None);
                self.server.request("create", self.server.create(&lease)).await?
            }
            Some(e) => {
                let name = e.session.clone().unwrap_or_default();
                let link = if name.is_empty() { Link::None } else { Link::SessionKey { session: &name, uid: None } };
                let lease = object::lease(&self.job, key, value, Some(&e.version), link);
                self.server.request("compare_set", self.server.replace(&names::object_name(&self.job, key), &lease)).await?
            }
        };
        match answer {
            Ok(_) => Ok(true),
            Err(s) if s.code == 409 || s.is_not_found() => Ok(false),
            Err(s) => Err(self.server.rejected("compare_set", s)),
        }
    }

    async fn listed(&self, prefix: &str) -> Result<Vec<Entry>, StoreError> {
        let selector = names::prefix_selector(&self.job, prefix);
        let found = self.server.call("list", self.server.leases.list(&ListParams::default().labels(&selector))).await?;
        Ok(found.items.iter().filter_map(|l| object::entry(l).ok()).filter(|e| names::under(&e.key, prefix)).collect())
    }
}

/// Writes `key` whatever it held: a patch (a Lease refuses an update without a resourceVersion; a patch
/// without one is unconditional), a create where it is absent.
async fn write(server: &Server, job: &str, key: &str, value: &[u8], link: Link<'_>) -> Result<(), StoreError> {
    if value.len() > object::MAX_VALUE {
        return Err(StoreError::BadSetting {
            what: format!("a rendezvous value of {} bytes for {key}: the API server store holds at most {} a key", value.len(), object::MAX_VALUE),
        });
    }
    let (name, lease) = (names::object_name(job, key), object::lease(job, key, value, None, link));
    overwrite(server, &name, &lease, "set").await.map(drop)
}

/// `lease` patched over `name`, its annotations replacing what the object held (a value written over a
/// counter's adds drops them), or created where it is absent: first, where this handle has not written it
/// before (most keys the rendezvous sets are new: records, assignments, a session's first beat).
async fn overwrite(server: &Server, name: &str, lease: &Lease, op: &'static str) -> Result<Lease, StoreError> {
    let mut patch = serde_json::to_value(lease).map_err(|e| server.failed(op, e))?;
    if let Some(annotations) = patch.pointer_mut("/metadata/annotations").and_then(serde_json::Value::as_object_mut) {
        annotations.insert("$patch".into(), "replace".into());
    }
    upsert(server, name, &Patch::Strategic(patch), lease, op, server.first_write(name)).await
}

/// `patch` applied to `name`, or `lease` created where it is absent (raced by another creator: patched
/// again). `fresh`: the create is tried first (one request where the key is new, two where it is not).
/// The server retries a patch that lost to another write a few times, then answers 409: patched again
/// after a random wait.
async fn upsert<P: serde::Serialize + std::fmt::Debug>(
    server: &Server,
    name: &str,
    patch: &Patch<P>,
    lease: &Lease,
    op: &'static str,
    fresh: bool,
) -> Result<Lease, StoreError> {
    let (mut backoff, mut creates, mut create) = (Backoff::default(), 0, fresh);
    loop {
        if create {
            match server.request("create", server.create(lease)).await? {
                Ok(written) => return Ok(written),
                // There already: patched.
                Err(s) if s.code == 409 => {}
                Err(s) => return Err(server.rejected("create", s)),
            }
        }
        match server.request(op, server.leases.patch(name, &PatchParams::default(), patch)).await? {
            Ok(written) => return Ok(written),
            Err(s) if s.code == 409 => {
                backoff.lost().await;
                create = false;
            }
            Err(s) if !s.is_not_found() => return Err(server.rejected(op, s)),
            Err(_) if creates == 3 => {
                return Err(server.failed(op, format!("{name} was deleted under this write three times")));
            }
            Err(_) => (creates, create) = (creates + 1, true),
        }
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        self.reaper.abort();
        self.session.end();
    }
}

impl Store for KubeStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        write(&self.server, &self.job, key, value, Link::None).await
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.read(key).await?.map(|e| e.value))
    }

    /// A decimal counter (as torch's store keeps one): read, then an update conditional on the version
    /// read, tried again after a random wait where another add won. Not an unconditional patch: the API
    /// server applies a patch that lost again and again within itself, holding the request, so N joiners
    /// patching one object at once cost it about N²/2 applications (at 1024 joiners on 2 cores, patches
    /// given up after 60 s); a conditional update that lost is refused at once (409), and its retry waits
    /// where it started.
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        if delta == 0 {
            return self.read(key).await?.map_or(Ok(0), |e| counter(key, &e.value));
        }
        let spread = ADD_SPREAD * self.peers.max(1);
        tokio::time::sleep(spread.mul_f64(reap::random_unit())).await;
        let mut backoff = Backoff::spread_over(spread);
        loop {
            let current = self.read(key).await?;
            let held = current.as_ref().map_or(Ok(0), |e| counter(key, &e.value))?;
            let now = held.checked_add(delta).ok_or_else(|| StoreError::BadSetting {
                what: format!("add of {delta} to {key}, which holds {held}: the count would overflow"),
            })?;
            if self.write_if(key, current.as_ref(), now.to_string().as_bytes()).await? {
                return Ok(now);
            }
            backoff.lost().await;
        }
    }

    /// Absent counts as empty: an empty `expected` matches a missing key and an empty value.
    async fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut backoff = Backoff::default();
        loop {
            let current = self.read(key).await?;
            let held = current.as_ref().map(|e| e.value.as_slice()).unwrap_or_default();
            if held != expected {
                return Ok(held.to_vec());
            }
            if self.write_if(key, current.as_ref(), desired).await? {
                return Ok(desired.to_vec());
            }
            backoff.lost().await;
        }
    }

    async fn wait(&self, key: &str, timeout: Duration) -> Result<bool, StoreError> {
        watch::wait_for(&self.server, &self.job, key, Instant::now() + timeout).await
    }

    /// [`CONCURRENT`] writes at a time; each is applied or not on its own.
    async fn multi_set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        // Collected first: a lazily mapped iterator's closure trips the Send check of the trait's future.
        let writes: Vec<_> = pairs.iter().map(|(k, v)| write(&self.server, &self.job, k, v, Link::None)).collect();
        futures::stream::iter(writes)
            .buffer_unordered(CONCURRENT)
            .try_collect::<Vec<()>>()
            .await
            .map(drop)
    }

    /// Up to [`BY_NAME`] keys, a read of each at once; more, one list a [`MULTI_GET`] keys, selected by
    /// their labels (a member's look at its ring).
    async fn multi_get(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.len() <= BY_NAME {
            let values = futures::future::try_join_all(keys.iter().map(|k| self.get(k))).await?;
            return Ok(values.into_iter().map(|v| v.filter(|v| !v.is_empty())).collect());
        }
        let mut found = std::collections::HashMap::new();
        for chunk in keys.chunks(MULTI_GET) {
            let selector = names::keys_selector(&self.job, chunk);
            let listed = self.server.call("multi_get", self.server.leases.list(&ListParams::default().labels(&selector))).await?;
            found.extend(listed.items.iter().filter_map(|l| object::entry(l).ok()).map(|e| (e.key, e.value)));
        }
        Ok(keys.iter().map(|k| found.get(k).filter(|v| !v.is_empty()).cloned()).collect())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.listed(prefix).await?.into_iter().map(|e| e.key).collect())
    }

    /// One list of the prefix, values and all.
    async fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.listed(prefix).await?.into_iter().filter(|e| !e.value.is_empty()).map(|e| (e.key, e.value)).collect())
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.session.forget(key);
        match self.server.request("delete", self.server.leases.delete(&names::object_name(&self.job, key), &DeleteParams::default())).await? {
            Ok(_) => Ok(true),
            Err(s) if s.is_not_found() => Ok(false),
            Err(s) => Err(self.server.rejected("delete", s)),
        }
    }

    /// On the session object when `key` is this handle's heartbeat key: the beat renews the session.
    async fn beat(&self, key: &str, value: &[u8], timeout: Duration) -> Result<(), StoreError> {
        let beat = async {
            if self.session.is_session_key(key) {
                self.session.beat(value).await
            } else {
                self.set(key, value).await
            }
        };
        tokio::time::timeout(timeout, beat).await.map_err(|_| self.server.unreachable("beat", format!("no answer within {timeout:?}")))?
    }

    /// A read of the key, bounded as the beat is; absent or not, the server answered.
    async fn ping(&self, key: &str, timeout: Duration) -> Result<(), StoreError> {
        let name = names::object_name(&self.job, key);
        let read = self.server.request("ping", self.server.leases.get(&name));
        match tokio::time::timeout(timeout, read).await {
            Ok(answer) => answer.map(drop),
            Err(_) => Err(self.server.unreachable("ping", format!("no answer within {timeout:?}"))),
        }
    }

    async fn reach(&self, timeout: Duration) -> Reach {
        let hosts: Vec<String> = self.server.host().into_iter().collect();
        crate::store::reach_any(&hosts, timeout).await
    }

    async fn set_session(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.session.put(key, value).await
    }

    /// One delete of the job's objects by label, those under `keep` spared.
    async fn forget_job(&self, keep: &str) -> Result<(), StoreError> {
        let gone = ListParams::default().labels(&names::job_selector_except(&self.job, keep));
        self.server.call("delete_collection", self.server.leases.delete_collection(&DeleteParams::default(), &gone)).await.map(drop)
    }

    async fn watch(&self, targets: &[WatchTarget]) -> Result<mpsc::UnboundedReceiver<WatchEvent>, StoreError> {
        watch::follow(&self.server, &self.job, targets, self.lost_after).await
    }
}

/// The wait after a conditional write lost to another writer of the key: random, below a ceiling that
/// doubles with each loss (2 ms to 512 ms by default). A lost write costs two requests here (the update
/// refused, the read again), so N writers of one key at once (a lock every node tries) retrying at once
/// would cost the server about N² of them; spread, about N log N.
struct Backoff {
    ceiling: Duration,
    most: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { ceiling: Duration::from_millis(2), most: Duration::from_millis(512) }
    }
}

impl Backoff {
    /// For writers spread over `spread` at first (a counter's adds): from a sixteenth of it to all of it,
    /// so that the writers a loss shows are many do not come back faster than they first came.
    fn spread_over(spread: Duration) -> Backoff {
        let default = Backoff::default();
        Backoff { ceiling: (spread / 16).max(default.ceiling), most: spread.max(default.most) }
    }

    async fn lost(&mut self) {
        tokio::time::sleep(self.ceiling.mul_f64(reap::random_unit())).await;
        self.ceiling = (self.ceiling * 2).min(self.most);
    }
}

/// A counter's value; empty is 0, as an absent key.
fn counter(key: &str, value: &[u8]) -> Result<i64, StoreError> {
    if value.is_empty() {
        return Ok(0);
    }
    std::str::from_utf8(value).ok().and_then(|v| v.trim().parse().ok()).ok_or_else(|| StoreError::BadSetting {
        what: format!("add on {key}, which holds {:?}, not a decimal integer", String::from_utf8_lossy(value)),
    })
}
