//! Reaching the API server: the client as `kubectl` would make it (in a pod, the service account; else a
//! kubeconfig), the namespace, every request bounded by a deadline, and what a failure means to the
//! rendezvous: the server unreachable or overloaded (wait and retry: [`StoreError::ApiServerUnreachable`],
//! said once an outage lasts, and once at its end), a refusal that settings must fix (exit 2), or a request the
//! server rejected.

use std::future::Future;
use std::path::PathBuf;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::Status;
use kube::{Client, Config};

use super::object::{self, Owner};
use crate::store::{Outage, StoreError};

/// Where the API server is and who this agent is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`, the mounted token and CA).
    InCluster,
    /// A kubeconfig file's current context.
    Kubeconfig(PathBuf),
    /// As `kubectl`: `KUBECONFIG`, else `~/.kube/config`, else the service account.
    Inferred,
}

/// The handle's client: the Leases of its namespace, and the server's URL for messages.
#[derive(Clone)]
pub struct Server {
    pub leases: Api<Lease>,
    pub client: Client,
    pub namespace: String,
    pub url: String,
    pub timeout: Duration,
    /// Shared by the handle's clones: one outage is said once, however many requests fail.
    outage: Arc<Outage>,
    /// Objects this handle wrote (at most [`KNOWN`] names): a write patches them first, creates others first.
    written: Arc<Mutex<HashSet<String>>>,
    /// The owner of the objects this handle creates, found once at connect.
    owner: Option<Arc<Owner>>,
}

/// Names a handle remembers having written; forgetting them all costs one request each at most.
const KNOWN: usize = 4096;

impl Server {
    /// Builds the client; `namespace`: the one to use, else the kubeconfig's or the pod's.
    pub async fn connect(credentials: &Credentials, namespace: Option<&str>, timeout: Duration) -> Result<Server, StoreError> {
        let config = config(credentials).await?;
        let namespace = namespace.map_or_else(|| config.default_namespace.clone(), str::to_string);
        let url = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .map_err(|e| StoreError::BadSetting { what: format!("cannot make a client of the API server at {url}: {e}") })?;
        let leases = Api::namespaced(client.clone(), &namespace);
        Ok(Server { leases, client, namespace, url, timeout, outage: Arc::default(), written: Arc::default(), owner: None })
    }

    /// This handle's objects owned by `owner` from now on.
    pub fn owned_by(self, owner: Option<Owner>) -> Server {
        Server { owner: owner.map(Arc::new), ..self }
    }

