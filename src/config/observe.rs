//! `--metrics-port`, `--metrics-host`, `--event-log` and `--event-log-handler`, typed once.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::{bad, ConfigError};
use crate::cli::Cli;

/// `--metrics-host`/`--metrics-port`, `--event-log`, `--event-log-handler`, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObserveConfig {
    pub metrics: Option<SocketAddr>,
    pub event_log: Option<PathBuf>,
    pub console_events: bool,
}

pub fn from_cli(cli: &Cli) -> Result<ObserveConfig, ConfigError> {
    let host = match (cli.metrics_host.as_deref().map(str::trim), cli.metrics_port) {
        (Some(h), None) => {
            return Err(bad(format!("'--metrics-host {h}' needs '--metrics-port PORT' (0 lets the kernel pick one)")))
        }
        (Some(h), Some(_)) => {
            let ip = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h);
            ip.parse::<IpAddr>().map_err(|_| {
                bad(format!("invalid value '{h}' for '--metrics-host': give an IP address to listen on (127.0.0.1, 0.0.0.0, ::1)"))
            })?
        }
        (None, _) => IpAddr::from([127, 0, 0, 1]),
    };
    let event_log = match cli.event_log.as_deref() {
        Some(p) if p.trim().is_empty() => {
            return Err(bad("invalid value '' for '--event-log': give the path of a file to append events to"))
        }
        Some(p) => Some(PathBuf::from(p)),
        None => None,
    };
    Ok(ObserveConfig {
        metrics: cli.metrics_port.map(|port| SocketAddr::new(host, port)),
        event_log,
        console_events: cli.event_log_handler == "console",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(args: &[&str]) -> Result<ObserveConfig, ConfigError> {
        let argv: Vec<String> = std::iter::once("muster").chain(args.iter().copied()).map(String::from).collect();
        from_cli(&crate::cli::parse(&argv).unwrap())
    }

    #[test]
    fn metrics_listen_on_loopback_unless_told() {
        assert_eq!(observe(&["x.py"]).unwrap(), ObserveConfig::default());
        assert_eq!(observe(&["--metrics-port", "0", "x.py"]).unwrap().metrics, Some("127.0.0.1:0".parse().unwrap()));
        let any = observe(&["--metrics-port=9400", "--metrics-host=[::]", "x.py"]).unwrap();
        assert_eq!(any.metrics, Some("[::]:9400".parse().unwrap()));
        let both = observe(&["--event-log=/tmp/e.jsonl", "--event-log-handler=console", "x.py"]).unwrap();
        assert_eq!((both.event_log, both.console_events), (Some(PathBuf::from("/tmp/e.jsonl")), true));
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--metrics-port=1", "--metrics-host=node-a", "x.py"][..], "--metrics-host"),
            (&["--metrics-host=0.0.0.0", "x.py"][..], "--metrics-port"),
            (&["--event-log=", "x.py"][..], "--event-log"),
        ] {
            let e = observe(args).unwrap_err().to_string();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }
}
