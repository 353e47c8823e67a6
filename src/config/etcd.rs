//! `--rdzv-backend etcd` (also `etcd-v2`, `etcd-v3`): the members, TLS and the key namespace, checked once.
//!
//! `--rdzv-endpoint host:port[,host:port…]` (a `http://` or `https://` in front is allowed; port 2379
//! when left out). `--rdzv-conf` keys, with torchrun's meanings: `protocol` (http|https), `cacert`,
//! `cert`, `key` (etcd-v2's `ca_cert`, `ssl_cert`, `ssl_cert_key` too), `etcd_prefix` (where the keys
//! live; default `/`). A user and password come from `MUSTER_ETCD_USER` and `MUSTER_ETCD_PASSWORD`,
//! never the command line (which every user of the machine can read).

use std::path::PathBuf;

use super::{bad, parse_endpoint, ConfigError, EtcdProtocol, RdzvConf};
use crate::store::etcd::{Credentials, EtcdOptions, TlsFiles};

pub const USER_ENV: &str = "MUSTER_ETCD_USER";
pub const PASSWORD_ENV: &str = "MUSTER_ETCD_PASSWORD";

/// Where an etcd rendezvous goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTarget {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    pub tls: Option<TlsFiles>,
    /// Put before every key; ends with `/`.
    pub namespace: String,
}

pub fn target(endpoint: &str, conf: &RdzvConf) -> Result<EtcdTarget, ConfigError> {
    let flag = |what: String| bad(format!("invalid value '{endpoint}' for '--rdzv-endpoint': {what}"));
    let mut https = conf.etcd.protocol == EtcdProtocol::Https;
    let mut endpoints = Vec::new();
    for item in endpoint.split(',').map(str::trim) {
        let (scheme, rest) = match item.split_once("://") {
            Some((s, rest)) => (Some(s.to_ascii_lowercase()), rest),
            None => (None, item),
        };
        match scheme.as_deref() {
            None | Some("http") if !https || scheme.is_none() => {}
            Some("https") => https = true,
            Some("http") => return Err(flag(format!("'{item}' says http but protocol=https"))),
            Some(other) => return Err(flag(format!("'{other}://' is not http:// or https://"))),
            None => {}
        }
        let (host, port) = parse_endpoint(rest)?;
        if host.is_empty() {
            return Err(flag("use host:port[,host:port...] naming the etcd members' client URLs".into()));
        }
        let host = if host.contains(':') { format!("[{host}]") } else { host };
        endpoints.push(format!("{host}:{}", port.unwrap_or(2379)));
    }
    let e = &conf.etcd;
    let cacert = e.cacert.clone().or_else(|| e.ca_cert.clone());
    let cert = e.cert.clone().or_else(|| e.ssl_cert.clone());
    let key = e.key.clone().or_else(|| e.ssl_cert_key.clone());
    let tls = if https { Some(tls_files(cacert, cert, key)?) } else { plain(cacert, cert, key)? };
    let prefix = e.etcd_prefix.clone().unwrap_or_default();
    let namespace = format!("{}/", prefix.trim_end_matches('/'));
    if !namespace.starts_with('/') {
        return Err(bad(format!("invalid value '{prefix}' for '--rdzv-conf etcd_prefix': use a path such as /jobs")));
    }
    Ok(EtcdTarget { endpoints, tls, namespace })
}

/// The etcd handle's settings from the rendezvous keys (the agent's and `muster status`'s): a node killed is
/// gone after its heartbeats would have missed (`keep_alive_interval` × `keep_alive_max_attempt`), every
/// request bounded by `read_timeout`.
pub fn options(target: &EtcdTarget, credentials: Option<Credentials>, rdzv: &RdzvConf) -> EtcdOptions {
    EtcdOptions {
        endpoints: target.endpoints.clone(),
        tls: target.tls.clone(),
        credentials,
        namespace: target.namespace.clone(),
        lease_ttl: super::session_ttl(rdzv.keep_alive_interval, rdzv.keep_alive_max_attempt),
        request_timeout: rdzv.read_timeout,
    }
}

