//! A one-member etcd on loopback, for `muster bench rendezvous --backend etcd` and the tests: the member's
//! command line, with its own data directory and ports, quiet.

use std::path::Path;
use std::process::{Command, Stdio};

/// `binary` as a cluster of one member `name`, its data under `data`, serving clients on `client` and its
/// (unused) peer URL on `peer`, both on 127.0.0.1.
pub fn one_member(binary: &Path, name: &str, data: &Path, client: u16, peer: u16) -> Command {
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let mut cmd = Command::new(binary);
    cmd.args(["--name", name, "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", &url(client), "--advertise-client-urls", &url(client)])
        .args(["--listen-peer-urls", &url(peer), "--initial-advertise-peer-urls", &url(peer)])
        .args(["--initial-cluster", &format!("{name}={}", url(peer)), "--log-level", "error"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}
