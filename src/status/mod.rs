//! `muster status`: the job as its rendezvous store holds it — round, members with their group ranks,
//! states, restarts and heartbeat ages, joiners and spares — read without joining or disturbing it.
//!
//! Exit codes: 0 shown; 1 no such job in the store, or its records are unreadable; 2 bad input (one line
//! naming the flag), also a job token the store refuses or an endpoint that is not a muster store;
//! 3 the rendezvous store is unreachable (not connected, or no answer within `--timeout`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::config::token::{self, TOKEN_ENV};
use crate::rendezvous::{read_view, unix_ms, RdzvError};
use crate::store::remote::RemoteStore;
use crate::store::{Store, StoreError};

mod snapshot;

pub use snapshot::{JobPhase, NodeState, Row, Snapshot};

/// Show a running job: its round, members, their states and heartbeats, and the nodes waiting.
#[derive(Debug, Parser)]
#[command(name = "muster status")]
struct StatusArgs {
    /// The job's rendezvous endpoint, host[:port], as the agents were given it (port default: 29400).
    #[arg(long = "rdzv-endpoint", alias = "rdzv_endpoint")]
    rdzv_endpoint: Option<String>,
    /// The job's run id (the agents' --rdzv-id).
    #[arg(long = "rdzv-id", alias = "rdzv_id")]
    rdzv_id: Option<String>,
    /// The agents' rendezvous backend: c10d, or static (the store on MASTER_ADDR:MASTER_PORT).
    #[arg(long = "rdzv-backend", alias = "rdzv_backend", default_value = "c10d", value_parser = ["c10d", "static"])]
    rdzv_backend: String,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    format: String,
    /// Seconds to connect and read everything; past it the store counts as unreachable.
    #[arg(long, default_value = "5", value_parser = positive_seconds)]
    timeout: Duration,
    /// A file holding the job token [default: $MUSTER_RDZV_TOKEN].
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
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
    #[error(
        "no job '{run_id}' in the rendezvous store at {endpoint}; check --rdzv-id (the agents' run id) and \
         --rdzv-endpoint"
    )]
    UnknownRun { run_id: String, endpoint: String },
    #[error("cannot read job '{run_id}' at {endpoint}: {source}")]
    Unreadable { run_id: String, endpoint: String, source: RdzvError },
}

impl StatusError {
    pub fn exit_code(&self) -> i32 {
        match self {
            StatusError::Unreachable { .. } | StatusError::NoAnswer { .. } => 3,
            StatusError::Refused { .. } => 2,
            StatusError::UnknownRun { .. } | StatusError::Unreadable { .. } => 1,
        }
    }

    /// A store error while reading: the connection's (unreachable), the endpoint's (not a muster store, a
    /// refused token), or the records'.
    fn from_store(e: StoreError, endpoint: &str, run_id: &str) -> StatusError {
        let endpoint = endpoint.to_string();
        match e {
            StoreError::WrongToken { .. } | StoreError::NotAStore { .. } | StoreError::Handshake { .. } => {
                StatusError::Refused { endpoint, source: e }
            }
            StoreError::Protocol { .. } => {
                StatusError::Unreadable { run_id: run_id.to_string(), endpoint, source: RdzvError::Store(e) }
            }
            _ => StatusError::Unreachable { endpoint, source: e },
        }
    }
}

/// Where and what to read, validated.
#[derive(Debug)]
struct Target {
    endpoint: String,
    host: String,
    port: u16,
    run_id: String,
    token: Vec<u8>,
    timeout: Duration,
}

