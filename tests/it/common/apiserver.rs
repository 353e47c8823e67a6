//! A real Kubernetes API server on loopback for integration tests, run by `scripts/kube/apiserver.py` in
//! front of an etcd 3.5 of its own; stopped and removed on drop, and by a watchdog if the test process dies
//! first. `MUSTER_KUBE_APISERVER` and `MUSTER_ETCD_35` name the binaries; a missing one fails the test (never
//! skips) with a line naming the `scripts/lib.sh` function that provides it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::netns::Host;
use super::run;

/// Bounds every call of the script; its own readiness deadline is 60 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

/// Who an agent signs in as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum User {
    /// The service account `default/muster`, which packaging/k8s/rbac.yaml binds (once granted).
    Agent,
    /// No role at all.
    Nobody,
}

pub struct KubeServer<'n> {
    dir: tempfile::TempDir,
    state: Value,
    /// The network namespace host it runs on (None: this machine's loopback).
    host: Option<Host<'n>>,
}

fn binary(var: &str, ensure: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run `source scripts/lib.sh; {ensure}` (scripts/test.sh does)"))
}

impl KubeServer<'static> {
    /// Ready on loopback, with packaging/k8s/rbac.yaml granted in namespace `default`.
    pub fn start() -> KubeServer<'static> {
        KubeServer::start_at(None)
    }
}

impl<'n> KubeServer<'n> {
    /// As [`KubeServer::start`], on network namespace host `host` at its address (agents on the other hosts
    /// reach it over the bridge).
    pub fn on(host: Host<'n>) -> KubeServer<'n> {
        KubeServer::start_at(Some(host))
    }

    fn start_at(host: Option<Host<'n>>) -> KubeServer<'n> {
        let dir = tempfile::Builder::new().prefix("muster-kube-").tempdir().expect("temp dir for the API server");
        let (apiserver, etcd) = (binary("MUSTER_KUBE_APISERVER", "ensure_kube_apiserver"), binary("MUSTER_ETCD_35", "ensure_etcd35"));
        let bind = host.map_or_else(|| "127.0.0.1".to_string(), |h| h.addr());
        let mut server = KubeServer { state: Value::Null, dir, host };
        let out = run(
            server
                .script()
                .args(["start", "--apiserver", &apiserver, "--etcd", &etcd, "--bind", &bind])
                .args(["--owner", &std::process::id().to_string(), "--dir"])
                .arg(server.path()),
            SCRIPT_DEADLINE,
        );
        assert!(out.status.success(), "the API server did not start:\n{}", out.stderr);
        server.state = serde_json::from_str(&out.stdout).expect("apiserver.py prints its state");
        server.create(&Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/k8s/rbac.yaml"));
        server
    }

    /// `python3 scripts/kube/apiserver.py`, on the server's host.
    fn script(&self) -> Command {
        let mut cmd = match &self.host {
            Some(host) => host.command("python3"),
            None => Command::new("python3"),
        };
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kube/apiserver.py"));
        cmd
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("server")
    }

    fn call(&self, args: &[&str]) -> String {
        let out = run(self.script().args(args).arg("--dir").arg(self.path()), SCRIPT_DEADLINE);
        assert!(out.status.success(), "apiserver.py {}: {}", args[0], out.stderr);
        out.stdout
    }

    /// The rendezvous key of every Lease of muster's in namespace `default`, sorted.
    pub fn keys(&self) -> Vec<String> {
        self.call(&["keys"]).lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
    }

    /// Every key of [`Self::keys`] with its owners (`Kind/name`, comma separated; `-` for none).
    pub fn owners(&self) -> Vec<(String, String)> {
        let listed = self.call(&["keys", "--owners"]);
        listed.lines().filter_map(|l| l.split_once('\t')).map(|(k, o)| (k.to_string(), o.to_string())).collect()
    }

    /// Creates, as admin, each object of the YAML manifest at `manifest` in namespace `default`.
    pub fn create(&self, manifest: &Path) {
        self.call(&["grant", "--manifest", &manifest.to_string_lossy()]);
    }

    /// The kubeconfig an agent of `user` is given as `--rdzv-endpoint`.
    pub fn kubeconfig(&self, user: User) -> PathBuf {
        let name = match user {
            User::Agent => "agent",
            User::Nobody => "nobody",
        };
        PathBuf::from(self.state["kubeconfig"][name].as_str().expect("a kubeconfig per user"))
    }

    /// SIGKILL and a start on the same port and etcd: the control plane restarted.
    pub fn restart(&self) {
        self.call(&["restart"]);
    }
}

impl Drop for KubeServer<'_> {
    fn drop(&mut self) {
        let _ = run(self.script().arg("stop").arg("--dir").arg(self.path()), SCRIPT_DEADLINE);
    }
}
