//! One HTTP/2 connection per etcd member, as etcd's own clients keep: every request and every stream of this
//! handle is multiplexed on it. TCP (and TLS) is set up here rather than by tonic, so that a refused
//! handshake reaches the caller as the rustls error it is (`tls::refusal`), and so that the socket is watched
//! by TCP keepalive (a member whose host vanished is noticed in seconds, not after TCP's retransmissions).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use socket2::{SockRef, TcpKeepalive};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::store::StoreError;

/// One connection attempt: a handshake (TCP, then TLS) slower than this goes to the next member.
pub(super) const HANDSHAKE: Duration = Duration::from_secs(2);

/// A byte stream to a member, plain or TLS.
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A channel to `host` (`host:port`) that connects on first use and again after its connection breaks.
pub(super) fn channel(host: &str, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Channel, StoreError> {
    // The scheme only names the connection in tonic: TLS, when there is one, is this module's.
    let endpoint = Endpoint::from_shared(format!("http://{host}"))
        .map_err(|e| StoreError::BadSetting { what: format!("etcd endpoint {host}: {e}") })?
        .connect_timeout(HANDSHAKE);
    let host = host.to_string();
    let connector = tower::service_fn(move |_: Uri| {
        let (host, tls) = (host.clone(), tls.clone());
        async move { connect(&host, tls).await.map(TokioIo::new) }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

async fn connect(host: &str, tls: Option<Arc<rustls::ClientConfig>>) -> io::Result<Box<dyn Io>> {
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, format!("no TCP handshake with {host} within {HANDSHAKE:?}"));
    let tcp = tokio::time::timeout(HANDSHAKE, TcpStream::connect(host)).await.map_err(|_| timed_out())??;
    tcp.set_nodelay(true)?;
    let keepalive = TcpKeepalive::new().with_time(Duration::from_secs(5)).with_interval(Duration::from_secs(1)).with_retries(3);
    SockRef::from(&tcp).set_tcp_keepalive(&keepalive)?;
    let Some(config) = tls else { return Ok(Box::new(tcp)) };
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name).trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(name.to_string()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let handshake = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
    Ok(Box::new(tokio::time::timeout(HANDSHAKE, handshake).await.map_err(|_| timed_out())??))
}
