//! A real kube-apiserver on loopback for tests, in front of an etcd 3.5 of its own, run by
//! `scripts/kube/apiserver.py` (a watchdog stops it if the test process dies first): `MUSTER_KUBE_APISERVER`
//! and `MUSTER_ETCD_35` name the binaries (scripts/lib.sh's `ensure_kube_apiserver` and `ensure_etcd35`). A
//! missing binary fails the test, never skips it. Three users: `admin` (system:masters), `agent` (the service
//! account `default/muster`, granted packaging/k8s/rbac.yaml by [`TestKube::grant`]) and `nobody`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{Credentials, KubeOptions, KubeStore};

/// Who a handle signs in as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    Agent,
    Nobody,
}

impl User {
    fn name(self) -> &'static str {
        match self {
            User::Agent => "agent",
            User::Nobody => "nobody",
        }
    }
}

pub struct TestKube {
    dir: tempfile::TempDir,
    state: serde_json::Value,
}

fn script(args: &[&str]) -> std::process::Output {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kube/apiserver.py");
    Command::new("python3").arg(path).args(args).output().expect("python3 runs scripts/kube/apiserver.py")
}

fn binary(var: &str, how: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run `source scripts/lib.sh; {how}` (scripts/test.sh does)"))
}

impl TestKube {
    /// Started and ready.
    pub fn start() -> TestKube {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = dir.path().join("k");
        let (apiserver, etcd) = (binary("MUSTER_KUBE_APISERVER", "ensure_kube_apiserver"), binary("MUSTER_ETCD_35", "ensure_etcd35"));
        let owner = std::process::id().to_string();
        let out = script(&["start", "--dir", &server.to_string_lossy(), "--apiserver", &apiserver, "--etcd", &etcd, "--owner", &owner]);
        assert!(out.status.success(), "apiserver.py start: {}", String::from_utf8_lossy(&out.stderr));
        let state = serde_json::from_slice(&out.stdout).expect("apiserver.py prints its state");
        TestKube { dir, state }
    }

    fn server_dir(&self) -> PathBuf {
        self.dir.path().join("k")
    }

    /// The API server SIGKILLed and started again on the same port and etcd: a control plane's restart.
    pub fn restart(&self) {
        let out = script(&["restart", "--dir", &self.server_dir().to_string_lossy()]);
        assert!(out.status.success(), "apiserver.py restart: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The kubeconfig of `user` (namespace `default`).
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        PathBuf::from(self.state["kubeconfig"][user.name()].as_str().expect("a kubeconfig per user"))
    }

    /// Creates packaging/k8s/rbac.yaml as shipped (the service account `default/muster`, which the agent
    /// user is, its Role and RoleBinding).
    pub fn grant(&self) {
        self.create(&Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/k8s/rbac.yaml"));
    }

    /// Creates, as admin, each object of the YAML manifest at `manifest` in namespace `default`.
    pub fn create(&self, manifest: &Path) {
        let out = script(&["grant", "--dir", &self.server_dir().to_string_lossy(), "--manifest", &manifest.to_string_lossy()]);
        assert!(out.status.success(), "apiserver.py grant: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn options(&self, user: User, namespace: &str, job: &str) -> KubeOptions {
        KubeOptions {
            credentials: Credentials::Kubeconfig(self.kubeconfig(user)),
            namespace: Some(namespace.to_string()),
            job: job.to_string(),
            session_key: None,
            holder: "test".into(),
            lease_ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            peers: 2,
            pod: None,
            // The tests' keys are not under the job's prefix.
            unowned: "culprits/".into(),
        }
    }

    /// A handle of the agent user in namespace `default` (granted by the caller).
    pub async fn store(&self, job: &str) -> KubeStore {
        KubeStore::connect(&self.options(User::Agent, "default", job), Duration::from_secs(20)).await.expect("the API server answers")
    }
}

impl Drop for TestKube {
    fn drop(&mut self) {
        let _ = script(&["stop", "--dir", &self.server_dir().to_string_lossy()]);
    }
}

impl KubeStore {
    /// As a SIGKILLed agent: its session neither renewed nor deleted from now on.
    pub(crate) fn vanish(self) {
        self.reaper.abort();
        self.session.halt();
        std::mem::forget(self);
    }
}
