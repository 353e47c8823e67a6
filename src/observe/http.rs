//! The metrics endpoint: a small HTTP/1 server (hyper) on the agent's runtime serving `GET /metrics`
//! (OpenMetrics text, which Prometheus scrapes), `GET /healthz` (200 `ok <state>` or 503
//! `unhealthy <state>`) and `GET /stacks` (every local worker's Python stacks, read under a bound). The port is bound before anything starts (`bind`), so a port in use is bad input;
//! the server runs on the runtime's worker threads, never the main thread that spawns workers.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use super::health::Health;
use super::metrics::Metrics;

/// Connections served at once; more wait to be accepted (a scraper needs one).
const MAX_CONNECTIONS: usize = 16;
/// A client that sends no request head in this time is dropped.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for --metrics-port: {source}; pick a free port (0 lets the kernel choose)")]
pub struct BindError {
    addr: SocketAddr,
    source: std::io::Error,
}

/// Binds the metrics port (blocking, before the runtime exists).
pub fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    let listener = TcpListener::bind(addr).map_err(|source| BindError { addr, source })?;
    listener.set_nonblocking(true).map_err(|source| BindError { addr, source })?;
    Ok(listener)
}

/// What the server reads.
#[derive(Clone)]
pub struct Shared {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub stacks: Arc<crate::hang::Registry>,
}

/// Serves the endpoint on `listener` until the runtime ends. Must be called within the runtime.
pub fn spawn(listener: TcpListener, shared: Shared) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    tokio::spawn(accept_loop(listener, shared));
    Ok(addr)
}

async fn accept_loop(listener: tokio::net::TcpListener, shared: Shared) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: wait a moment rather than spin.
                tracing::debug!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    if req.uri().path() == "/stacks" && req.method() == Method::GET {
                        // Reads every worker's memory (bounded, on threads of its own): the only route that waits.
                        let json = req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "format=json"));
                        let body = shared.stacks.render(json).await;
                        let kind = if json { "application/json" } else { "text/plain; charset=utf-8" };
                        return Ok::<_, Infallible>(with_type(StatusCode::OK, kind, body));
                    }
                    Ok::<_, Infallible>(respond(&req, &shared))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("metrics endpoint: connection ended: {e}");
            }
            drop(slot);
        });
    }
}

fn respond<B>(req: &Request<B>, shared: &Shared) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => match shared.metrics.render() {
            Ok(text) => with_type(StatusCode::OK, OPENMETRICS, text),
            Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot render the metrics\n".into()),
        },
        "/healthz" => match shared.health.get() {
            (true, state) => plain(StatusCode::OK, format!("ok {state}\n")),
            (false, state) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy {state}\n")),
        },
        _ => plain(StatusCode::NOT_FOUND, "muster serves /metrics, /healthz and /stacks\n".into()),
    }
}

fn plain(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, "text/plain; charset=utf-8", body)
}

fn with_type(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await.unwrap().unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_health() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let shared = Shared { metrics: Arc::new(Metrics::new("r", "h", 1)), health: Arc::new(Health::default()), stacks: Arc::default() };
        let addr = spawn(listener, shared.clone()).unwrap();
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200") && metrics.contains("muster_restarts_remaining"), "{metrics}");
        assert!(metrics.contains("application/openmetrics-text") && metrics.trim_end().ends_with("# EOF"), "{metrics}");
        shared.health.set(true, "running");
        assert!(get(addr, "/healthz").await.contains("200 OK"));
        shared.health.set(false, "draining");
        let unhealthy = get(addr, "/healthz").await;
        assert!(unhealthy.starts_with("HTTP/1.1 503") && unhealthy.contains("unhealthy draining"), "{unhealthy}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_port_in_use_is_named() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let e = bind(addr).unwrap_err().to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("--metrics-port"), "{e}");
    }
}
