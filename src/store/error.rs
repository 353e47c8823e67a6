//! The store's error type: what failed, where, and what to do about it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

use super::tcp::frame::FrameError;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot listen on {addr}: {source}; free the port or pick another one")]
    Bind { addr: SocketAddr, source: io::Error },

    #[error("cannot resolve store address {host:?}: {source}; check the host name")]
    Resolve { host: String, source: io::Error },

    #[error(
        "could not reach the store at {addr} within {timeout:?} (last error: {last}); \
         check that the store is running and the address and port are right"
    )]
    Connect {
        addr: SocketAddr,
        timeout: Duration,
        last: String,
    },

    /// A connection that worked before cannot be made again: the host answers, but nothing listens on the
    /// store's port any more. Its process ended (a restarted one listens again).
    #[error(
        "the store at {addr} refuses connections: its host answers but nothing listens on the port any more \
         (the store's process ended)"
    )]
    Refused { addr: SocketAddr },

    #[error("the store at {addr} answered PING with {got:#x} instead of {expected:#x}; is it a TCPStore?")]
    Handshake {
        addr: SocketAddr,
        expected: u32,
        got: u32,
    },

    #[error(
        "no reply to {op} from the store at {addr} within {timeout:?}; the connection is \
         dropped, reconnect (and raise the timeout if the store is merely busy)"
    )]
    Timeout {
        addr: SocketAddr,
        op: &'static str,
        timeout: Duration,
    },

    #[error("{op} timed out after {timeout:?} at the store at {addr} (keys: {keys})")]
    WaitTimeout {
        addr: SocketAddr,
        op: &'static str,
        timeout: Duration,
        keys: String,
    },

    #[error(
        "the store at {addr} closed the connection during {op}; it refused the request \
         (torch servers close on unsupported operations, e.g. queues on the legacy server, \
         and on non-numeric values for add) or it shut down"
    )]
    Closed { addr: SocketAddr, op: &'static str },

    #[error("connection to the store at {addr} failed during {op}: {source}")]
    Io {
        addr: SocketAddr,
        op: &'static str,
        source: io::Error,
    },

    #[error("malformed reply to {op} from the store at {addr}: {source}; is it a TCPStore?")]
    Protocol {
        addr: SocketAddr,
        op: &'static str,
        source: FrameError,
    },

    #[error(
        "the connection to the store at {addr} is unusable after an earlier error or an abandoned \
         request; reconnect"
    )]
    Broken { addr: SocketAddr },

    #[error(
        "the rendezvous endpoint {addr} is held by a program that does not speak torch's TCPStore \
         protocol ({answer}); free the port or pick another with --rdzv-endpoint"
    )]
    NotAStore { addr: SocketAddr, answer: &'static str },

    #[error(
        "the store at {addr} refused this agent: wrong or missing job token; give every agent of the job \
         the same MUSTER_RDZV_TOKEN (or --rdzv-conf token_file=)"
    )]
    WrongToken { addr: SocketAddr },

    /// `said`: the outage was already warned of (`etcd does not answer: …`, with what to check), so the
    /// end of the wait does not say it again.
    #[error("{}", unreachable(endpoints, op, last, *said))]
    Unreachable { endpoints: String, op: &'static str, last: String, said: bool },

    #[error("etcd at {endpoint} refused the request (gRPC code {code}): {message}")]
    Etcd { endpoint: String, code: i64, message: String },

    #[error(
        "{endpoint} is not etcd's v3 gRPC API ({answer}); give the members' client URLs (port 2379 by \
         default, not the peer port 2380), and etcd 3.4 or later"
    )]
    NotEtcd { endpoint: String, answer: String },

    #[error(
        "etcd at {endpoints} refused user {user:?}: {why}; check MUSTER_ETCD_USER and MUSTER_ETCD_PASSWORD"
    )]
    EtcdAuth { endpoints: String, user: String, why: String },

    #[error("TLS to etcd at {endpoint} failed: {reason}")]
    Tls { endpoint: String, reason: String },

    #[error(
        "the Kubernetes API server refused {verb} on leases.coordination.k8s.io in namespace {namespace} \
         ({message}); bind the pods' service account to the Role in packaging/k8s/rbac.yaml there"
    )]
    KubeForbidden { verb: String, namespace: String, message: String },

    /// The API server did not answer or cannot serve now (a restart, overload): waited for as an outage.
    #[error(
        "the Kubernetes API server at {server} did not answer {op}: {last}; check that the control plane is up \
         and reachable from this node"
    )]
    ApiServerUnreachable { server: String, op: &'static str, last: String },

    #[error("the Kubernetes API server at {server} rejected {op}: {message}")]
    Kube { server: String, op: &'static str, message: String },

    #[error("{what}")]
    BadSetting { what: String },
}

/// What to check when no etcd member answers: said once, by the outage's warning or by the error.
pub const ETCD_CHECK: &str =
    "check that etcd is running and that --rdzv-endpoint names its client port (2379 by default)";

fn unreachable(endpoints: &str, op: &str, last: &str, said: bool) -> String {
    if said {
        format!("no etcd member at {endpoints} answered {op} before the deadline (the warning above says what each answered and what to check)")
    } else {
        format!("no etcd member answered {op} in time: {last}; {ETCD_CHECK}")
    }
}
