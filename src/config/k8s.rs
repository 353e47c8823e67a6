//! `--rdzv-backend k8s` (or `kubernetes`): the rendezvous in the Kubernetes API server. No endpoint: as
//! `kubectl`, a kubeconfig from `KUBECONFIG` or `~/.kube/config`, else the pod's service account. An
//! endpoint: the path of a kubeconfig. `--rdzv-conf namespace=` overrides the namespace (else the pod's, or
//! the kubeconfig context's). `POD_NAME` (the downward API's `metadata.name`) names the agent's pod, whose
//! controller then owns the job's objects.

use std::path::PathBuf;

use super::RdzvConf;
use super::{bad, ConfigError};
use crate::store::k8s::{Credentials, KubeOptions};

/// Where the API server is, as the command line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeTarget {
    pub credentials: Credentials,
    pub namespace: Option<String>,
    /// The agent's pod, from `POD_NAME`.
    pub pod: Option<String>,
}

/// The agent's pod as `POD_NAME` names it (unset: none); a value that is no pod's name is refused.
pub fn pod_name(env: Result<String, std::env::VarError>) -> Result<Option<String>, ConfigError> {
    let valid = |s: &str| {
        !s.is_empty() && s.len() <= 253 && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    let name = match env {
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Ok(name) if valid(&name) => return Ok(Some(name)),
        Ok(name) => name,
        Err(std::env::VarError::NotUnicode(name)) => name.to_string_lossy().into_owned(),
    };
    Err(bad(format!("POD_NAME={name:?}: a pod's name is a-z, 0-9, '-' and '.', at most 253 (set it from the downward API's metadata.name)")))
}

/// The target of `--rdzv-endpoint` (a kubeconfig's path, which must exist), `--rdzv-conf namespace=` and
/// the agent's pod.
pub fn target(endpoint: &str, conf: &RdzvConf, pod: Option<String>) -> Result<KubeTarget, ConfigError> {
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
    Ok(KubeTarget { credentials, namespace: conf.namespace.clone(), pod })
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
/// `read_timeout`, its objects owned by its pod's controller but the lemon memory.
pub fn options(target: &KubeTarget, run_id: &str, node_id: &str, max_nodes: u32, rdzv: &RdzvConf) -> KubeOptions {
    let job = format!("{}{run_id}/", crate::rendezvous::KEY_PREFIX);
    KubeOptions {
        credentials: target.credentials.clone(),
        namespace: target.namespace.clone(),
        session_key: Some(format!("{job}hb/{node_id}")),
        holder: node_id.to_string(),
        lease_ttl: super::session_ttl(rdzv.keep_alive_interval, rdzv.keep_alive_max_attempt),
        request_timeout: rdzv.read_timeout,
        peers: max_nodes,
        pod: target.pod.clone(),
        unowned: format!("{job}{}", crate::rendezvous::CULPRITS),
        job,
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
        assert_eq!(target("", &conf(None), None).unwrap().credentials, Credentials::Inferred);
        assert_eq!(target(&path, &conf(Some("team-a")), Some("w-0".into())).unwrap(), KubeTarget {
            credentials: Credentials::Kubeconfig(file.path().to_path_buf()),
            namespace: Some("team-a".into()),
            pod: Some("w-0".into()),
        });
        let bad_cases = [("/no/such/kubeconfig", None), ("", Some("Team_A")), ("", Some("-a"))];
        for (endpoint, ns) in bad_cases {
            let e = target(endpoint, &conf(ns), None).unwrap_err().to_string();
            assert!(e.contains("--rdzv-endpoint") || e.contains("namespace="), "{endpoint} {ns:?}: {e}");
        }
    }

    #[test]
    fn the_pod_is_named_by_pod_name_or_refused_in_one_line() {
        use std::env::VarError;
        assert_eq!(pod_name(Err(VarError::NotPresent)).unwrap(), None);
        assert_eq!(pod_name(Ok("train-worker-0-x7k2p".into())).unwrap().as_deref(), Some("train-worker-0-x7k2p"));
        for bad_name in ["", "Worker_0", "a b"] {
            let e = pod_name(Ok(bad_name.into())).unwrap_err().to_string();
            assert!(e.contains("POD_NAME") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_session_is_the_heartbeat_and_lasts_the_missed_beats() {
        let t = KubeTarget { credentials: Credentials::InCluster, namespace: None, pod: Some("w-0".into()) };
        let o = options(&t, "job1", "host_12_0", 8, &RdzvConf::default());
        assert_eq!(o.job, "muster/job1/");
        assert_eq!((o.pod.as_deref(), o.unowned.as_str()), (Some("w-0"), "muster/job1/culprits/"));
        assert_eq!(o.session_key.as_deref(), Some("muster/job1/hb/host_12_0"));
        assert_eq!(o.lease_ttl, std::time::Duration::from_secs(15));
        assert_eq!(o.peers, 8);
    }
}
