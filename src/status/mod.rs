//! `muster status`: the job as its rendezvous store holds it — round, members with their group ranks,
//! states, restarts and heartbeat ages, joiners and spares — read without joining or disturbing it.
//!
//! The store is muster's TCP store (c10d, static) or etcd (`--rdzv-backend etcd`, with the agents'
//! `--rdzv-conf` TLS and prefix keys); an etcd handle that only reads grants no lease, so it leaves nothing.
//!
//! Exit codes: 0 shown; 1 no such job in the store, or its records are unreadable; 2 bad input (one line
//! naming the flag), also a job token or etcd credentials the store refuses, or an endpoint that is not a
//! muster store or etcd; 3 the rendezvous store is unreachable (not connected, or no answer within `--timeout`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::config::token::{self, TOKEN_ENV};
use crate::config::{self, RdzvConf};
use crate::rendezvous::{forget, read_view, readmit, unix_ms, RdzvError};
use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::k8s::{KubeOptions, KubeStore};
use crate::store::remote::RemoteStore;
use crate::store::{Store, StoreError};

mod snapshot;

pub use snapshot::{JobPhase, NodeState, Readmitted, Row, Snapshot};

/// Show a running job: its round, members, their states and heartbeats, and the nodes waiting.
#[derive(Debug, Parser)]
#[command(name = "muster status")]
pub struct StatusArgs {
    /// The job's rendezvous endpoint, host[:port], as the agents were given it (port default: 29400;
    /// etcd: host:port[,host:port...], port default 2379; k8s: a kubeconfig, or empty as kubectl reads one).
    #[arg(long = "rdzv-endpoint", alias = "rdzv_endpoint")]
    rdzv_endpoint: Option<String>,
    /// The job's run id (the agents' --rdzv-id).
    #[arg(long = "rdzv-id", alias = "rdzv_id")]
    rdzv_id: Option<String>,
    /// The agents' rendezvous backend: c10d, static (the store on MASTER_ADDR:MASTER_PORT), etcd
    /// (etcd-v2 and etcd-v3 name it too), or k8s (kubernetes), the API server.
    #[arg(
        long = "rdzv-backend",
        alias = "rdzv_backend",
        default_value = "c10d",
        value_parser = ["c10d", "static", "etcd", "etcd-v2", "etcd-v3", "k8s", "kubernetes"]
    )]
    rdzv_backend: String,
    /// The agents' --rdzv-conf, as they were given it: etcd's protocol, cacert, cert, key and etcd_prefix,
    /// and token_file, are used; the other keys are checked and left alone.
    #[arg(long = "rdzv-conf", alias = "rdzv_conf", default_value = "")]
    rdzv_conf: String,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    pub format: String,
    /// Seconds to connect and read everything; past it the store counts as unreachable.
    #[arg(long, default_value = "5", value_parser = positive_seconds)]
    timeout: Duration,
    /// A file holding the job token [default: --rdzv-conf token_file, else $MUSTER_RDZV_TOKEN].
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Lets a host kept out by `--exclude-after` back in (once repaired): forgets its incidents, then shows
    /// the job. HOST as the table's `kept out:` line names it (the agent's --local-addr).
    #[arg(long, value_name = "HOST")]
    readmit: Option<String>,
    /// With --rdzv-backend k8s: deletes the job's Leases but its kept-out hosts' incidents, as the job's
    /// last agent does when it ends, for a job whose agents all died; refused while a node of it beats.
    #[arg(long, conflicts_with = "readmit")]
    forget: bool,
}

fn positive_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err("must be a number of seconds > 0 (at most 3600)".to_string()),
    }
}

