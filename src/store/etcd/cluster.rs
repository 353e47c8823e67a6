//! The etcd members and the requests to them: fail-over between members, each attempt bounded (a write sent
//! during a leader election hangs), the auth token, and what each failure means. An outage is said once
//! (after [`OUTAGE_AFTER`] of failures) and its end once.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::answer::{self, Answer, Answers};
use super::connect;
use super::pb::{self, path};
use super::tls::{self, TlsFiles};
use crate::store::error::ETCD_CHECK;
use crate::store::{Outage, StoreError, OUTAGE_AFTER};

/// One attempt at one member that has been answering quickly; a slower member is tried again later and
/// the next one now.
pub(super) const ATTEMPT: Duration = Duration::from_secs(2);
/// The longest one attempt at a member may wait (see [`Patience`]).
const PATIENCE_MAX: Duration = Duration::from_secs(16);
const BACKOFF: Duration = Duration::from_millis(200);
/// The largest reply read: a range of every member record of a 16K-node round is well below it.
const MAX_MESSAGE: usize = 64 << 20;

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
    Transient(Answer),
    /// The auth token expired: authenticate again, then retry.
    Token,
    Final(StoreError),
}

struct Member {
    url: String,
    host: String,
    /// Replaced when a request on it goes unanswered: its connection may be dead without a reset.
    channel: Mutex<Channel>,
    patience: Mutex<Patience>,
}

/// How long one attempt at a member waits before the next member is tried (or, with one, the same one
/// again on a fresh connection): [`ATTEMPT`] while it answers quickly, four times its last answer's time
/// after a slow one, twice as long after each attempt it left unanswered, at most [`PATIENCE_MAX`]. A member
/// that is slow because it is busy (thousands of nodes joining at once) is waited for rather than asked
/// again: each repeat was more work for it and each replaced connection a new handshake, and those made a
/// busy member slower still (4096 nodes on one etcd 3.4 member: 1,800 give-ups, a round of 18 s to 114 s).
/// A member that dies after answering quickly is still left after [`ATTEMPT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Patience(Duration);

impl Patience {
    fn answered(self, took: Duration) -> Patience {
        Patience((took * 4).clamp(ATTEMPT, PATIENCE_MAX))
    }

    fn unanswered(self) -> Patience {
        Patience((self.0 * 2).min(PATIENCE_MAX))
    }
}

/// Whether a request's bound goes to etcd as its gRPC deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Deadline {
    /// A unary call: its bound is its deadline, and a call past it is cancelled.
    Call,
    /// A unary call that is never cancelled: it carries no deadline, and one past its bound is left to
    /// finish on its own (its reply dropped) rather than reset, while the caller goes on. For what a
    /// cancellation would crash (`reads.rs`).
    Uncancelled,
    Stream,
}

/// A request message: what tonic's prost codec encodes.
pub(super) trait Message: prost::Message + Clone + Default + Send + Sync + 'static {}
impl<T: prost::Message + Clone + Default + Send + Sync + 'static> Message for T {}

pub(super) struct Cluster {
    members: Vec<Member>,
    /// The members as `host:port`.
    hosts: Vec<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Without a client certificate: whether a member asked for one (`tls::NoClientCert`).
    no_client_cert: Option<Arc<tls::NoClientCert>>,
    preferred: AtomicUsize,
    credentials: Option<Credentials>,
    token: Mutex<Option<String>>,
    outage: Outage,
    /// A member has answered since this cluster was made.
    ever_answered: AtomicBool,
    /// How the endpoints are named in messages.
    pub(super) named: String,
    /// Watches etcd confirmed created and still open (tests wait on it: `testing`).
    #[cfg(test)]
    pub(super) watching: Arc<AtomicUsize>,
}

