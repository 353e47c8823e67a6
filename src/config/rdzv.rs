//! How this node meets its peers: the rendezvous mode, its endpoint, and `--rdzv-conf` as typed settings.
//!
//! `--rdzv-conf` is parsed once, here, into `RdzvConf`; nothing looks a key up by name at run time.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{bad, ConfigError};
use crate::cli::Cli;

/// The rendezvous keys torchrun 2.15 knows, plus muster's `exit_barrier_timeout`, `bind`,
/// `membership_grace` and `namespace` (the k8s backend's).
pub const RDZV_CONF_KEYS: &[&str] = &[
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "cas_backoff_max_seconds",
    "read_timeout",
    "is_host",
    "store_type",
    "timeout",
    "protocol",
    "ssl_cert",
    "ssl_cert_key",
    "ca_cert",
    "etcd_prefix",
    "cacert",
    "cert",
    "key",
    "exit_barrier_timeout",
    "token_file",
    "bind",
    "membership_grace",
    "namespace",
];

/// `--rdzv-conf`, every key typed, with torchrun's defaults for the keys the user left out.
#[derive(Debug, Clone, PartialEq)]
pub struct RdzvConf {
    /// Deadline for a whole rendezvous round.
    pub join_timeout: Duration,
    /// Deadline for one store request.
    pub read_timeout: Duration,
    /// Extra wait for more nodes once `--nnodes` MIN have joined.
    pub last_call_timeout: Duration,
    /// muster's own: how long a finished node waits for the others (torch hard-codes 300 s).
    pub exit_barrier_timeout: Duration,
    /// Deadline for marking the rendezvous closed.
    pub close_timeout: Duration,
    /// Heartbeat period.
    pub keep_alive_interval: Duration,
    /// Deadline for one heartbeat write.
    pub heartbeat_timeout: Duration,
    /// Missed heartbeats after which a node counts as dead.
    pub keep_alive_max_attempt: u32,
    /// muster's own: the grace between SIGTERM and SIGKILL of a stop for a membership change (a peer is
    /// gone, so no collective can complete) instead of `--shutdown-timeout`.
    pub membership_grace: Duration,
    /// Force (true) or forbid (false) hosting the c10d store; None: decided by the endpoint's address.
    pub is_host: Option<bool>,
    /// Upper bound of the random back-off after a failed compare-and-set (torch 2.15; 0 = none).
    pub cas_backoff_max: Duration,
    pub store_type: StoreType,
    /// torch's store/rendezvous `timeout` (static TCPStore, legacy etcd); torchrun's default is 900 s.
    pub timeout: Duration,
    pub etcd: EtcdConf,
    /// muster's own: a file holding the job token (else `MUSTER_RDZV_TOKEN`); see `config::token`.
    pub token_file: Option<PathBuf>,
    /// muster's own: the one address every store this agent hosts listens on; None: where the endpoint
    /// (or, for the workers' store, MASTER_ADDR) says (`agent::stores`).
    pub bind: Option<IpAddr>,
    /// The k8s backend's namespace; None: the pod's, or the kubeconfig context's.
    pub namespace: Option<String>,
}

/// How long a killed node's session lasts on etcd or the API server: the heartbeats it may miss
/// (`keep_alive_interval` × `keep_alive_max_attempt`), at least 2 s.
pub fn session_ttl(keep_alive_interval: Duration, keep_alive_max_attempt: u32) -> Duration {
    (keep_alive_interval * keep_alive_max_attempt).max(Duration::from_secs(2))
}

/// `store_type`: the c10d rendezvous store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreType {
    #[default]
    Tcp,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EtcdProtocol {
    #[default]
    Http,
    Https,
}

/// The etcd keys: `protocol` for both backends; `ssl_cert`, `ssl_cert_key`, `ca_cert` are etcd-v2's names,
/// `cert`, `key`, `cacert` the legacy etcd backend's (torch reads each backend's own spelling only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdConf {
    pub protocol: EtcdProtocol,
    pub ssl_cert: Option<PathBuf>,
    pub ssl_cert_key: Option<PathBuf>,
    pub ca_cert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub cacert: Option<PathBuf>,
    /// Legacy etcd's key prefix; None: torch's `/torchelastic/p2p`.
    pub etcd_prefix: Option<String>,
}