/// Why no status was shown; each is one line and names the endpoint or the run id.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("the rendezvous store at {endpoint} is unreachable: {source}")]
    Unreachable { endpoint: String, source: StoreError },
    #[error("no answer from the rendezvous store at {endpoint} within {timeout:?}; check the endpoint or raise --timeout")]
    NoAnswer { endpoint: String, timeout: Duration },
    #[error("the rendezvous store at {endpoint} refused this reader: {source}")]
    Refused { endpoint: String, source: StoreError },
    #[error("cannot reach the rendezvous store at {endpoint} with these settings: {source}")]
    Setting { endpoint: String, source: StoreError },
    #[error(
        "no job '{run_id}' in the rendezvous store at {endpoint}; check --rdzv-id (the agents' run id) and \
         --rdzv-endpoint"
    )]
    UnknownRun { run_id: String, endpoint: String },
    #[error(
        "job '{run_id}' at {endpoint} is running (node {node} beat {age_ms} ms ago); '--forget' is for a job \
         whose agents are all gone: stop the job first"
    )]
    StillRunning { run_id: String, endpoint: String, node: String, age_ms: u64 },
    #[error("cannot read job '{run_id}' at {endpoint}: {source}")]
    Unreadable { run_id: String, endpoint: String, source: RdzvError },
}

impl StatusError {
    pub fn exit_code(&self) -> u8 {
        match self {
            StatusError::Unreachable { .. } | StatusError::NoAnswer { .. } => crate::exit::RDZV_INCOMPLETE,
            StatusError::Refused { .. } | StatusError::Setting { .. } | StatusError::StillRunning { .. } => crate::exit::USAGE,
            StatusError::UnknownRun { .. } | StatusError::Unreadable { .. } => crate::exit::FAILED,
        }
    }

    /// A store error while reading: the connection's (unreachable), the endpoint's (not a muster store or
    /// etcd, a refused token, credentials or certificate), a setting's (an unreadable TLS file), or the
    /// records'.
    fn from_store(e: StoreError, endpoint: &str, run_id: &str) -> StatusError {
        let endpoint = endpoint.to_string();
        match e {
            StoreError::WrongToken { .. }
            | StoreError::NotAStore { .. }
            | StoreError::Handshake { .. }
            | StoreError::NotEtcd { .. }
            | StoreError::EtcdAuth { .. }
            | StoreError::KubeForbidden { .. }
            | StoreError::Tls { .. } => StatusError::Refused { endpoint, source: e },
            StoreError::BadSetting { .. } => StatusError::Setting { endpoint, source: e },
            StoreError::Protocol { .. } | StoreError::Etcd { .. } | StoreError::Kube { .. } => {
                StatusError::Unreadable { run_id: run_id.to_string(), endpoint, source: RdzvError::Store(e) }
            }
            _ => StatusError::Unreachable { endpoint, source: e },
        }
    }
}

/// Where and what to read, validated.
#[derive(Debug)]
pub struct Target {
    /// As messages and the table's heading name it.
    endpoint: String,
    backend: Backend,
    run_id: String,
    timeout: Duration,
    /// `--readmit HOST`.
    readmit: Option<String>,
    /// `--forget`.
    forget: bool,
}

#[derive(Debug)]
enum Backend {
    /// muster's TCP store (c10d, static).
    Tcp { host: String, port: u16, token: Vec<u8> },
    Etcd(EtcdOptions),
    Kube(KubeOptions),
}