/// Where a new client starts: at a member chosen at random, as etcd's own client does, so that the nodes
/// of a job, all named the same list, spread over the members instead of all loading the first.
fn first_member(n: usize) -> usize {
    (RandomState::new().hash_one(Instant::now()) % n.max(1) as u64) as usize
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Cluster {
    /// Reads the TLS files (a wrong path or a bad PEM is a bad setting) and sets up one channel per member.
    pub(super) async fn new(
        endpoints: &[String],
        tls_files: Option<&TlsFiles>,
        credentials: Option<Credentials>,
    ) -> Result<Cluster, StoreError> {
        let scheme = if tls_files.is_some() { "https" } else { "http" };
        let (tls, no_client_cert) = match tls_files {
            Some(files) => {
                let (config, asked) = tls::client_config(files).await?;
                (Some(Arc::new(config)), asked)
            }
            None => (None, None),
        };
        let members = endpoints
            .iter()
            .map(|host| {
                let channel = Mutex::new(connect::channel(host, tls.clone())?);
                let patience = Mutex::new(Patience(ATTEMPT));
                Ok(Member { url: format!("{scheme}://{host}"), host: host.clone(), channel, patience })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Cluster {
            named: members.iter().map(|m| m.url.as_str()).collect::<Vec<_>>().join(","),
            hosts: endpoints.to_vec(),
            members,
            tls,
            no_client_cert,
            preferred: AtomicUsize::new(first_member(endpoints.len())),
            credentials,
            token: Mutex::new(None),
            outage: Outage::default(),
            ever_answered: AtomicBool::new(false),
            #[cfg(test)]
            watching: Default::default(),
        })
    }

    /// Each member's `host:port`, for [`crate::store::reach_any`].
    pub(super) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    fn grpc(&self, idx: usize) -> tonic::client::Grpc<Channel> {
        let channel = lock(&self.members[idx].channel).clone();
        tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE)
    }

    /// A fresh connection to member `idx` for the next request: the current one left a request unanswered.
    fn replace(&self, idx: usize) {
        let member = &self.members[idx];
        match connect::channel(&member.host, self.tls.clone()) {
            Ok(channel) => *lock(&member.channel) = channel,
            Err(e) => tracing::debug!("etcd: cannot set up a new connection to {}: {e}", member.url),
        }
    }

    /// A unary call of `path` to the first member that answers, until `deadline`.
    pub(super) async fn call<Q: Message, R: Message>(&self, path: &'static str, req: &Q, deadline: Instant) -> Result<R, StoreError> {
        self.call_as(path, req, deadline, Deadline::Call).await
    }

    /// [`Self::call`], each attempt made as `kind` says.
    pub(super) async fn call_as<Q: Message, R: Message>(&self, path: &'static str, req: &Q, deadline: Instant, kind: Deadline) -> Result<R, StoreError> {
        let n = self.members.len();
        let mut answers = Answers::new(n);
        let mut reauthenticated = false;
        loop {
            let first = self.preferred.load(Ordering::Relaxed);
            for i in 0..n {
                let idx = (first + i) % n;
                match self.attempt(idx, path, req, deadline, kind).await {
                    Ok(reply) => {
                        self.preferred.store(idx, Ordering::Relaxed);
                        self.answered(idx);
                        return Ok(reply);
                    }
                    Err(Failure::Transient(answer)) => {
                        // The next request starts at the next member: one in flight to a dying leader
                        // must not be followed by another to it.
                        let _ = self.preferred.compare_exchange(idx, (idx + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
                        answers.set(idx, answer);
                    }
                    Err(Failure::Token) if !reauthenticated => {
                        reauthenticated = true;
                        *lock(&self.token) = None;
                        answers.set(idx, Answer::Said("its auth token had expired".into()));
                    }
                    Err(Failure::Token) => return Err(self.auth_failed("the new auth token was refused too")),
                    Err(Failure::Final(e)) => return Err(e),
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
            let give_up = self.failed_pass(&answers);
            let now = Instant::now();
            if give_up || now >= deadline {
                return Err(self.unreachable(path, &answers));
            }
            tokio::time::sleep(BACKOFF.min(deadline - now)).await;
        }
    }

    /// How long the next attempt at member `idx` may take, within `deadline`.
    fn bound(&self, idx: usize, deadline: Instant) -> Duration {
        lock(&self.members[idx].patience).0.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(1))
    }

    /// What an attempt at member `idx` sent at `sent` found: an answer, or none in its bound.
    fn waited(&self, idx: usize, sent: Instant, answered: bool) {
        let mut patience = lock(&self.members[idx].patience);
        *patience = if answered { patience.answered(sent.elapsed()) } else { patience.unanswered() };
    }

    async fn attempt<Q: Message, R: Message>(&self, idx: usize, path: &'static str, req: &Q, deadline: Instant, kind: Deadline) -> Result<R, Failure> {
        let bound = self.bound(idx, deadline);
        let sent = Instant::now();
        let request = self.request(idx, path, req.clone(), bound, kind).await?;
        let mut grpc = self.grpc(idx);
        let call = async move {
            grpc.ready().await.map_err(|e| Status::unavailable(chain(&e)))?;
            grpc.unary(request, http::uri::PathAndQuery::from_static(path), tonic_prost::ProstCodec::default()).await
        };
        let answered = match kind {
            // Spawned: dropping the wait for it (its bound, or the caller's) leaves the request running.
            Deadline::Uncancelled => {
                let task = tokio::spawn(call);
                tokio::time::timeout(bound, task).await.map(|done| done.unwrap_or_else(|e| Err(Status::unknown(e.to_string()))))
            }
            Deadline::Call | Deadline::Stream => tokio::time::timeout(bound, call).await,
        };
        self.waited(idx, sent, answered.is_ok());
        match answered {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(self.classify(idx, &status)),
            Err(_) => {
                self.replace(idx);
                Err(Failure::Transient(Answer::Silent(bound)))
            }
        }
    }

    /// `message` with the auth token (authenticating first when there is none, within `bound`) and, for a
    /// unary call (`Deadline::Call`), `bound` as its deadline. A stream carries none: gRPC's deadline bounds a
    /// stream's whole life, and etcd would end a watch or the lease's keepalive when it passed.
    async fn request<T>(&self, idx: usize, path: &'static str, message: T, bound: Duration, kind: Deadline) -> Result<tonic::Request<T>, Failure> {
        let mut request = tonic::Request::new(message);
        if kind == Deadline::Call {
            request.set_timeout(bound);
        }
        if let (Some(c), false) = (&self.credentials, path == path::AUTHENTICATE) {
            let token = self.ensure_token(idx, c, Instant::now() + bound).await?;
            let value = token.parse().map_err(|_| Failure::Final(self.auth_failed("etcd gave an auth token that is not ASCII")))?;
            request.metadata_mut().insert("token", value);
        }
        Ok(request)
    }

    /// The token to send, authenticating first when there is none.
    async fn ensure_token(&self, idx: usize, c: &Credentials, deadline: Instant) -> Result<String, Failure> {
        if let Some(token) = lock(&self.token).clone() {
            return Ok(token);
        }
        let body = pb::AuthenticateRequest { name: c.user.clone(), password: c.password.clone() };
        let reply: pb::AuthenticateResponse = Box::pin(self.attempt(idx, path::AUTHENTICATE, &body, deadline, Deadline::Call)).await.map_err(|f| match f {
            Failure::Final(StoreError::Etcd { message, .. }) => Failure::Final(self.auth_failed(&message)),
            other => other,
        })?;
        if reply.token.is_empty() {
            return Err(Failure::Final(self.auth_failed("etcd has auth disabled but was given credentials")));
        }
        *lock(&self.token) = Some(reply.token.clone());
        Ok(reply.token)
    }

    fn auth_failed(&self, why: &str) -> StoreError {
        let user = self.credentials.as_ref().map(|c| c.user.clone()).unwrap_or_default();
        StoreError::EtcdAuth { endpoints: self.named.clone(), user, why: why.to_string() }
    }

    /// What a failed call means: a TLS refusal is final (the certificates are wrong, not the member).
    fn classify(&self, idx: usize, status: &Status) -> Failure {
        let url = &self.members[idx].url;
        if let Some(reason) = tls::refusal(status) {
            return Failure::Final(StoreError::Tls { endpoint: url.clone(), reason });
        }
        if self.no_client_cert.as_ref().is_some_and(|n| n.required()) {
            return Failure::Final(StoreError::Tls { endpoint: url.clone(), reason: tls::CERT_REQUIRED.to_string() });
        }
        if not_http2(status) {
            let answer = format!("it does not speak HTTP/2 ({})", answer::of_status(status));
            return Failure::Final(StoreError::NotEtcd { endpoint: url.clone(), answer });
        }
        classify(status.code(), status.message(), || url.clone(), || answer::of_status(status))
    }

    /// A pass over every member failed: the outage is said once it lasts [`OUTAGE_AFTER`]. True when the
    /// call gives up now: no member has answered since this cluster was made (the agent is starting) and
    /// every one has refused the connection for [`OUTAGE_AFTER`]: nothing listens at the endpoints (a
    /// wrong port, etcd not started), said in one line by the error, not waited for until `join_timeout`.
    fn failed_pass(&self, answers: &Answers) -> bool {
        let never_answered = !self.ever_answered.load(Ordering::Relaxed);
        if never_answered && answers.all_refused() && !self.outage.said() && self.outage.lasted() >= OUTAGE_AFTER {
            return true;
        }
        if self.outage.failed() {
            tracing::warn!("etcd does not answer: {}; {ETCD_CHECK}; retrying", answers.line(&self.urls()));
        }
        false
    }

    fn urls(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.url.as_str()).collect()
    }

    /// No member answered `op` in time: the error says what each answered and what to check, unless the
    /// outage's warning did.
    pub(super) fn unreachable(&self, op: &'static str, answers: &Answers) -> StoreError {
        StoreError::Unreachable { endpoints: self.named.clone(), op, last: answers.line(&self.urls()), said: self.outage.said() }
    }

    /// [`Self::unreachable`] for a wait that ended without a member's answer (`why`).
    pub(super) fn gave_up(&self, op: &'static str, why: String) -> StoreError {
        let last = format!("{}: {why}", self.named);
        StoreError::Unreachable { endpoints: self.named.clone(), op, last, said: self.outage.said() }
    }

    fn answered(&self, idx: usize) {
        self.ever_answered.store(true, Ordering::Relaxed);
        if let Some(n) = &self.no_client_cert {
            n.served();
        }
        if self.outage.answered() {
            tracing::info!("etcd answers again at {}", self.members[idx].url);
        }
    }

    /// Opens a bidirectional stream of `path` at the first member that accepts it, trying each once, with
    /// `first` already queued (etcd answers a stream's headers with its first reply). Returns the sender of
    /// the stream's later requests and its replies.
    pub(super) async fn open_stream<Q: Message, R: Message>(
        &self,
        path: &'static str,
        first: Vec<Q>,
    ) -> Result<(mpsc::UnboundedSender<Q>, Streaming<R>), StoreError> {
        let n = self.members.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut answers = Answers::new(n);
        for i in 0..n {
            let idx = (start + i) % n;
            let (tx, rx) = mpsc::unbounded_channel();
            for q in &first {
                let _ = tx.send(q.clone());
            }
            let bound = lock(&self.members[idx].patience).0;
            let request = match self.request(idx, path, UnboundedReceiverStream::new(rx), bound, Deadline::Stream).await {
                Ok(r) => r,
                Err(Failure::Final(e)) => return Err(e),
                Err(_) => continue,
            };
            let mut grpc = self.grpc(idx);
            let open = async {
                grpc.ready().await.map_err(|e| Status::unavailable(chain(&e)))?;
                grpc.streaming(request, http::uri::PathAndQuery::from_static(path), tonic_prost::ProstCodec::default()).await
            };
            let sent = Instant::now();
            let opened = tokio::time::timeout(bound, open).await;
            self.waited(idx, sent, opened.is_ok());
            match opened {
                Ok(Ok(reply)) => return Ok((tx, reply.into_inner())),
                Ok(Err(status)) => match self.classify(idx, &status) {
                    Failure::Final(e) => return Err(e),
                    Failure::Token => *lock(&self.token) = None,
                    Failure::Transient(answer) => answers.set(idx, answer),
                },
                Err(_) => {
                    self.replace(idx);
                    answers.set(idx, Answer::Silent(bound));
                }
            }
        }
        Err(self.unreachable(path, &answers))
    }
}

/// What a gRPC status means: members that are electing, lost quorum, are shutting down or cannot be reached
/// answer Unavailable, a deadline or Cancelled (try another); an expired token is authenticated again; the
/// rest is the request's fault.
fn classify(code: Code, message: &str, url: impl Fn() -> String, detail: impl Fn() -> Answer) -> Failure {
    match code {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => Failure::Transient(detail()),
        Code::Unauthenticated => Failure::Token,
        Code::Unimplemented => Failure::Final(StoreError::NotEtcd { endpoint: url(), answer: format!("no etcd v3 gRPC service ({message})") }),
        code => Failure::Final(StoreError::Etcd { endpoint: url(), code: code as i64, message: message.to_string() }),
    }
}

/// Whether the endpoint answered bytes that are not HTTP/2 (an HTTP/1.1 server, a TCPStore): our own h2
/// library gave the connection up over a malformed frame. A member that is down or shutting down never does.
fn not_http2(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.is_go_away()
                && h2.is_library()
                && matches!(h2.reason(), Some(h2::Reason::FRAME_SIZE_ERROR | h2::Reason::PROTOCOL_ERROR));
        }
        next = err.source();
    }
    false
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
    fn a_busy_member_is_waited_for_longer_and_a_quick_one_is_not() {
        let (ms, s) = (Duration::from_millis, Duration::from_secs);
        let fresh = Patience(ATTEMPT);
        // (the attempt before, what it found) -> how long the next may take
        let table = [
            (fresh.answered(ms(3)), s(2)),
            (fresh.answered(ms(1500)), s(6)),
            (fresh.answered(s(30)), s(16)),
            (fresh.unanswered(), s(4)),
            (fresh.unanswered().unanswered().unanswered().unanswered(), s(16)),
            (Patience(s(16)).answered(ms(10)), s(2)),
        ];
        for (i, (patience, want)) in table.into_iter().enumerate() {
            assert_eq!(patience, Patience(want), "row {i}");
        }
    }

    #[test]
    fn statuses_are_classified() {
        let kind = |f: Failure| match f {
            Failure::Transient(_) => "retry",
            Failure::Token => "token",
            Failure::Final(_) => "final",
        };
        let table = [
            (Code::Unavailable, "etcdserver: no leader", "retry"),
            (Code::Unavailable, "error trying to connect: Connection refused", "retry"),
            (Code::Cancelled, "grpc: the client connection is closing", "retry"),
            (Code::DeadlineExceeded, "etcdserver: request timed out", "retry"),
            (Code::Unauthenticated, "etcdserver: invalid auth token", "token"),
            (Code::NotFound, "etcdserver: requested lease not found", "final"),
            (Code::InvalidArgument, "etcdserver: authentication failed, invalid user ID or password", "final"),
            (Code::Unimplemented, "unknown service", "final"),
        ];
        for (code, message, want) in table {
            assert_eq!(kind(classify(code, message, || "u".into(), || Answer::Said(message.into()))), want, "{code:?} {message}");
        }
    }
}
