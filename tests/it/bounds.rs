//! Resource bounds as an overloaded cluster sees them: with the soft open-file limit at 1024, thousands
//! of idle connections to a job's rendezvous port or to `muster store` neither stop a crashed group from
//! restarting nor lock out a torch client, and the process's memory stays small.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{fixture, lines_of, muster, python, wait_for_lines, Guard};

const IDLE: usize = 5000;
/// A generous bound on the muster process's peak RSS with `IDLE` idle connections (measured: see the test
/// output; idle connections hold no buffers, only their task and socket).
const PEAK_RSS_KIB: u64 = 64 << 10;

/// Starts `cmd` with the soft open-file limit at 1024 (the hard limit as it is), as on a default Linux login.
fn with_soft_fd_limit_1024(cmd: &mut Command) -> &mut Command {
    // SAFETY: getrlimit/setrlimit are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = 1024.min(limit.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// `n` connections that never send a byte.
fn idle_connections(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n).map(|i| TcpStream::connect(addr).unwrap_or_else(|e| panic!("idle connection {i}: {e}"))).collect()
}

/// Every one of `conns` is closed by the server (end of stream or reset) within the deadline.
fn all_closed_by_the_server(conns: Vec<TcpStream>) -> usize {
    let mut closed = 0;
    for mut conn in conns {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        match conn.read(&mut [0u8; 1]) {
            Ok(0) => closed += 1,
            Err(e) if !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => closed += 1,
            _ => {}
        }
    }
    closed
}

/// The peak resident set size of `pid` in KiB (`VmHWM`).
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc status")
}


/// The first line of `lines` containing `needle`, within a minute.
fn line_with(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("no line with {needle:?} ({e})"));
        if line.contains(needle) {
            return line;
        }
    }
}

#[test]
fn idle_connections_to_the_rendezvous_port_do_not_stop_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = muster();
    cmd.args(["--standalone", "--nproc-per-node=2", "--max-restarts=1"])
        .arg(fixture("worker.py"))
        .arg(dir.path())
        .arg("sleep")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut agent = Guard::spawn(with_soft_fd_limit_1024(&mut cmd));
    let stderr = lines_of(agent.0.stderr.take().expect("stderr"));
    let banner = line_with(&stderr, "rdzv_store=");
    let addr: SocketAddr = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("rdzv_store="))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no rendezvous address in {banner:?}"));
    let starts = dir.path().join("starts");
    let first = wait_for_lines(&starts, 2, Duration::from_secs(60));
    let idle = idle_connections(addr, IDLE);
    let rank1: i32 = first
        .lines()
        .find(|l| l.starts_with("1 0 "))
        .and_then(|l| l.split_whitespace().nth(2)?.parse().ok())
        .expect("rank 1 started");
    // SAFETY: plain kill(2) of our own worker.
    unsafe { libc::kill(rank1, libc::SIGKILL) };
    let all = wait_for_lines(&starts, 4, Duration::from_secs(60));
    for rank in 0..2 {
        assert!(all.lines().any(|l| l.starts_with(&format!("{rank} 1 "))), "rank {rank} restarted: {all}");
    }
    // The connections that never sent VALIDATE were closed at the handshake deadline.
    assert_eq!(all_closed_by_the_server(idle), IDLE);
    let peak = peak_rss_kib(agent.pid());
    println!("agent peak RSS with {IDLE} idle connections and a restart: {peak} KiB");
    assert!(peak < PEAK_RSS_KIB, "agent peak RSS {peak} KiB >= {PEAK_RSS_KIB} KiB");
}

/// A torch client that imports torch, says `ready`, then on a line on stdin sets and reads back a key.
const TORCH_CLIENT: &str = r#"
import sys
from datetime import timedelta
from torch.distributed import TCPStore
print("ready", flush=True)
sys.stdin.readline()
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=30))
store.set("bounds", "served")
print("got", store.get("bounds").decode(), flush=True)
"#;

#[test]
fn idle_connections_to_muster_store_do_not_lock_out_a_torch_client() {
    let mut cmd = muster();
    cmd.args(["store", "--host", "127.0.0.1", "--port", "0"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut store = Guard::spawn(with_soft_fd_limit_1024(&mut cmd));
    let stdout = lines_of(store.0.stdout.take().expect("stdout"));
    let listening = line_with(&stdout, "listening on");
    let addr: SocketAddr = listening.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("address");
    let mut client = Command::new(python());
    client.arg("-c").arg(TORCH_CLIENT).arg(addr.port().to_string()).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut client = Guard::spawn(&mut client);
    let replies = lines_of(client.0.stdout.take().expect("client stdout"));
    line_with(&replies, "ready");
    let idle = idle_connections(addr, IDLE);
    client.0.stdin.take().expect("client stdin").write_all(b"go\n").unwrap();
    assert_eq!(line_with(&replies, "got"), "got served");
    assert_eq!(all_closed_by_the_server(idle), IDLE);
    let peak = peak_rss_kib(store.pid());
    println!("muster store peak RSS with {IDLE} idle connections: {peak} KiB");
    assert!(peak < PEAK_RSS_KIB, "muster store peak RSS {peak} KiB >= {PEAK_RSS_KIB} KiB");
}