/// The flags checked: one line naming the first that is missing or bad. `env` reads the environment (the
/// job token, etcd's user and password).
pub fn target(args: &StatusArgs, env: &dyn Fn(&str) -> Option<String>) -> Result<Target, String> {
    let missing = || "'--rdzv-endpoint' is missing or empty: give the job's rendezvous endpoint as host[:port]".to_string();
    let endpoint = args.rdzv_endpoint.as_deref().unwrap_or_default().trim();
    let kube = matches!(args.rdzv_backend.as_str(), "k8s" | "kubernetes");
    if endpoint.is_empty() && !kube {
        return Err(missing());
    }
    let run_id = match args.rdzv_id.as_deref().map(str::trim) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => return Err("'--rdzv-id' is missing or empty: give the job's run id (the agents' --rdzv-id)".to_string()),
    };
    let conf = RdzvConf::parse(&args.rdzv_conf).map_err(|e| e.to_string())?;
    let (endpoint, backend) = match args.rdzv_backend.as_str() {
        "etcd" | "etcd-v2" | "etcd-v3" => {
            let etcd = config::etcd::target(endpoint, &conf).map_err(|e| e.to_string())?;
            let credentials = config::etcd::credentials(env).map_err(|e| e.to_string())?;
            let options = EtcdOptions { request_timeout: args.timeout, ..config::etcd::options(&etcd, credentials, &conf) };
            (etcd.endpoints.join(","), Backend::Etcd(options))
        }
        "k8s" | "kubernetes" => {
            // Status creates no job objects but the lemon memory's (never owned): no pod to read.
            let target = config::k8s::target(endpoint, &conf, None).map_err(|e| e.to_string())?;
            let options = KubeOptions { request_timeout: args.timeout, ..config::k8s::options(&target, &run_id, "status", 1, &conf) };
            let shown = if endpoint.is_empty() { "the Kubernetes API server".to_string() } else { format!("the Kubernetes API server of {endpoint}") };
            (shown, Backend::Kube(options))
        }
        backend => {
            let (host, port) = config::parse_endpoint(endpoint).map_err(|e| e.to_string())?;
            if host.is_empty() {
                return Err(missing());
            }
            let port = port.unwrap_or(if backend == "static" { 29500 } else { 29400 });
            let (file, flag) = match (&args.token_file, &conf.token_file) {
                (None, Some(file)) => (Some(file.as_path()), "--rdzv-conf token_file"),
                (file, _) => (file.as_deref(), "--token-file"),
            };
            let token = token::resolve(file, flag, env(TOKEN_ENV)).map_err(|e| e.to_string())?;
            let token = token.map(|t| t.bytes().to_vec()).unwrap_or_default();
            let shown = if host.contains(':') { format!("[{host}]") } else { host.clone() };
            (format!("{shown}:{port}"), Backend::Tcp { host, port, token })
        }
    };
    if args.forget && !matches!(backend, Backend::Kube(_)) {
        return Err(format!(
            "'--forget' is for --rdzv-backend k8s (not {}): muster's own store ends with its host, and etcd keeps a \
             job's keys as any others (etcdctl del --prefix deletes them)",
            args.rdzv_backend
        ));
    }
    let readmit = args.readmit.as_deref().map(str::trim).filter(|h| !h.is_empty()).map(str::to_string);
    Ok(Target { endpoint, backend, run_id, timeout: args.timeout, readmit, forget: args.forget })
}

/// Connects to the store and reads the job, all within `--timeout`: the connect retries until then and
/// fails naming its last error; the name's lookup and the reads are cut there.
pub async fn connect_and_show(t: &Target) -> Result<Snapshot, StatusError> {
    let deadline = tokio::time::Instant::now() + t.timeout;
    let no_answer = || StatusError::NoAnswer { endpoint: t.endpoint.clone(), timeout: t.timeout };
    let store_error = |e| StatusError::from_store(e, &t.endpoint, &t.run_id);
    let left = || deadline.saturating_duration_since(tokio::time::Instant::now());
    let (host, port, token) = match &t.backend {
        Backend::Tcp { host, port, token } => (host, *port, token),
        Backend::Etcd(options) => {
            // Reads only, so no lease is granted; dropping the handle leaves etcd as it was.
            let store = EtcdStore::connect(options, t.timeout).await.map_err(store_error)?;
            return within(deadline, &store, t).await;
        }
        Backend::Kube(options) => {
            // Reads only: its session object is made at a first session write, which never comes.
            let store = KubeStore::connect(options, t.timeout).await.map_err(store_error)?;
            return within(deadline, &store, t).await;
        }
    };
    let not_found = || std::io::Error::new(std::io::ErrorKind::NotFound, "no address found");
    let addr = tokio::time::timeout_at(deadline, tokio::net::lookup_host((host.as_str(), port)))
        .await
        .map_err(|_| no_answer())?
        .and_then(|mut a| a.next().ok_or_else(not_found))
        .map_err(|source| store_error(StoreError::Resolve { host: host.clone(), source }))?;
    let store = RemoteStore::connect(addr, token, left(), left()).await.map_err(store_error)?;
    within(deadline, &store, t).await
}