/// Entry point of `muster status ARGS...`; returns the exit code.
pub fn status_main(args: &[String]) -> i32 {
    let args: StatusArgs = match crate::cli::parse_subcommand("status", args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let target = match target(&args, std::env::var(TOKEN_ENV).ok()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("muster status: error: {e}");
            return 2;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("muster status: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let json = args.format == "json";
    match runtime.block_on(connect_and_show(&target)) {
        Ok(snapshot) => print_snapshot(&snapshot, json),
        Err(e) => {
            eprintln!("muster status: error: {e}");
            e.exit_code()
        }
    }
}

fn print_snapshot(snapshot: &Snapshot, json: bool) -> i32 {
    if !json {
        print!("{}", snapshot.table());
        return 0;
    }
    match snapshot.json() {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(e) => {
            eprintln!("muster status: cannot encode the status as JSON: {e}");
            1
        }
    }
}

/// The flags checked: one line naming the first that is missing or bad.
fn target(args: &StatusArgs, env_token: Option<String>) -> Result<Target, String> {
    let endpoint = args.rdzv_endpoint.as_deref().unwrap_or_default();
    let (host, port) = crate::config::parse_endpoint(endpoint).map_err(|e| e.to_string())?;
    if host.is_empty() {
        return Err("'--rdzv-endpoint' is missing or empty: give the job's rendezvous endpoint as host[:port]".to_string());
    }
    let run_id = match args.rdzv_id.as_deref().map(str::trim) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => return Err("'--rdzv-id' is missing or empty: give the job's run id (the agents' --rdzv-id)".to_string()),
    };
    let default_port = if args.rdzv_backend == "static" { 29500 } else { 29400 };
    let port = port.unwrap_or(default_port);
    let token = token::resolve(args.token_file.as_deref(), "--token-file", env_token).map_err(|e| e.to_string())?;
    Ok(Target {
        endpoint: format!("{}:{port}", if host.contains(':') { format!("[{host}]") } else { host.clone() }),
        host,
        port,
        run_id,
        token: token.map(|t| t.bytes().to_vec()).unwrap_or_default(),
        timeout: args.timeout,
    })
}

/// Connects to the c10d/static store (a muster TCP store) and reads the job, all within `--timeout`: the
/// connect retries until then and fails naming its last error; the name's lookup and the reads are cut there.
async fn connect_and_show(t: &Target) -> Result<Snapshot, StatusError> {
    let deadline = tokio::time::Instant::now() + t.timeout;
    let no_answer = || StatusError::NoAnswer { endpoint: t.endpoint.clone(), timeout: t.timeout };
    let store_error = |e| StatusError::from_store(e, &t.endpoint, &t.run_id);
    let not_found = || std::io::Error::new(std::io::ErrorKind::NotFound, "no address found");
    let addr = tokio::time::timeout_at(deadline, tokio::net::lookup_host((t.host.as_str(), t.port)))
        .await
        .map_err(|_| no_answer())?
        .and_then(|mut a| a.next().ok_or_else(not_found))
        .map_err(|source| store_error(StoreError::Resolve { host: t.host.clone(), source }))?;
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let store = RemoteStore::connect(addr, &t.token, left, left).await.map_err(store_error)?;
    tokio::time::timeout_at(deadline, show(&store, &t.endpoint, &t.run_id)).await.map_err(|_| no_answer())?
}

/// The job `run_id` as `store` holds it: any [`Store`] (an etcd store plugs in here). Reads only.
pub async fn show<S: Store>(store: &S, endpoint: &str, run_id: &str) -> Result<Snapshot, StatusError> {
    let view = match read_view(store, run_id).await {
        Ok(Some(view)) => view,
        Ok(None) => return Err(StatusError::UnknownRun { run_id: run_id.to_string(), endpoint: endpoint.to_string() }),
        Err(RdzvError::Store(e)) => return Err(StatusError::from_store(e, endpoint, run_id)),
        Err(source) => {
            return Err(StatusError::Unreadable { run_id: run_id.to_string(), endpoint: endpoint.to_string(), source })
        }
    };
    Ok(Snapshot::from_view(&view, endpoint, unix_ms().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<StatusArgs, clap::Error> {
        StatusArgs::try_parse_from(std::iter::once("muster status").chain(args.iter().copied()))
    }

    #[test]
    fn bad_input_names_the_flag() {
        let missing = target(&parse(&["--rdzv-id", "j"]).unwrap(), None).unwrap_err();
        assert!(missing.starts_with("'--rdzv-endpoint' is missing"), "{missing}");
        let missing = target(&parse(&["--rdzv-endpoint", "h"]).unwrap(), None).unwrap_err();
        assert!(missing.starts_with("'--rdzv-id' is missing"), "{missing}");
        let timeout = crate::cli::one_line(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--timeout", "0"]).unwrap_err());
        assert!(timeout.contains("--timeout") && timeout.contains("> 0"), "{timeout}");
        let format = crate::cli::one_line(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j", "--format", "xml"]).unwrap_err());
        assert!(format.contains("--format"), "{format}");
        let bad = target(&parse(&["--rdzv-endpoint", "h:99999", "--rdzv-id", "j"]).unwrap(), None).unwrap_err();
        assert!(bad.contains("'--rdzv-endpoint'") && !bad.contains('\n'), "{bad}");
        let empty = target(&parse(&["--rdzv-endpoint", "h", "--rdzv-id", "j"]).unwrap(), Some(" ".into())).unwrap_err();
        assert!(empty.contains(TOKEN_ENV), "{empty}");
    }

    #[test]
    fn the_port_defaults_by_backend_and_v6_hosts_are_bracketed() {
        let t = target(&parse(&["--rdzv-endpoint", "node0", "--rdzv-id", "j"]).unwrap(), None).unwrap();
        assert_eq!((t.endpoint.as_str(), t.port, t.timeout), ("node0:29400", 29400, Duration::from_secs(5)));
        let t = target(&parse(&["--rdzv-endpoint", "[::1]", "--rdzv-id", "j", "--rdzv-backend", "static"]).unwrap(), None)
            .unwrap();
        assert_eq!((t.endpoint.as_str(), t.host.as_str()), ("[::1]:29500", "::1"));
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable_within_the_timeout_in_one_line() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let args = parse(&["--rdzv-endpoint", &format!("127.0.0.1:{port}"), "--rdzv-id", "j", "--timeout", "0.5"]).unwrap();
        let e = connect_and_show(&target(&args, None).unwrap()).await.unwrap_err();
        let line = e.to_string();
        assert_eq!(e.exit_code(), 3, "{line}");
        assert!(line.contains(&format!("127.0.0.1:{port}")) && !line.contains('\n'), "{line}");
    }
}