impl Default for RdzvConf {
    fn default() -> RdzvConf {
        let secs = Duration::from_secs;
        RdzvConf {
            join_timeout: secs(600),
            read_timeout: secs(60),
            last_call_timeout: secs(30),
            exit_barrier_timeout: secs(300),
            close_timeout: secs(30),
            keep_alive_interval: secs(5),
            heartbeat_timeout: secs(5),
            keep_alive_max_attempt: 3,
            membership_grace: secs(3),
            is_host: None,
            cas_backoff_max: Duration::ZERO,
            store_type: StoreType::Tcp,
            timeout: secs(900),
            etcd: EtcdConf::default(),
            token_file: None,
            bind: None,
            namespace: None,
        }
    }
}

impl RdzvConf {
    /// `k1=v1,k2=v2` as torchrun splits it (keys and values trimmed, a later duplicate wins), each value
    /// checked and typed.
    pub fn parse(s: &str) -> Result<RdzvConf, ConfigError> {
        let mut conf = RdzvConf::default();
        if s.trim().is_empty() {
            return Ok(conf);
        }
        for item in s.split(',') {
            let (k, v) = item.split_once('=').map(|(k, v)| (k.trim(), v.trim())).unwrap_or((item.trim(), ""));
            if k.is_empty() || v.is_empty() {
                return Err(bad(format!(
                    "invalid value '{s}' for '--rdzv-conf': '{item}' is not key=value; use k1=v1,k2=v2 with keys {}",
                    RDZV_CONF_KEYS.join(", ")
                )));
            }
            conf.set(k, v)?;
        }
        Ok(conf)
    }

    fn set(&mut self, k: &str, v: &str) -> Result<(), ConfigError> {
        let path = || Some(PathBuf::from(v));
        match k {
            "join_timeout" => self.join_timeout = seconds(k, v, false)?,
            "read_timeout" => self.read_timeout = seconds(k, v, false)?,
            "last_call_timeout" => self.last_call_timeout = seconds(k, v, false)?,
            "exit_barrier_timeout" => self.exit_barrier_timeout = seconds(k, v, false)?,
            "token_file" => self.token_file = path(),
            "close_timeout" => self.close_timeout = seconds(k, v, false)?,
            "keep_alive_interval" => self.keep_alive_interval = seconds(k, v, false)?,
            "heartbeat_timeout" => self.heartbeat_timeout = seconds(k, v, false)?,
            "membership_grace" => self.membership_grace = seconds(k, v, true)?,
            "timeout" => self.timeout = seconds(k, v, false)?,
            "cas_backoff_max_seconds" => self.cas_backoff_max = seconds(k, v, true)?,
            "keep_alive_max_attempt" => {
                self.keep_alive_max_attempt = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(format!("'--rdzv-conf {k}={v}': must be an integer > 0")))?
            }
            "is_host" => self.is_host = Some(torch_bool(k, v)?),
            "store_type" => {
                self.store_type = match v.to_ascii_lowercase().as_str() {
                    "tcp" => StoreType::Tcp,
                    "file" => StoreType::File,
                    _ => return Err(bad(format!("'--rdzv-conf {k}={v}': use tcp or file"))),
                }
            }
            "protocol" => {
                self.etcd.protocol = match v.to_ascii_lowercase().as_str() {
                    "http" => EtcdProtocol::Http,
                    "https" => EtcdProtocol::Https,
                    _ => return Err(bad(format!("'--rdzv-conf {k}={v}': use http or https"))),
                }
            }
            "ssl_cert" => self.etcd.ssl_cert = path(),
            "ssl_cert_key" => self.etcd.ssl_cert_key = path(),
            "ca_cert" => self.etcd.ca_cert = path(),
            "cert" => self.etcd.cert = path(),
            "key" => self.etcd.key = path(),
            "cacert" => self.etcd.cacert = path(),
            "etcd_prefix" => self.etcd.etcd_prefix = Some(v.to_string()),
            "namespace" => self.namespace = Some(v.to_string()),
            "bind" => {
                let ip = v.strip_prefix('[').and_then(|ip| ip.strip_suffix(']')).unwrap_or(v);
                self.bind = Some(ip.parse().map_err(|_| {
                    bad(format!("'--rdzv-conf {k}={v}': use an IP address of this machine (:: or 0.0.0.0 for all)"))
                })?)
            }
            _ => {
                return Err(bad(format!(
                    "unknown key '{k}' in '--rdzv-conf'; known keys: {}",
                    RDZV_CONF_KEYS.join(", ")
                )))
            }
        }
        Ok(())
    }
}