/// [`readmit_and_show`] on `store`, cut at `deadline`.
async fn within<S: Store>(deadline: tokio::time::Instant, store: &S, t: &Target) -> Result<Snapshot, StatusError> {
    let shown = tokio::time::timeout_at(deadline, readmit_and_show(store, t)).await;
    shown.map_err(|_| StatusError::NoAnswer { endpoint: t.endpoint.clone(), timeout: t.timeout })?
}

/// `--readmit HOST` first (one of the two writes `muster status` makes), then the job; with `--forget`,
/// the job as it was, then deleted.
async fn readmit_and_show<S: Store>(store: &S, t: &Target) -> Result<Snapshot, StatusError> {
    let readmitted = match &t.readmit {
        Some(host) => {
            let forgotten = readmit(store, &t.run_id, host).await.map_err(|e| view_error(e, &t.endpoint, &t.run_id))?;
            Some(Readmitted { host: host.clone(), forgotten })
        }
        None => None,
    };
    let snapshot = Snapshot { readmitted, ..show(store, &t.endpoint, &t.run_id).await? };
    if !t.forget {
        return Ok(snapshot);
    }
    if let Some((node, age_ms)) = snapshot.beating() {
        return Err(StatusError::StillRunning { run_id: t.run_id.clone(), endpoint: t.endpoint.clone(), node, age_ms });
    }
    let keys = forget(store, &t.run_id).await.map_err(|e| view_error(e, &t.endpoint, &t.run_id))?;
    Ok(Snapshot { forgotten: Some(keys), ..snapshot })
}

fn view_error(e: RdzvError, endpoint: &str, run_id: &str) -> StatusError {
    match e {
        RdzvError::Store(e) => StatusError::from_store(e, endpoint, run_id),
        source => StatusError::Unreadable { run_id: run_id.to_string(), endpoint: endpoint.to_string(), source },
    }
}

