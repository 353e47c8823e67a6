//! How many simulated nodes this host can hold: each node is one connection, so one descriptor in the bench
//! and one in its store, and one local port of loopback's ephemeral range (every connection goes to the same
//! address, so the source port alone tells them apart). Checked before anything starts: past either limit
//! connects would fail and be retried until the timeout.

use crate::limits;

/// Store connections beyond one a node: a node's reconnect overlapping its old connection's close.
pub(super) const SPARE_CONNECTIONS: usize = 64;

/// Where the kernel says which local ports connects may use.
const PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The limits a run has to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Host {
    /// The open-file limit of this process (raised to the hard limit at start), which the store inherits.
    pub(super) open_files: u64,
    /// How many local ports connects may use; `None` when the kernel did not say.
    pub(super) ephemeral_ports: Option<u64>,
}

impl Host {
    pub(super) fn this() -> Host {
        let ephemeral_ports = match std::fs::read_to_string(PORT_RANGE) {
            Ok(text) => port_count(&text),
            Err(e) => {
                tracing::debug!("cannot read {PORT_RANGE}: {e}; not checking the ephemeral ports");
                None
            }
        };
        Host { open_files: limits::raise_open_files().soft, ephemeral_ports }
    }
}

/// The ports in an `ip_local_port_range` ("LOW HIGH", inclusive); `None` when it is not that.
fn port_count(text: &str) -> Option<u64> {
    let mut bounds = text.split_whitespace().map(str::parse::<u64>);
    match (bounds.next(), bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high)), None) if low <= high => Some(high - low + 1),
        _ => None,
    }
}

/// The store's connection limit for `nodes`, or why the host cannot hold them (one line, naming --nodes).
pub(super) fn max_connections(nodes: u32, host: Host) -> Result<usize, String> {
    let needed = nodes as usize + SPARE_CONNECTIONS;
    let cap = limits::connection_cap(host.open_files);
    if needed > cap {
        return Err(format!(
            "--nodes {nodes} needs {needed} store connections (one a node and {SPARE_CONNECTIONS} spare): the \
             open-file limit is {} and {} are kept for muster's own files, so at most {} nodes fit; raise the hard \
             limit (ulimit -Hn) or use fewer nodes",
            host.open_files,
            limits::headroom(host.open_files),
            cap.saturating_sub(SPARE_CONNECTIONS)
        ));
    }
    match host.ephemeral_ports {
        Some(ports) if nodes as u64 > ports => Err(format!(
            "--nodes {nodes} needs {nodes} loopback connections to one address, but {PORT_RANGE} allows {ports} \
             local ports; widen it or use fewer nodes"
        )),
        _ => Ok(needed),
    }
}

/// Whether `nodes` etcd clients fit this process's open-file limit and loopback's local ports (a started
/// etcd inherits the same limit and holds the other ends), or why not (one line, naming --nodes). A node
/// holds one HTTP/2 connection to each member it has talked to (every request and watch is a stream on it):
/// one, unless it failed over, so `members` a node at most.
pub(super) fn etcd_fits(nodes: u32, members: usize, host: Host) -> Result<(), String> {
    let per = members.max(1);
    clients_fit(nodes, per, &format!("--backend etcd needs up to {} connections ({per} a node, one per member)", nodes as usize * per), host)
}

/// Connections a node of `--backend k8s` holds at most: kube-rs speaks HTTP/1.1, so each watch open at once
/// is a connection (the round's keys, a prefix, a reaper's look), and one more carries the requests.
pub(super) const KUBE_CONNECTIONS_PER_NODE: usize = 4;

/// As [`etcd_fits`] for the API server's clients (the server, on this host or not, holds the other ends).
pub(super) fn kube_fits(nodes: u32, host: Host) -> Result<(), String> {
    let per = KUBE_CONNECTIONS_PER_NODE;
    let needed = nodes as usize * per;
    clients_fit(nodes, per, &format!("--backend k8s needs up to {needed} connections ({per} a node: its requests and watches)"), host)
}

/// Whether `nodes` clients of `per` connections each fit; `needs` says what they need, for the message.
fn clients_fit(nodes: u32, per: usize, needs: &str, host: Host) -> Result<(), String> {
    let needed = nodes as usize * per;
    let cap = limits::connection_cap(host.open_files);
    if needed > cap {
        return Err(format!(
            "--nodes {nodes} with {needs}: the open-file limit is {} and {} are kept for muster's own files, so at \
             most {} nodes fit; raise the hard limit (ulimit -Hn) or use fewer nodes",
            host.open_files,
            limits::headroom(host.open_files),
            cap / per
        ));
    }
    match host.ephemeral_ports {
        Some(ports) if needed as u64 > ports => Err(format!(
            "--nodes {nodes} with {needs}, but {PORT_RANGE} allows {ports} local ports; widen it or use fewer nodes"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_range_is_read_inclusively_and_nothing_else_is_taken_for_one() {
        for (text, count) in [
            ("32768\t60999\n", Some(28232)),
            ("1024 1024", Some(1)),
            ("60999 32768", None),
            ("32768", None),
            ("32768 60999 7", None),
            ("a b", None),
        ] {
            assert_eq!(port_count(text), count, "{text:?}");
        }
    }

    #[test]
    fn nodes_fit_the_descriptors_and_the_ports_or_the_line_says_which_does_not() {
        let host = |open_files, ephemeral_ports| Host { open_files, ephemeral_ports };
        assert_eq!(max_connections(16384, host(20000, Some(28232))), Ok(16448));
        assert_eq!(max_connections(19424, host(20000, None)), Ok(19488));
        let err = max_connections(19425, host(20000, None)).unwrap_err();
        for needle in ["--nodes 19425", "19489 store connections", "limit is 20000", "512 are kept", "at most 19424", "ulimit -Hn"] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let err = max_connections(32768, host(70000, Some(28232))).unwrap_err();
        assert!(err.contains("--nodes 32768") && err.contains("allows 28232 local ports"), "{err}");
        assert!(max_connections(32768, host(20000, Some(28232))).unwrap_err().contains("at most 19424"));
    }

    #[test]
    fn etcd_nodes_fit_their_connections_or_the_line_says_which_does_not() {
        let host = |open_files, ephemeral_ports| Host { open_files, ephemeral_ports };
        assert_eq!(etcd_fits(16384, 1, host(20000, Some(28232))), Ok(()));
        assert_eq!(etcd_fits(4096, 3, host(20000, Some(28232))), Ok(()));
        let most = 19488 / 3;
        assert_eq!(etcd_fits(most, 3, host(20000, None)), Ok(()));
        let err = etcd_fits(most + 1, 3, host(20000, None)).unwrap_err();
        for needle in [format!("--nodes {}", most + 1), "3 a node".into(), "limit is 20000".into(), format!("at most {most} nodes")] {
            assert!(err.contains(&needle), "{needle}: {err}");
        }
        let err = etcd_fits(28232 / 3 + 1, 3, host(1 << 20, Some(28232))).unwrap_err();
        assert!(err.contains("allows 28232 local ports"), "{err}");
    }
}