fn tls_files(cacert: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<TlsFiles, ConfigError> {
    let Some(ca) = cacert else {
        return Err(bad(
            "'--rdzv-conf protocol=https' needs cacert=PATH: the CA certificate that signed the etcd members' \
             certificates (PEM)"
                .to_string(),
        ));
    };
    let client = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => return Err(bad("'--rdzv-conf cert=' needs key= too (the client certificate's private key)".to_string())),
        (None, Some(_)) => return Err(bad("'--rdzv-conf key=' needs cert= too (the client certificate)".to_string())),
    };
    for path in std::iter::once(&ca).chain(client.iter().flat_map(|(c, k)| [c, k])) {
        if !path.is_file() {
            return Err(bad(format!("'--rdzv-conf': {} is not a readable file", path.display())));
        }
    }
    Ok(TlsFiles { ca, client })
}

fn plain(cacert: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>) -> Result<Option<TlsFiles>, ConfigError> {
    match cacert.or(cert).or(key) {
        Some(p) => Err(bad(format!(
            "'--rdzv-conf' names {} but the etcd endpoints are http: add protocol=https",
            p.display()
        ))),
        None => Ok(None),
    }
}

/// The user and password for etcd's auth, from the environment.
pub fn credentials(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Credentials>, ConfigError> {
    match (env(USER_ENV), env(PASSWORD_ENV)) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) if !user.is_empty() => Ok(Some(Credentials { user, password })),
        (Some(_), Some(_)) => Err(bad(format!("{USER_ENV} is empty; set it to the etcd user name"))),
        (Some(_), None) => Err(bad(format!("{USER_ENV} is set but {PASSWORD_ENV} is not; set both or neither"))),
        (None, Some(_)) => Err(bad(format!("{PASSWORD_ENV} is set but {USER_ENV} is not; set both or neither"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(s: &str) -> RdzvConf {
        RdzvConf::parse(s).expect("conf")
    }

    #[test]
    fn endpoints_and_namespaces() {
        let t = target("10.0.0.1:2379, h2,http://h3:23790,[::1]:1", &conf("")).unwrap();
        assert_eq!(t.endpoints, ["10.0.0.1:2379", "h2:2379", "h3:23790", "[::1]:1"]);
        assert_eq!((t.tls, t.namespace.as_str()), (None, "/"));
        assert_eq!(target("h:1", &conf("etcd_prefix=/jobs/")).unwrap().namespace, "/jobs/");
        let bad_cases = [("", ""), ("h:1", "etcd_prefix=jobs"), ("ftp://h:1", ""), ("h:x", ""), ("http://h:1", "protocol=https")];
        for (endpoint, c) in bad_cases {
            assert!(target(endpoint, &conf(c)).is_err(), "{endpoint} {c}");
        }
    }

    #[test]
    fn https_needs_a_ca_and_whole_client_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let f = |n: &str| {
            let p = dir.path().join(n);
            std::fs::write(&p, "x").unwrap();
            p.display().to_string()
        };
        let (ca, cert, key) = (f("ca.pem"), f("c.pem"), f("k.pem"));
        assert!(target("h:1", &conf("protocol=https")).is_err());
        assert!(target("https://h:1", &conf("")).is_err(), "https:// is https too");
        let t = target("https://h:1", &conf(&format!("cacert={ca}"))).unwrap();
        assert_eq!(t.tls.unwrap().client, None);
        let t = target("h:1", &conf(&format!("protocol=https,ca_cert={ca},ssl_cert={cert},ssl_cert_key={key}"))).unwrap();
        assert!(t.tls.unwrap().client.is_some(), "etcd-v2's key names");
        assert!(target("h:1", &conf(&format!("protocol=https,cacert={ca},cert={cert}"))).is_err());
        assert!(target("h:1", &conf(&format!("cacert={ca}"))).is_err(), "TLS files with http");
        assert!(target("h:1", &conf("protocol=https,cacert=/nonexistent")).is_err());
    }

    #[test]
    fn credentials_come_in_pairs() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(credentials(&env(&[])).unwrap(), None);
        let both = credentials(&env(&[(USER_ENV, "u"), (PASSWORD_ENV, "p")])).unwrap().unwrap();
        assert_eq!((both.user.as_str(), both.password.as_str()), ("u", "p"));
        assert!(credentials(&env(&[(USER_ENV, "u")])).is_err());
        assert!(credentials(&env(&[(PASSWORD_ENV, "p")])).is_err());
        assert!(credentials(&env(&[(USER_ENV, ""), (PASSWORD_ENV, "p")])).is_err());
    }
}
