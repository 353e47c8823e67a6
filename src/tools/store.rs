//! `muster store`: the command line of the store server run as a process of its own
//! ([`crate::store::run_standalone`]).

use std::path::PathBuf;

use clap::Parser;

use super::{Threads, ToolError};
use crate::config::token::{self, TOKEN_ENV};
use crate::limits;
use crate::store::run_standalone;
use crate::store::tcp::server::default_buffered_bytes;
use crate::store::tcp::ServerConfig;

/// Serve a TCPStore-compatible key-value store until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "muster store")]
struct StoreArgs {
    /// Address to listen on; the default (`::`) is dual-stack, as torch's server.
    #[arg(long, default_value = "::")]
    host: String,
    /// Port to listen on; 0 picks a free one (printed on stdout).
    #[arg(long, default_value_t = 29400)]
    port: u16,
    /// Largest request or reply in bytes.
    #[arg(long, default_value_t = ServerConfig::default().max_frame_bytes, value_parser = positive)]
    max_frame_bytes: usize,
    /// Connections served at once [default: 16384, or the open-file limit less 512 kept for the
    /// store's own files when that is lower]; the limit is raised to its hard limit at start.
    #[arg(long, value_parser = positive)]
    max_connections: Option<usize>,
    /// Bytes all connections together may buffer; past it the connections holding the most are
    /// closed [default: 4 × --max-frame-bytes]. At least 2 × --max-frame-bytes.
    #[arg(long, value_parser = positive)]
    max_buffered_bytes: Option<usize>,
    /// A file holding the job token the agents must present [default: $MUSTER_RDZV_TOKEN]; with neither,
    /// any client that speaks muster's handshake is an agent (docs/security.md). Keep it readable by the
    /// job's user only.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
}

/// A count or size: zero would serve nothing.
fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("must be an integer > 0".to_string()),
    }
}

/// The server's limits from the command line and the open-file limit `open_files`.
fn server_config(args: &StoreArgs, open_files: u64) -> Result<ServerConfig, String> {
    let default = ServerConfig::default();
    let max_connections =
        limits::max_connections(args.max_connections, default.max_connections, open_files, "--max-connections")
            .map_err(|e| e.to_string())?;
    let frame = args.max_frame_bytes;
    let max_buffered_bytes = match args.max_buffered_bytes {
        Some(n) if n < frame.saturating_mul(2) => {
            return Err(format!(
                "invalid value '{n}' for '--max-buffered-bytes': must be at least 2 × --max-frame-bytes ({})",
                frame.saturating_mul(2)
            ))
        }
        Some(n) => n,
        None => default_buffered_bytes(frame),
    };
    Ok(ServerConfig {
        max_frame_bytes: frame,
        max_connections,
        max_buffered_bytes,
        ..default
    })
}

/// The token agents must present: `--token-file`, else `$MUSTER_RDZV_TOKEN` (`env`, as read); one that is
/// empty, unreadable or not UTF-8 is refused rather than served as "no token".
fn job_token(args: &StoreArgs, env: Result<String, std::env::VarError>) -> Result<Option<Vec<u8>>, String> {
    let env = match env {
        Ok(text) => Some(text),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(format!("{TOKEN_ENV} is not UTF-8 text; give the job token as text or with --token-file"))
        }
    };
    let token = token::resolve(args.token_file.as_deref(), "--token-file", env).map_err(|e| e.to_string())?;
    Ok(token.map(|t| t.bytes().to_vec()))
}

/// Entry point of `muster store ARGS...` (`args` after the subcommand).
pub fn main(args: &[String]) -> Result<u8, ToolError> {
    let args: StoreArgs = super::parse("store", args)?;
    crate::telemetry::init_with("info");
    let config = server_config(&args, limits::raise_open_files().soft)
        .and_then(|config| Ok(ServerConfig { token: job_token(&args, std::env::var(TOKEN_ENV))?, ..config }))
        .map_err(ToolError::Usage)?;
    if config.token.is_none() {
        tracing::info!(
            "no job token ({TOKEN_ENV} or --token-file): any client that speaks muster's handshake is served as an agent"
        );
    }
    let runtime = super::tool_runtime(Threads::PerCore)?;
    runtime.block_on(run_standalone(&args.host, args.port, config)).map_err(|e| ToolError::Failed(e.to_string()))?;
    Ok(crate::exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<StoreArgs, clap::Error> {
        StoreArgs::try_parse_from(std::iter::once("muster store").chain(args.iter().copied()))
    }

    #[test]
    fn zero_limits_are_refused_naming_the_flag() {
        for flag in ["--max-frame-bytes", "--max-connections", "--max-buffered-bytes"] {
            let e = parse(&[flag, "0"]).map(|_| ()).unwrap_err();
            let line = crate::cli::one_line(&e);
            assert!(line.contains(flag) && line.contains("> 0"), "{line}");
        }
    }

    #[test]
    fn the_token_comes_from_the_file_or_the_environment_and_bad_ones_are_refused() {
        use std::env::VarError;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let path = file.display().to_string();
        let token = |args: &[&str], env| job_token(&parse(args).unwrap(), env);
        assert_eq!(token(&[], Err(VarError::NotPresent)), Ok(None));
        assert_eq!(token(&[], Ok("from-env".into())), Ok(Some(b"from-env".to_vec())));
        assert_eq!(token(&["--token-file", &path], Ok("from-env".into())), Ok(Some(b"from-file".to_vec())));
        let missing = dir.path().join("missing").display().to_string();
        let e = token(&["--token-file", &missing], Err(VarError::NotPresent)).unwrap_err();
        assert!(e.starts_with("'--token-file=") && e.contains("cannot read") && !e.contains('\n'), "{e}");
        let e = token(&[], Ok(" ".into())).unwrap_err();
        assert!(e.contains(TOKEN_ENV) && e.contains("empty"), "{e}");
        let e = token(&[], Err(VarError::NotUnicode(std::ffi::OsString::from("x")))).unwrap_err();
        assert!(e.contains(TOKEN_ENV) && e.contains("UTF-8"), "{e}");
    }

    #[test]
    fn limits_follow_the_flags_and_the_open_file_limit() {
        let config = |args: &[&str], limit| server_config(&parse(args).unwrap(), limit);
        let c = config(&[], 20000).unwrap();
        assert_eq!((c.max_connections, c.max_buffered_bytes), (16384, 256 << 20));
        assert_eq!(config(&[], 1024).unwrap().max_connections, 512);
        let c = config(&["--max-frame-bytes", "1000", "--max-connections", "10"], 1024).unwrap();
        assert_eq!((c.max_frame_bytes, c.max_connections, c.max_buffered_bytes), (1000, 10, 4000));
        let e = config(&["--max-connections", "16384"], 1024).unwrap_err();
        assert!(e.contains("'--max-connections'") && e.contains("1024"), "{e}");
        let e = config(&["--max-frame-bytes", "1000", "--max-buffered-bytes", "1999"], 1024).unwrap_err();
        assert!(e.contains("'--max-buffered-bytes'") && e.contains("2000"), "{e}");
    }
}
