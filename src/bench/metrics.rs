//! What the store's server counted itself, read from its Prometheus `/metrics`: requests by method (etcd's
//! gRPC method, the API server's verb on Leases), the writes among them, and the watch events it sent. The
//! bench reads them before and after each phase; the difference is the phase's load on the server.

use std::collections::BTreeMap;

use serde::Serialize;

/// The server's own counts at one moment, or between two.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(super) struct ServerCounts {
    /// Requests by method: etcd's `grpc_server_msg_received_total` (a unary call, or a message on a
    /// stream), the API server's `apiserver_request_total` on Leases (a watch counted when it ends).
    pub(super) requests_by_method: BTreeMap<String, u64>,
    /// Watch events sent: etcd's watch responses (`grpc_server_msg_sent_total` of `Watch`, each of which
    /// may carry several events), the API server's `apiserver_watch_events_total` of Leases.
    pub(super) watch_events: u64,
}

impl ServerCounts {
    pub(super) fn requests(&self) -> u64 {
        self.requests_by_method.values().sum()
    }

    /// The requests that change the store.
    pub(super) fn writes(&self) -> u64 {
        self.requests_by_method.iter().filter(|(m, _)| is_write(m)).map(|(_, n)| n).sum()
    }

    /// What happened between `earlier` and this reading (methods that did not occur left out).
    pub(super) fn since(&self, earlier: &ServerCounts) -> ServerCounts {
        let requests_by_method = self
            .requests_by_method
            .iter()
            .map(|(m, &n)| (m.clone(), n.saturating_sub(earlier.requests_by_method.get(m).copied().unwrap_or(0))))
            .filter(|&(_, n)| n > 0)
            .collect();
        ServerCounts { requests_by_method, watch_events: self.watch_events.saturating_sub(earlier.watch_events) }
    }

    pub(super) fn add(&mut self, other: &ServerCounts) {
        other.requests_by_method.iter().for_each(|(m, n)| *self.requests_by_method.entry(m.clone()).or_insert(0) += n);
        self.watch_events += other.watch_events;
    }
}

/// A write: etcd's `Put`, `Txn` (a compare-and-set counts, whether or not it wins), `DeleteRange` and
/// lease calls; the API server's `POST`, `PUT`, `PATCH`, `DELETE` and `DELETECOLLECTION`.
fn is_write(method: &str) -> bool {
    matches!(
        method,
        "Put" | "Txn" | "DeleteRange" | "LeaseGrant" | "LeaseRevoke" | "LeaseKeepAlive" | "POST" | "PUT" | "PATCH" | "DELETE"
            | "DELETECOLLECTION"
    )
}

/// The sum of counter `metric` by the value of label `by`, over the samples whose labels include every
/// `(name, value)` of `only`, in Prometheus text. Samples without `by` are left out.
pub(super) fn summed(text: &str, metric: &str, by: &str, only: &[(&str, &str)]) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric).and_then(|r| r.strip_prefix('{')) else { continue };
        let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
        let label = |name: &str| labels.split(',').find_map(|l| l.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'));
        if !only.iter().all(|(name, want)| label(name) == Some(want)) {
            continue;
        }
        // Counters are printed as floats ("1e+06" past a million).
        let count = value.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
        if let (Some(key), Some(count)) = (label(by), count) {
            *sums.entry(key.to_string()).or_insert(0) += count as u64;
        }
    }
    sums
}

/// The API server's counts of Lease requests by verb and of Lease watch events.
pub(super) fn api_server_leases(text: &str) -> ServerCounts {
    let leases = [("group", "coordination.k8s.io"), ("resource", "leases")];
    let requests_by_method = summed(text, "apiserver_request_total", "verb", &leases);
    let watch_events = summed(text, "apiserver_watch_events_total", "resource", &leases).values().sum();
    ServerCounts { requests_by_method, watch_events }
}

/// etcd's counts: messages received by method, and the watch responses it sent.
pub(super) fn etcd(text: &str) -> ServerCounts {
    let requests_by_method = summed(text, "grpc_server_msg_received_total", "grpc_method", &[]);
    let watch_events = summed(text, "grpc_server_msg_sent_total", "grpc_method", &[("grpc_method", "Watch")]).values().sum();
    ServerCounts { requests_by_method, watch_events }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
    }

    #[test]
    fn etcd_requests_are_summed_by_method_and_anything_else_is_left_out() {
        let text = "# HELP grpc_server_msg_received_total Total number of RPC stream messages received on the server.\n\
            grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
            grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
            grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1.5e+06\n\
            grpc_server_msg_received_total{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 0\n\
            grpc_server_msg_received_total{grpc_service=\"etcdserverpb.KV\"} 7\n\
            grpc_server_msg_received_total{grpc_method=\"Watch\"} NaN\n\
            grpc_server_msg_sent_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 40\n\
            grpc_server_msg_sent_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 15\n\
            grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\"} 99\n";
        let got = etcd(text);
        assert_eq!(got.requests_by_method, counts(&[("Put", 0), ("Range", 15), ("Txn", 1_500_000)]));
        assert_eq!((got.watch_events, got.writes(), got.requests()), (40, 1_500_000, 1_500_015));
    }

    #[test]
    fn api_server_counts_are_the_leases_by_verb_and_their_watch_events() {
        let text = "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 2\n\
            apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 5\n\
            apiserver_request_total{code=\"409\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 1\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"coordination.k8s.io\",resource=\"leases\",scope=\"resource\",subresource=\"\",verb=\"PATCH\",version=\"v1\"} 7\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"configmaps\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\"} 30\n\
            apiserver_watch_events_total{group=\"coordination.k8s.io\",resource=\"leases\",version=\"v1\"} 9\n\
            apiserver_watch_events_total{group=\"\",resource=\"configmaps\",version=\"v1\"} 4\n";
        let got = api_server_leases(text);
        assert_eq!(got.requests_by_method, counts(&[("LIST", 2), ("PATCH", 7), ("POST", 6)]));
        assert_eq!((got.watch_events, got.writes(), got.requests()), (9, 13, 15));
    }

    #[test]
    fn a_phase_is_the_difference_of_two_readings() {
        let before = ServerCounts { requests_by_method: counts(&[("GET", 3), ("PATCH", 1)]), watch_events: 2 };
        let after = ServerCounts { requests_by_method: counts(&[("GET", 3), ("PATCH", 5), ("POST", 2)]), watch_events: 10 };
        let phase = after.since(&before);
        assert_eq!(phase, ServerCounts { requests_by_method: counts(&[("PATCH", 4), ("POST", 2)]), watch_events: 8 });
        let mut total = phase.clone();
        total.add(&phase);
        assert_eq!((total.requests(), total.writes(), total.watch_events), (12, 12, 16));
    }
}
