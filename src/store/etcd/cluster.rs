//! The etcd members and the requests to them: fail-over between members, each attempt bounded (a write sent
//! during a leader election hangs), the auth token, and what each failure means. An outage is said once
//! (after [`OUTAGE_AFTER`] of failures) and its end once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::tls::{self, TlsFiles};
use super::wire::{self, ErrorReply};
use crate::store::error::ETCD_CHECK;
use crate::store::StoreError;

/// One attempt at one member; a slower member is tried again later and the next one now.
const ATTEMPT: Duration = Duration::from_secs(2);
/// Failures this long in a row are an outage, said once; a leader election (1.1–1.6 s here) is not one.
const OUTAGE_AFTER: Duration = Duration::from_secs(3);
const BACKOFF: Duration = Duration::from_millis(200);

/// User name and password for etcd's auth, from the environment (never the command line).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <hidden>)", self.user)
    }
}

/// Why one attempt failed.
enum Failure {
    /// The member is down, electing, or slow: try the next one.
    Transient(String),
    /// The auth token expired: authenticate again, then retry.
    Token,
    Final(StoreError),
}

#[derive(Default)]
struct Outage {
    since: Option<Instant>,
    reported: bool,
}

pub(super) struct Cluster {
    urls: Vec<String>,
    /// The members as `host:port`.
    hosts: Vec<String>,
    client: reqwest::Client,
    /// For watch streams: no overall deadline (a watch may be quiet for days), TCP keepalive instead.
    streams: reqwest::Client,
    preferred: AtomicUsize,
    credentials: Option<Credentials>,
    token: Mutex<Option<String>>,
    outage: Mutex<Outage>,
    /// How the endpoints are named in messages.
    pub(super) named: String,
    /// Watch streams etcd confirmed created and still open (tests wait on it: `testing`).
    #[cfg(test)]
    pub(super) watching: std::sync::Arc<AtomicUsize>,
}