    /// Creates `lease`, owned as [`object::owned`] says.
    pub fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send + 'static {
        let (leases, lease) = (self.leases.clone(), object::owned(lease, self.owner.as_deref()));
        async move { leases.create(&PostParams::default(), &lease).await }
    }

    /// Replaces object `name` with `lease` (an update: conditional where `lease` has a resourceVersion),
    /// owned as a create would make it: an update replaces the owners too.
    pub fn replace(&self, name: &str, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send + 'static {
        let (leases, name, lease) = (self.leases.clone(), name.to_string(), object::owned(lease, self.owner.as_deref()));
        async move { leases.replace(&name, &PostParams::default(), &lease).await }
    }

    /// Whether this handle writes object `name` for the first time (as far as it remembers).
    pub fn first_write(&self, name: &str) -> bool {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if written.len() >= KNOWN {
            written.clear();
        }
        written.insert(name.to_string())
    }

    /// Runs `request` within the handle's deadline; what failed is said as the rendezvous handles it.
    pub async fn call<T>(&self, op: &'static str, request: impl Future<Output = Result<T, kube::Error>>) -> Result<T, StoreError> {
        match self.request(op, request).await? {
            Ok(value) => Ok(value),
            Err(refused) => Err(self.rejected(op, refused)),
        }
    }

    /// As [`Self::call`], but a refusal the caller decides on (the object is absent, or it changed or
    /// exists: 404 and 409; a watch's version compacted away: 410; a JSON patch's test failed: 422) comes
    /// back as the server's status.
    pub async fn request<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, Status>, StoreError> {
        let answer = match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(value)) => Ok(Ok(value)),
            Ok(Err(kube::Error::Api(s))) if s.is_not_found() || [409, 410, 422].contains(&s.code) => Ok(Err(*s)),
            Ok(Err(kube::Error::Api(s))) => Err(self.rejected(op, *s)),
            Ok(Err(e)) => Err(self.unreachable(op, e.to_string())),
            Err(_) => Err(self.unreachable(op, format!("no answer within {:?}", self.timeout))),
        };
        if !matches!(answer, Err(StoreError::ApiServerUnreachable { .. })) && self.outage.answered() {
            tracing::info!("the Kubernetes API server answers again at {}", self.url);
        }
        answer
    }

    /// What a refusal means: a server that cannot serve now is waited for as an outage; one that refuses
    /// this agent the verb is a setting to fix; the rest the server rejected.
    pub fn rejected(&self, op: &'static str, s: Status) -> StoreError {
        if s.is_forbidden() {
            return StoreError::KubeForbidden { verb: verb(op).to_string(), namespace: self.namespace.clone(), message: s.message };
        }
        if s.code == 429 || s.code >= 500 {
            return self.unreachable(op, format!("{} ({})", s.message, s.code));
        }
        self.failed(op, format!("{} ({})", s.message, s.code))
    }

    /// `op` failed for a reason that is not the server's status: an object that is not ours, a request or
    /// a patch that could not be made.
    pub fn failed(&self, op: &'static str, message: impl std::fmt::Display) -> StoreError {
        StoreError::Kube { server: self.url.clone(), op, message: message.to_string() }
    }

    /// An outage: said once it lasts (the agent's retries and every other request are quiet).
    pub fn unreachable(&self, op: &'static str, last: String) -> StoreError {
        if self.outage.failed() {
            tracing::warn!("the Kubernetes API server at {} does not answer ({op}: {last}); retrying", self.url);
        }
        StoreError::ApiServerUnreachable { server: self.url.clone(), op, last }
    }

    /// The API server's `host:port`, for the fence's look for a path.
    pub fn host(&self) -> Option<String> {
        let uri: http::Uri = self.url.parse().ok()?;
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("http") { 80 } else { 443 });
        Some(format!("{}:{port}", uri.host()?))
    }
}

/// The Kubernetes verb an operation of this store needs (what a refusal names).
fn verb(op: &str) -> &str {
    match op {
        "get" | "wait" | "ping" | "metrics" => "get",
        "list" | "scan" | "multi_get" => "list",
        "watch" => "watch",
        "create" => "create",
        "delete" => "delete",
        "delete_collection" => "deletecollection",
        "set" | "beat" => "patch",
        _ => "update",
    }
}

async fn config(credentials: &Credentials) -> Result<Config, StoreError> {
    let bad = |what: String| StoreError::BadSetting { what };
    match credentials {
        Credentials::InCluster => Config::incluster().map_err(|e| {
            bad(format!("--rdzv-backend k8s: no in-cluster service account ({e}); outside a pod give a kubeconfig as --rdzv-endpoint"))
        }),
        Credentials::Kubeconfig(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| bad(format!("--rdzv-endpoint {}: not a readable kubeconfig: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(format!("--rdzv-endpoint {}: {e}", path.display())))
        }
        Credentials::Inferred => Config::infer().await.map_err(|e| {
            bad(format!("--rdzv-backend k8s: neither a kubeconfig (KUBECONFIG, ~/.kube/config) nor a pod's service account: {e}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operation_names_the_verb_rbac_must_grant() {
        let table = [
            ("get", "get"),
            ("wait", "get"),
            ("list", "list"),
            ("scan", "list"),
            ("watch", "watch"),
            ("create", "create"),
            ("set", "patch"),
            ("compare_set", "update"),
            ("beat", "patch"),
            ("delete", "delete"),
            ("delete_collection", "deletecollection"),
        ];
        for (op, want) in table {
            assert_eq!(verb(op), want, "{op}");
        }
    }
}
