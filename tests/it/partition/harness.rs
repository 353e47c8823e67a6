//! The harness itself (tests/it/common/netns.rs), before any scenario relies on it.

use std::time::{Duration, Instant};

use crate::common::netns::Net;
use crate::common::{alive, eventually};
use super::serial;

/// The harness itself: a cut host really cannot reach the others (and they cannot reach it) until healed,
/// an inbound cut lets its packets out only, a link down and loss do what they say, processes started in a
/// host are in its namespace and die with the net, and nothing is left behind.
#[test]
fn a_cut_host_cannot_reach_the_others_until_healed() {
    let _serial = serial();
    let net = Net::new(3);
    let prefix = net.prefix().to_string();
    let listeners: Vec<std::net::TcpListener> = (0..3).map(|i| net.host(i).listen(7000)).collect();
    let to = |i: usize| net.host(i).socket(7000);
    let short = Duration::from_secs(1);
    let reach = |from: usize, to_host: usize| net.host(from).connect(to(to_host), short);
    for (a, b) in [(1, 0), (2, 0), (0, 2), (2, 1)] {
        reach(a, b).unwrap_or_else(|e| panic!("host {a} cannot reach host {b} before any fault: {e}"));
    }
    // Loopback works in every host; no host reaches the root namespace's loopback services by address.
    net.host(2).connect(std::net::SocketAddr::from(([127, 0, 0, 1], 9)), short).expect_err("nothing listens on lo:9");

    let silent = |r: std::io::Result<std::net::TcpStream>, what: &str| match r {
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(e) => panic!("{what}: failed loudly ({e}); a silent cut only times out"),
        Ok(_) => panic!("{what}: connected through the fault"),
    };
    net.cut(2);
    let t = Instant::now();
    silent(reach(2, 0), "host 2 -> host 0 while cut");
    assert!(t.elapsed() >= Duration::from_millis(900), "the connect did not wait for its timeout");
    silent(reach(0, 2), "host 0 -> host 2 while cut");
    silent(reach(1, 2), "host 1 -> host 2 while cut");
    reach(1, 0).expect("hosts 1 and 0 still reach each other while host 2 is cut");
    net.heal();
    assert!(eventually(Duration::from_secs(5), || reach(2, 0).is_ok()), "host 2 -> host 0 after heal");
    reach(0, 2).expect("host 0 -> host 2 after heal");

    // Inbound only: host 2's datagrams arrive, the ones to it do not.
    let udp = |i: usize| net.host(i).run(move || std::net::UdpSocket::bind(("0.0.0.0", 7001)).unwrap());
    let (u0, u2) = (udp(0), udp(2));
    for s in [&u0, &u2] {
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    }
    net.cut_inbound(2);
    u2.send_to(b"out", net.host(0).socket(7001)).unwrap();
    let mut buf = [0u8; 16];
    let got = u0.recv_from(&mut buf).map(|(n, _)| buf[..n].to_vec());
    assert_eq!(got.ok().as_deref(), Some(&b"out"[..]), "host 2's datagram did not reach host 0 under an inbound cut");
    u0.send_to(b"in", net.host(2).socket(7001)).unwrap();
    assert!(u2.recv_from(&mut buf).is_err(), "a datagram reached host 2 under an inbound cut");
    silent(reach(2, 0), "host 2 -> host 0 under an inbound cut (the SYN-ACK is dropped)");
    net.heal();

    // Loss of 1 in 2 each way: about half of host 2's datagrams arrive, and the counters show the drops.
    net.loss(2, 2);
    u0.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut received = 0;
    // In batches, drained in between, so that the receive buffer never overflows.
    for _ in 0..8 {
        for _ in 0..50 {
            u2.send_to(b"x", net.host(0).socket(7001)).unwrap();
        }
        while u0.recv_from(&mut buf).is_ok() {
            received += 1;
        }
    }
    assert!((100..=300).contains(&received), "{received} of 400 datagrams arrived with 1-in-2 loss\n{}", net.ruleset());
    assert!(net.dropped() >= 100, "the loss rules counted {} drops\n{}", net.dropped(), net.ruleset());
    net.heal();

    // A link down: no carrier, nothing passes; up again after heal.
    net.link_down(2);
    assert!(reach(2, 0).is_err(), "host 2 -> host 0 with its link down");
    net.heal();
    assert!(eventually(Duration::from_secs(5), || reach(2, 0).is_ok()), "host 2 -> host 0 after the link is up");

    // A process started in a host is in that host's network namespace and is killed with the net.
    let mut child = net.host(1).command("sleep").arg("600").spawn().unwrap();
    let pid = child.id() as i32;
    assert!(eventually(Duration::from_secs(5), || net.pids().contains(&pid)), "sleep is not in the net: {:?}", net.pids());
    drop(listeners);
    drop(net);
    assert!(!alive(pid), "a process in a host outlived the net");
    let _ = child.wait();
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|n| !n.starts_with(&format!("{prefix}-"))), "namespaces left behind: {left:?}");
}
