//! TLS to etcd: the CA that signed the members' certificates and, for `--client-cert-auth`, this agent's
//! certificate and key, all PEM files named in `--rdzv-conf`; and what a refused handshake means, said
//! naming the certificate at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{AlertDescription, CertificateError, SignatureScheme};

use crate::store::StoreError;

/// The PEM files of `--rdzv-conf cacert=,cert=,key=` (or etcd-v2's `ca_cert`, `ssl_cert`, `ssl_cert_key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    /// The client certificate and its key: both or neither.
    pub client: Option<(PathBuf, PathBuf)>,
}

fn bad(what: String) -> StoreError {
    StoreError::BadSetting { what }
}

async fn read(path: &Path, key: &str) -> Result<Vec<u8>, StoreError> {
    tokio::fs::read(path).await.map_err(|e| bad(format!("cannot read --rdzv-conf {key}={}: {e}", path.display())))
}

/// Without a client certificate, notes whether a member asked for one: TLS 1.3 sends its refusal after the
/// handshake, so a request sees only a closed connection, and this flag is what names the missing setting.
/// A member that asks but does not insist (etcd with a trusted CA and no `--client-cert-auth`) serves a
/// request anyway, and from then on a closed connection is an outage, not a refusal.
#[derive(Debug, Default)]
pub(super) struct NoClientCert {
    asked: AtomicBool,
    served: AtomicBool,
}

impl NoClientCert {
    /// A member asked for a client certificate, which this agent has none of, and none served it without.
    pub(super) fn required(&self) -> bool {
        self.asked.load(Ordering::Relaxed) && !self.served.load(Ordering::Relaxed)
    }

    /// A member answered a request.
    pub(super) fn served(&self) {
        self.served.store(true, Ordering::Relaxed);
    }
}

impl ResolvesClientCert for NoClientCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

/// What a member that asked for a client certificate needs.
pub(super) const CERT_REQUIRED: &str = "it requires a client certificate signed by its CA: give --rdzv-conf cert=PATH,key=PATH";

/// The client configuration, and without `cert=` the flag that tells whether a member asked for one.
pub(super) async fn client_config(files: &TlsFiles) -> Result<(rustls::ClientConfig, Option<Arc<NoClientCert>>), StoreError> {
    let ca = read(&files.ca, "cacert").await?;
    let mut roots = rustls::RootCertStore::empty();
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| bad(format!("--rdzv-conf cacert={} is not a PEM certificate: {e}", files.ca.display())))?;
        roots.add(cert).map_err(|e| bad(format!("--rdzv-conf cacert={}: {e}", files.ca.display())))?;
        found += 1;
    }
    if found == 0 {
        return Err(bad(format!("--rdzv-conf cacert={} holds no PEM certificate", files.ca.display())));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots);
    let Some((cert, key)) = &files.client else {
        let asked = Arc::new(NoClientCert::default());
        return Ok((with_h2(builder.with_client_cert_resolver(asked.clone())), Some(asked)));
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert, "cert").await?)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("--rdzv-conf cert={} is not a PEM certificate: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(bad(format!("--rdzv-conf cert={} holds no PEM certificate", cert.display())));
    }
    let private = PrivateKeyDer::from_pem_slice(&read(key, "key").await?)
        .map_err(|e| bad(format!("--rdzv-conf key={} is not a PEM private key: {e}", key.display())))?;
    builder
        .with_client_auth_cert(chain, private)
        .map(|config| (with_h2(config), None))
        .map_err(|e| bad(format!("--rdzv-conf cert={} and key={} do not go together: {e}", cert.display(), key.display())))
}

/// gRPC is HTTP/2, which TLS negotiates by ALPN.
fn with_h2(mut config: rustls::ClientConfig) -> rustls::ClientConfig {
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// Why a TLS handshake was refused, naming the setting to fix; None when the failure was not TLS.
pub(super) fn refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let err = rustls_error(e)?;
    Some(match err {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
            "its certificate is not signed by the CA in --rdzv-conf cacert=".to_string()
        }
        rustls::Error::InvalidCertificate(c) => format!("its certificate is not valid for this address: {c:?}"),
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired | AlertDescription::BadCertificate | AlertDescription::HandshakeFailure,
        ) => CERT_REQUIRED.to_string(),
        rustls::Error::AlertReceived(AlertDescription::UnknownCA) => {
            "it does not trust the client certificate in --rdzv-conf cert= (not signed by its CA)".to_string()
        }
        other => format!("the TLS handshake failed: {other}"),
    })
}

/// The rustls error under a call's error, if there is one (the connector wraps it in an `io::Error`).
fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(r) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return Some(r);
        }
        next = err.source();
    }
    None
}