impl Cluster {
    /// Reads the TLS files (a wrong path or a bad PEM is a bad setting) and builds the clients.
    pub(super) async fn new(
        endpoints: &[String],
        tls_files: Option<&TlsFiles>,
        credentials: Option<Credentials>,
    ) -> Result<Cluster, StoreError> {
        let scheme = if tls_files.is_some() { "https" } else { "http" };
        let urls: Vec<String> = endpoints.iter().map(|e| format!("{scheme}://{e}")).collect();
        // reqwest builds a TLS set-up even for http; it needs a crypto provider (ring, installed once per
        // process: a later call finds it installed and changes nothing).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = match tls_files {
            Some(files) => Some(tls::client_config(files).await?),
            None => None,
        };
        let build = |streams: bool| {
            let mut b = reqwest::Client::builder()
                .connect_timeout(ATTEMPT)
                .tcp_keepalive(Duration::from_secs(5))
                .no_proxy()
                .pool_idle_timeout(Duration::from_secs(30));
            if streams {
                b = b.pool_max_idle_per_host(0);
            }
            if let Some(config) = &tls {
                b = b.tls_backend_preconfigured(config.clone());
            }
            b.build().map_err(|e| StoreError::BadSetting { what: format!("cannot set up the etcd client: {e}") })
        };
        Ok(Cluster {
            hosts: endpoints.to_vec(),
            named: urls.join(","),
            client: build(false)?,
            streams: build(true)?,
            urls,
            preferred: AtomicUsize::new(0),
            credentials,
            token: Mutex::new(None),
            outage: Mutex::new(Outage::default()),
            #[cfg(test)]
            watching: Default::default(),
        })
    }

    /// Each member's `host:port`, for [`crate::store::reach_any`].
    pub(super) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn token(&self) -> MutexGuard<'_, Option<String>> {
        self.token.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn outage(&self) -> MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `POST path` with `body` to the first member that answers, until `deadline`: the reply parsed as `T`.
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        path: &'static str,
        body: &Value,
        deadline: Instant,
    ) -> Result<T, StoreError> {
        let bytes = self.call_raw(path, body, deadline).await?;
        serde_json::from_slice(&bytes).map_err(|e| StoreError::NotEtcd {
            endpoint: self.named.clone(),
            answer: format!("an unreadable reply to {path}: {e}"),
        })
    }

    async fn call_raw(&self, path: &'static str, body: &Value, deadline: Instant) -> Result<Vec<u8>, StoreError> {
        let n = self.urls.len();
        let mut last = String::from("no attempt made");
        let mut reauthenticated = false;
        loop {
            let first = self.preferred.load(Ordering::Relaxed);
            for i in 0..n {
                let idx = (first + i) % n;
                match self.attempt(idx, path, body, deadline).await {
                    Ok(bytes) => {
                        self.preferred.store(idx, Ordering::Relaxed);
                        self.answered(idx);
                        return Ok(bytes);
                    }
                    Err(Failure::Transient(why)) => {
                        // The next request starts at the next member: one in flight to a dying leader
                        // must not be followed by another to it.
                        let _ = self.preferred.compare_exchange(idx, (idx + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
                        last = format!("{}: {why}", self.urls[idx]);
                    }
                    Err(Failure::Token) if !reauthenticated => {
                        reauthenticated = true;
                        *self.token() = None;
                        last = format!("{}: the auth token expired", self.urls[idx]);
                    }
                    Err(Failure::Token) => return Err(self.auth_failed("the new auth token was refused too")),
                    Err(Failure::Final(e)) => return Err(e),
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            self.failed_pass(&last);
            let now = Instant::now();
            if now >= deadline {
                return Err(self.unreachable(path, last));
            }
            tokio::time::sleep(BACKOFF.min(deadline - now)).await;
        }
    }

    async fn attempt(&self, idx: usize, path: &'static str, body: &Value, deadline: Instant) -> Result<Vec<u8>, Failure> {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let token = match (&self.credentials, path) {
            (Some(c), p) if p != AUTHENTICATE => Some(self.ensure_token(idx, c, deadline).await?),
            _ => None,
        };
        let mut request = self
            .client
            .post(format!("{}{path}", self.urls[idx]))
            .header("content-type", "application/json")
            .body(body.to_string())
            .timeout(ATTEMPT.min(left));
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let response = request.send().await.map_err(|e| self.send_failure(idx, &e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| Failure::Transient(chain(&e)))?.to_vec();
        if status.is_success() {
            return Ok(bytes);
        }
        let Ok(reply) = serde_json::from_slice::<ErrorReply>(&bytes) else {
            return Err(match status.as_u16() {
                502..=504 => Failure::Transient(format!("HTTP {status}")),
                _ => Failure::Final(self.not_etcd(idx, format!("HTTP {status} to {path}, not etcd's JSON gateway"))),
            });
        };
        Err(classify(status.as_u16(), reply, || self.urls[idx].clone()))
    }

    /// The token to send, authenticating first when there is none.
    async fn ensure_token(&self, idx: usize, c: &Credentials, deadline: Instant) -> Result<String, Failure> {
        if let Some(token) = self.token().clone() {
            return Ok(token);
        }
        let body = json!({ "name": c.user, "password": c.password });
        let bytes = Box::pin(self.attempt(idx, AUTHENTICATE, &body, deadline)).await.map_err(|f| match f {
            Failure::Final(StoreError::Etcd { message, .. }) => Failure::Final(self.auth_failed(&message)),
            other => other,
        })?;
        let reply: wire::AuthReply = serde_json::from_slice(&bytes)
            .map_err(|e| Failure::Final(self.not_etcd(idx, format!("an unreadable auth reply: {e}"))))?;
        if reply.token.is_empty() {
            return Err(Failure::Final(self.auth_failed("etcd has auth disabled but was given credentials")));
        }
        *self.token() = Some(reply.token.clone());
        Ok(reply.token)
    }

    fn auth_failed(&self, why: &str) -> StoreError {
        let user = self.credentials.as_ref().map(|c| c.user.clone()).unwrap_or_default();
        StoreError::EtcdAuth { endpoints: self.named.clone(), user, why: why.to_string() }
    }

    fn not_etcd(&self, idx: usize, answer: String) -> StoreError {
        StoreError::NotEtcd { endpoint: self.urls[idx].clone(), answer }
    }

    /// A request that got no reply: a TLS refusal is final (the certificates are wrong, not the member).
    fn send_failure(&self, idx: usize, e: &reqwest::Error) -> Failure {
        match tls::refusal(e) {
            Some(reason) => Failure::Final(StoreError::Tls { endpoint: self.urls[idx].clone(), reason }),
            None => Failure::Transient(chain(e)),
        }
    }

    fn failed_pass(&self, last: &str) {
        let mut outage = self.outage();
        let since = *outage.since.get_or_insert_with(Instant::now);
        if !outage.reported && since.elapsed() >= OUTAGE_AFTER {
            outage.reported = true;
            tracing::warn!("etcd does not answer at {} ({last}); {ETCD_CHECK}; retrying", self.named);
        }
    }

    /// No member answered `op` in time: the error says what to check unless the outage's warning did.
    pub(super) fn unreachable(&self, op: &'static str, last: String) -> StoreError {
        StoreError::Unreachable { endpoints: self.named.clone(), op, last, said: self.outage().reported }
    }

    fn answered(&self, idx: usize) {
        let mut outage = self.outage();
        if outage.reported {
            tracing::info!("etcd answers again at {}", self.urls[idx]);
        }
        *outage = Outage::default();
    }

    /// Opens a watch stream at the first member that accepts it, trying each once.
    pub(super) async fn open_stream(&self, body: &Value) -> Result<reqwest::Response, StoreError> {
        let n = self.urls.len();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut last = String::from("no member tried");
        for i in 0..n {
            let idx = (first + i) % n;
            let deadline = Instant::now() + ATTEMPT;
            let token = match &self.credentials {
                Some(c) => match self.ensure_token(idx, c, deadline).await {
                    Ok(t) => Some(t),
                    Err(Failure::Final(e)) => return Err(e),
                    Err(_) => continue,
                },
                None => None,
            };
            let mut request = self.streams.post(format!("{}/v3/watch", self.urls[idx])).body(body.to_string());
            if let Some(token) = token {
                request = request.header("authorization", token);
            }
            match tokio::time::timeout(ATTEMPT, request.send()).await {
                Ok(Ok(r)) if r.status().is_success() => return Ok(r),
                Ok(Ok(r)) => last = format!("{}: HTTP {}", self.urls[idx], r.status()),
                Ok(Err(e)) => match self.send_failure(idx, &e) {
                    Failure::Final(e) => return Err(e),
                    _ => last = format!("{}: {}", self.urls[idx], chain(&e)),
                },
                Err(_) => last = format!("{}: no answer within {ATTEMPT:?}", self.urls[idx]),
            }
        }
        Err(self.unreachable("/v3/watch", last))
    }
}

const AUTHENTICATE: &str = "/v3/auth/authenticate";

/// What an error reply means: members that are electing, lost quorum or are shutting down answer
/// 503/Unavailable, a deadline or Cancelled (try another); an expired token is authenticated again; the rest is the request's fault.
fn classify(status: u16, reply: ErrorReply, url: impl Fn() -> String) -> Failure {
    let message = if reply.message.is_empty() { reply.error } else { reply.message };
    match reply.code {
        wire::CODE_UNAVAILABLE | wire::CODE_DEADLINE | wire::CODE_CANCELLED => Failure::Transient(message),
        wire::CODE_UNAUTHENTICATED => Failure::Token,
        _ if matches!(status, 502..=504) => Failure::Transient(message),
        code => Failure::Final(StoreError::Etcd { endpoint: url(), code, message }),
    }
}

/// An error with its causes, as one line.
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_replies_are_classified() {
        let reply = |code: i64, message: &str| ErrorReply { code, message: message.into(), error: String::new() };
        let kind = |f: Failure| match f {
            Failure::Transient(_) => "retry",
            Failure::Token => "token",
            Failure::Final(_) => "final",
        };
        let table = [
            (503, reply(14, "etcdserver: no leader"), "retry"),
            (503, reply(0, "upstream"), "retry"),
            (500, reply(1, "grpc: the client connection is closing"), "retry"),
            (408, reply(4, "etcdserver: request timed out"), "retry"),
            (401, reply(16, "etcdserver: invalid auth token"), "token"),
            (404, reply(5, "etcdserver: requested lease not found"), "final"),
            (400, reply(3, "etcdserver: authentication failed, invalid user ID or password"), "final"),
        ];
        for (status, r, want) in table {
            let text = r.message.clone();
            assert_eq!(kind(classify(status, r, || "u".into())), want, "{status} {text}");
        }
    }
}
