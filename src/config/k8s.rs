//! `--rdzv-backend k8s` (or `kubernetes`): the rendezvous in the Kubernetes API server. No endpoint: as
//! `kubectl`, a kubeconfig from `KUBECONFIG` or `~/.kube/config`, else the pod's service account. An
//! endpoint: the path of a kubeconfig. `--rdzv-conf namespace=` overrides the namespace (else the pod's, or
//! the kubeconfig context's).

use std::path::PathBuf;

use super::RdzvConf;
use super::{bad, ConfigError};
use crate::store::k8s::{Credentials, KubeOptions};

/// Where the API server is, as the command line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeTarget {
    pub credentials: Credentials,
    pub namespace: Option<String>,
}

/// The target of `--rdzv-endpoint` (a kubeconfig's path, which must exist) and `--rdzv-conf namespace=`.
pub fn target(endpoint: &str, conf: &RdzvConf) -> Result<KubeTarget, ConfigError> {
    let credentials = match endpoint.trim() {
        "" => Credentials::Inferred,
        path if PathBuf::from(path).is_file() => Credentials::Kubeconfig(PathBuf::from(path)),
        path => {
            return Err(bad(format!(
                "'--rdzv-endpoint {path}': with --rdzv-backend k8s the endpoint is a kubeconfig file, and there is none \
                 there; leave it empty in a pod (its service account) or to use KUBECONFIG or ~/.kube/config"
            )))
        }
    };
    if let Some(ns) = &conf.namespace {
        if !is_dns_label(ns) {
            return Err(bad(format!("'--rdzv-conf namespace={ns}': a namespace is a DNS label: a-z, 0-9 and '-', at most 63")));
        }
    }
    Ok(KubeTarget { credentials, namespace: conf.namespace.clone() })
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The agent's store handle: its job's keys under `muster/<run id>/`, its session the object of its
/// heartbeat key, a node killed gone after its heartbeats would have missed, every request bounded by
/// `read_timeout`.
pub fn options(target: &KubeTarget, run_id: &str, node_id: &str, max_nodes: u32, rdzv: &RdzvConf) -> KubeOptions {
    let job = format!("{}{run_id}/", crate::rendezvous::KEY_PREFIX);
    KubeOptions {
        credentials: target.credentials.clone(),
        namespace: target.namespace.clone(),
        session_key: Some(format!("{job}hb/{node_id}")),
        job,
        holder: node_id.to_string(),
        lease_ttl: super::session_ttl(rdzv.keep_alive_interval, rdzv.keep_alive_max_attempt),
        request_timeout: rdzv.read_timeout,
        peers: max_nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_kubeconfig_or_nothing_and_the_namespace_a_label() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_string_lossy().into_owned();
        let conf = |ns: Option<&str>| RdzvConf { namespace: ns.map(str::to_string), ..RdzvConf::default() };
        assert_eq!(target("", &conf(None)).unwrap().credentials, Credentials::Inferred);
        assert_eq!(target(&path, &conf(Some("team-a"))).unwrap(), KubeTarget {
            credentials: Credentials::Kubeconfig(file.path().to_path_buf()),
            namespace: Some("team-a".into()),
        });
        let bad_cases = [("/no/such/kubeconfig", None), ("", Some("Team_A")), ("", Some("-a"))];
        for (endpoint, ns) in bad_cases {
            let e = target(endpoint, &conf(ns)).unwrap_err().to_string();
            assert!(e.contains("--rdzv-endpoint") || e.contains("namespace="), "{endpoint} {ns:?}: {e}");
        }
    }

    #[test]
    fn the_session_is_the_heartbeat_and_lasts_the_missed_beats() {
        let t = KubeTarget { credentials: Credentials::InCluster, namespace: None };
        let o = options(&t, "job1", "host_12_0", 8, &RdzvConf::default());
        assert_eq!(o.job, "muster/job1/");
        assert_eq!(o.session_key.as_deref(), Some("muster/job1/hb/host_12_0"));
        assert_eq!(o.lease_ttl, std::time::Duration::from_secs(15));
        assert_eq!(o.peers, 8);
    }
}