/// A number of seconds (torch takes whole seconds; fractions are accepted), > 0 or, with `zero_ok`, >= 0.
fn seconds(k: &str, v: &str, zero_ok: bool) -> Result<Duration, ConfigError> {
    let floor = if zero_ok { ">= 0" } else { "> 0" };
    v.parse::<f64>()
        .ok()
        .filter(|x| if zero_ok { *x >= 0.0 } else { *x > 0.0 })
        .and_then(|x| Duration::try_from_secs_f64(x).ok())
        .ok_or_else(|| bad(format!("'--rdzv-conf {k}={v}': must be a number of seconds {floor}")))
}

/// torch's `get_as_bool`: 1/true/t/yes/y and 0/false/f/no/n, any case.
fn torch_bool(k: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Ok(true),
        "0" | "false" | "f" | "no" | "n" => Ok(false),
        _ => Err(bad(format!("'--rdzv-conf {k}={v}': use true or false"))),
    }
}

/// How this node meets its peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// c10d: muster's rendezvous store at `host:port`, hosted by the agent on that machine (`is_host`, or
    /// torch's heuristic when None); the group-rank-0 agent serves the workers' store on a port it binds and
    /// exports `MASTER_ADDR` = `local_addr`. `--standalone` is c10d on `localhost:0`.
    C10d { host: String, port: u16, is_host: Option<bool> },
    /// static: the store at `MASTER_ADDR:MASTER_PORT`, hosted by node rank 0 and shared with the workers;
    /// every node must be there (`--nnodes N`) and `--node-rank` is the group rank.
    Static { master_addr: String, master_port: u16 },
    /// etcd v3: the rendezvous in etcd (no node hosts it); the group-rank-0 agent serves the workers'
    /// store, as with c10d. The handle's settings, complete: members, TLS, credentials, namespace, lease.
    Etcd(crate::store::etcd::EtcdOptions),
    /// The Kubernetes API server: the rendezvous in the Leases of a namespace (no node hosts it); the
    /// group-rank-0 agent serves the workers' store, as with etcd.
    Kube(super::k8s::KubeTarget),
}

/// Host and port of `--rdzv-endpoint` as torch's `parse_rendezvous_endpoint` splits and checks them: an empty
/// endpoint gives an empty host; a `[v6]` host may carry a port after the bracket. One deviation: a bare IPv6
/// address whose last colon belongs to `::` (`fe80::1`) is all host, where torch would split off a port.
pub fn parse_endpoint(endpoint: &str) -> Result<(String, Option<u16>), ConfigError> {
    let e = endpoint.trim();
    if e.is_empty() {
        return Ok((String::new(), None));
    }
    let (host, port) = if e.starts_with('[') && e.ends_with(']') {
        (e, None)
    } else {
        match e.rsplit_once(':') {
            Some((h, _)) if h.ends_with(':') && !h.starts_with('[') => (e, None),
            Some((h, p)) => (h, Some(p)),
            None => (e, None),
        }
    };
    let invalid = |what: &str| {
        bad(format!("invalid value '{endpoint}' for '--rdzv-endpoint': {what}; use host[:port] or [ipv6]:port"))
    };
    let port = port
        .map(|p| match p.parse::<u16>() {
            Ok(n) if (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
            _ => Err(invalid(&format!("the port '{p}' is not a number in 0..=65535"))),
        })
        .transpose()?;
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner,
        None => host,
    };
    // torch: ^[\w\.:-]+$
    if host.is_empty() || !host.chars().all(|c| c.is_alphanumeric() || "_.:-".contains(c)) {
        return Err(invalid(&format!("the host '{host}' is not a host name, an IPv4 or an IPv6 address")));
    }
    Ok((host.to_string(), port))
}