/// The job `run_id` as `store` holds it: any [`Store`]. Reads only.
pub async fn show<S: Store>(store: &S, endpoint: &str, run_id: &str) -> Result<Snapshot, StatusError> {
    let view = match read_view(store, run_id).await {
        Ok(Some(view)) => view,
        Ok(None) => return Err(StatusError::UnknownRun { run_id: run_id.to_string(), endpoint: endpoint.to_string() }),
        Err(e) => return Err(view_error(e, endpoint, run_id)),
    };
    Ok(Snapshot::from_view(&view, endpoint, unix_ms().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::{Fingerprint, KEY_PREFIX};
    use crate::store::etcd::testing::TestEtcd;

    fn parse(args: &[&str]) -> Result<StatusArgs, clap::Error> {
        StatusArgs::try_parse_from(std::iter::once("muster status").chain(args.iter().copied()))
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn target_of(args: &[&str]) -> Result<Target, String> {
        target(&parse(args).expect("parses"), &no_env)
    }

    #[test]
    fn bad_input_names_the_flag() {
        let missing = target_of(&["--rdzv-id", "j"]).unwrap_err();
        assert!(missing.starts_with("'--rdzv-endpoint' is missing"), "{missing}");
        let missing = target_of(&["--rdzv-endpoint", "h"]).unwrap_err();
        assert!(missing.starts_with("'--rdzv-id' is missing"), "{missing}");
        let timeout = crate::cli::one_line(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--timeout", "0"]).unwrap_err());
        assert!(timeout.contains("--timeout") && timeout.contains("> 0"), "{timeout}");
        let format = crate::cli::one_line(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--format", "xml"]).unwrap_err());
        assert!(format.contains("--format"), "{format}");
        let backend = crate::cli::one_line(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--rdzv-backend", "etcd-v4"]).unwrap_err());
        assert!(backend.contains("--rdzv-backend"), "{backend}");
        let bad = target_of(&["--rdzv-endpoint", "h:99999", "--rdzv-id", "j"]).unwrap_err();
        assert!(bad.contains("'--rdzv-endpoint'") && !bad.contains('\n'), "{bad}");
        let token = |name: &str| (name == TOKEN_ENV).then(|| " ".to_string());
        let empty = target(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j"]).unwrap(), &token).unwrap_err();
        assert!(empty.contains(TOKEN_ENV), "{empty}");
    }

    #[test]
    fn etcd_settings_are_the_agents_and_bad_ones_name_the_key() {
        let etcd = |conf: &str| target_of(&["--rdzv-backend", "etcd", "--rdzv-endpoint", "h1, h2:1", "--rdzv-id", "j", "--rdzv-conf", conf]);
        let t = etcd("etcd_prefix=/jobs,keep_alive_interval=1").unwrap();
        let Backend::Etcd(options) = &t.backend else { panic!("{t:?}") };
        assert_eq!((t.endpoint.as_str(), options.namespace.as_str()), ("h1:2379,h2:1", "/jobs/"));
        assert_eq!((options.request_timeout, options.tls.is_none()), (Duration::from_secs(5), true), "bounded by --timeout");
        let bad: &[(&str, &str)] = &[("protocol=https", "cacert"), ("etcd_prefix=jobs", "etcd_prefix"), ("colour=red", "colour")];
        for (conf, named) in bad {
            let e = etcd(conf).unwrap_err();
            assert!(e.contains(named) && !e.contains('\n'), "{conf}: {e}");
        }
        let e = target_of(&["--rdzv-backend", "etcd-v3", "--rdzv-endpoint", "ftp://h", "--rdzv-id", "j"]).unwrap_err();
        assert!(e.contains("'--rdzv-endpoint'"), "{e}");
        let user_only = |name: &str| (name == config::etcd::USER_ENV).then(|| "u".to_string());
        let args = parse(&["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "h", "--rdzv-id", "j"]).unwrap();
        let e = target(&args, &user_only).unwrap_err();
        assert!(e.contains(config::etcd::PASSWORD_ENV), "{e}");
    }

    #[test]
    fn forget_is_for_the_api_server_and_not_with_readmit() {
        for backend in ["c10d", "static", "etcd"] {
            let e = target_of(&["--rdzv-backend", backend, "--rdzv-endpoint", "h", "--rdzv-id", "j", "--forget"]).unwrap_err();
            assert!(e.starts_with("'--forget' is for --rdzv-backend k8s") && e.contains(backend) && !e.contains('\n'), "{e}");
        }
        let t = target_of(&["--rdzv-backend", "k8s", "--rdzv-id", "j", "--forget"]).unwrap();
        assert!(t.forget && matches!(t.backend, Backend::Kube(_)));
        let both = crate::cli::one_line(&parse(&["--rdzv-backend", "k8s", "--rdzv-id", "j", "--forget", "--readmit", "h"]).unwrap_err());
        assert!(both.contains("--forget") && both.contains("--readmit"), "{both}");
    }

    #[test]
    fn the_port_defaults_by_backend_and_v6_hosts_are_bracketed() {
        let t = target_of(&["--rdzv-endpoint", "node0", "--rdzv-id", "j"]).unwrap();
        assert_eq!((t.endpoint.as_str(), t.timeout), ("node0:29400", Duration::from_secs(5)));
        let t = target_of(&["--rdzv-endpoint", "[::1]", "--rdzv-id", "j", "--rdzv-backend", "static"]).unwrap();
        let Backend::Tcp { host, port, .. } = &t.backend else { panic!("{t:?}") };
        assert_eq!((t.endpoint.as_str(), host.as_str(), *port), ("[::1]:29500", "::1", 29500));
    }

    #[test]
    fn the_token_comes_from_the_flag_then_the_agents_rdzv_conf() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, token: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, token).unwrap();
            path.display().to_string()
        };
        let (flag, conf) = (file("flag", "t1\n"), file("conf", "t2"));
        let token = |args: &[&str]| match target_of(args).unwrap().backend {
            Backend::Tcp { token, .. } => token,
            Backend::Etcd(_) | Backend::Kube(_) => panic!("a TCP target"),
        };
        let conf = format!("token_file={conf},join_timeout=5");
        assert_eq!(token(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--rdzv-conf", &conf]), b"t2");
        assert_eq!(token(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--rdzv-conf", &conf, "--token-file", &flag]), b"t1");
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_within_the_timeout_in_one_line() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let endpoint = format!("127.0.0.1:{port}");
        for backend in ["c10d", "etcd"] {
            let args = ["--rdzv-backend", backend, "--rdzv-endpoint", &endpoint, "--rdzv-id", "j", "--timeout", "0.5"];
            let e = connect_and_show(&target_of(&args).unwrap()).await.unwrap_err();
            let line = e.to_string();
            assert_eq!(e.exit_code(), 3, "{backend}: {line}");
            assert!(line.contains(&format!("store at {endpoint} is unreachable")) && !line.contains('\n'), "{backend}: {line}");
        }
    }

    /// etcd's revision (every write moves it) and its leases, read over its JSON gateway.
    async fn etcd_state(endpoint: &str) -> (i64, Vec<String>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let post = |path: &str| {
            let request = client.post(format!("http://{endpoint}{path}")).body("{}").send();
            async move { serde_json::from_slice::<serde_json::Value>(&request.await.unwrap().bytes().await.unwrap()).unwrap() }
        };
        let (status, leases) = (post("/v3/maintenance/status").await, post("/v3/lease/leases").await);
        let revision = status["header"]["revision"].as_str().and_then(|r| r.parse().ok()).expect("a revision");
        let ids = leases["leases"].as_array().map(|l| l.iter().map(|l| l["ID"].to_string()).collect()).unwrap_or_default();
        (revision, ids)
    }

    #[tokio::test]
    async fn an_etcd_job_is_read_without_a_write_or_a_lease() {
        let etcd = TestEtcd::start();
        let agent = etcd.store("/jobs/").await;
        let fingerprint = Fingerprint { entrypoint: "train.py".into(), args: vec![], nproc_spec: "1".into(), nnodes: "1:2".into(), restart_budget: String::new(), exclude_after: String::new() };
        agent.set(&format!("{KEY_PREFIX}j/fingerprint"), &serde_json::to_vec(&fingerprint).unwrap()).await.unwrap();
        agent.set_session(&format!("{KEY_PREFIX}j/alive/n1"), b"1").await.unwrap();
        let before = etcd_state(&etcd.endpoint).await;
        assert_eq!(before.1.len(), 1, "the agent's lease: {before:?}");
        let target = |run_id: &str| {
            let args = ["--rdzv-backend", "etcd", "--rdzv-endpoint", &etcd.endpoint, "--rdzv-id", run_id, "--rdzv-conf", "etcd_prefix=/jobs"];
            target_of(&args).unwrap()
        };
        let Backend::Etcd(options) = target("j").backend else { panic!("an etcd target") };
        let reader = EtcdStore::connect(&options, Duration::from_secs(5)).await.unwrap();
        let snapshot = show(&reader, &etcd.endpoint, "j").await.unwrap();
        assert_eq!((snapshot.run_id.as_str(), snapshot.phase), ("j", JobPhase::Forming));
        assert_eq!(etcd_state(&etcd.endpoint).await, before, "the open reader wrote nothing and holds no lease");
        drop(reader);
        let unknown = connect_and_show(&target("other")).await.unwrap_err();
        assert_eq!(unknown.exit_code(), 1, "{unknown}");
        assert!(unknown.to_string().contains(&format!("no job 'other' in the rendezvous store at {}", etcd.endpoint)), "{unknown}");
        assert_eq!(etcd_state(&etcd.endpoint).await, before, "the readers gone, the agent's lease stays");
    }
}