/// The backend as torchrun reports it, the rendezvous, and the run id. torchrun 2.15: `--standalone`, and the
/// implicit standalone of a single-node static job with no endpoint and no master port, both become c10d on
/// `localhost:0` with a fresh run id.
/// `rank_from_context`: the node rank is the scheduler's, which c10d prefers as the group rank (no warning).
pub(super) fn resolve(
    cli: &Cli,
    max_nodes: u32,
    conf: &RdzvConf,
    rank_from_context: bool,
    etcd_credentials: Option<crate::store::etcd::Credentials>,
) -> Result<(String, Rendezvous, String), ConfigError> {
    let implicit_standalone = !cli.standalone
        && cli.rdzv_backend == "static"
        && cli.rdzv_endpoint.is_empty()
        && cli.master_port.is_none()
        && max_nodes == 1;
    let standalone = cli.standalone || implicit_standalone;
    let (backend, endpoint, run_id) = if standalone {
        ("c10d".to_string(), "localhost:0".to_string(), uuid::Uuid::new_v4().to_string())
    } else {
        (cli.rdzv_backend.clone(), cli.rdzv_endpoint.clone(), cli.rdzv_id.clone())
    };
    let rendezvous = match backend.as_str() {
        "static" => {
            if cli.node_rank >= max_nodes {
                return Err(bad(format!(
                    "invalid value '{}' for '--node-rank': must be < --nnodes ({max_nodes})",
                    cli.node_rank
                )));
            }
            let (addr, port) = if cli.rdzv_endpoint.is_empty() {
                (cli.master_addr.clone(), cli.master_port.or(Some(29500)))
            } else {
                parse_endpoint(&cli.rdzv_endpoint)?
            };
            let master_port = port.ok_or_else(|| {
                bad(format!("'--rdzv-endpoint {}': the static backend needs host:port", cli.rdzv_endpoint))
            })?;
            let master_addr = addr.trim_start_matches('[').trim_end_matches(']').to_string();
            Rendezvous::Static { master_addr, master_port }
        }
        "c10d" => {
            let (h, port) = parse_endpoint(&endpoint)?;
            let host = if h.is_empty() { "localhost".to_string() } else { h };
            let is_host = if standalone { Some(true) } else { conf.is_host };
            Rendezvous::C10d { host, port: port.unwrap_or(29400), is_host }
        }
        "etcd" | "etcd-v2" | "etcd-v3" => {
            Rendezvous::Etcd(super::etcd::options(&super::etcd::target(&endpoint, conf)?, etcd_credentials, conf))
        }
        "k8s" | "kubernetes" => {
            Rendezvous::Kube(super::k8s::target(&endpoint, conf, super::k8s::pod_name(std::env::var("POD_NAME"))?)?)
        }
        other => {
            return Err(bad(format!(
                "invalid value '{other}' for '--rdzv-backend': use static, c10d, etcd, etcd-v2, etcd-v3 or k8s (kubernetes)"
            )))
        }
    };
    if cli.node_rank != 0 && backend != "static" && !rank_from_context {
        tracing::warn!("--node-rank with the {backend} rendezvous is a preference: the node gets that group rank when it joins a new round and the rank is free (torchrun ignores it)");
    }
    Ok((backend, rendezvous, run_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdzv_conf_defaults_are_torchruns() {
        let c = RdzvConf::parse("").unwrap();
        assert_eq!(c, RdzvConf::default());
        assert_eq!(c.join_timeout, Duration::from_secs(600));
        assert_eq!(c.keep_alive_max_attempt, 3);
        assert_eq!(c.timeout, Duration::from_secs(900));
        assert_eq!(c.is_host, None);
    }

    #[test]
    fn rdzv_conf_values_are_typed_and_a_later_duplicate_wins() {
        let c = RdzvConf::parse(" join_timeout = 5 ,is_host=YES,join_timeout=7.5,keep_alive_max_attempt=4").unwrap();
        assert_eq!(c.join_timeout, Duration::from_millis(7500));
        assert_eq!(c.is_host, Some(true));
        assert_eq!(c.keep_alive_max_attempt, 4);
        let c = RdzvConf::parse("is_host=0,cas_backoff_max_seconds=0,store_type=FILE,protocol=https,cert=/c.pem")
            .unwrap();
        assert_eq!(c.is_host, Some(false));
        assert_eq!(c.cas_backoff_max, Duration::ZERO);
        assert_eq!(c.store_type, StoreType::File);
        assert_eq!(c.etcd.protocol, EtcdProtocol::Https);
        assert_eq!(c.etcd.cert, Some(PathBuf::from("/c.pem")));
        let c = RdzvConf::parse("bind=[::1]").unwrap();
        assert_eq!(c.bind, Some(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)));
        assert_eq!(RdzvConf::parse("bind=0.0.0.0").unwrap().bind, Some([0, 0, 0, 0].into()));
    }

    #[test]
    fn every_listed_key_is_accepted() {
        for k in RDZV_CONF_KEYS {
            let v = match *k {
                "is_host" => "1",
                "store_type" => "tcp",
                "protocol" => "http",
                "bind" => "::1",
                _ => "3",
            };
            assert!(RdzvConf::parse(&format!("{k}={v}")).is_ok(), "{k}");
        }
    }

    #[test]
    fn bad_rdzv_conf_names_the_key_and_what_is_valid() {
        let cases = [
            ("foo", "join_timeout"),
            ("join_timeout=", "not key=value"),
            ("=3", "not key=value"),
            ("bogus=1", "known keys"),
            ("read_timeout=0", "> 0"),
            ("join_timeout=abc", "join_timeout=abc"),
            ("join_timeout=1e300", "seconds"),
            ("join_timeout=inf", "seconds"),
            ("cas_backoff_max_seconds=-1", ">= 0"),
            ("keep_alive_max_attempt=0", "integer > 0"),
            ("keep_alive_max_attempt=1.5", "integer > 0"),
            ("is_host=maybe", "true or false"),
            ("store_type=redis", "tcp or file"),
            ("protocol=ftp", "http or https"),
            ("bind=node0", "an IP address"),
            ("bind=[::1", "an IP address"),
        ];
        for (text, needle) in cases {
            let e = RdzvConf::parse(text).unwrap_err().to_string();
            assert!(e.contains("--rdzv-conf") && e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn endpoints_split_as_torch_does() {
        let ok = |e: &str| parse_endpoint(e).unwrap();
        assert_eq!(ok(""), (String::new(), None));
        assert_eq!(ok("node0"), ("node0".into(), None));
        assert_eq!(ok(" node0:29400 "), ("node0".into(), Some(29400)));
        assert_eq!(ok("[::1]:31005"), ("::1".into(), Some(31005)));
        assert_eq!(ok("[::1]"), ("::1".into(), None));
        assert_eq!(ok("fe80::1"), ("fe80::1".into(), None));
        assert_eq!(ok("10.0.0.1:0"), ("10.0.0.1".into(), Some(0)));
        for bad in [":", ":29400", "[::1:31005", "host:", "host:65536", "host:+1", "host:000001", "a b:1", "[]", "[]:1"] {
            let e = parse_endpoint(bad).unwrap_err().to_string();
            assert!(e.contains("--rdzv-endpoint") && e.contains(bad), "{bad}: {e}");
        }
    }
}
