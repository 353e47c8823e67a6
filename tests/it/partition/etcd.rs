//! etcd: three members on hosts 0-2 and the agents on hosts 3-5; an agent's host, or the leader's, is cut.

use std::time::Duration;

use serde_json::Value;

use crate::common::{eventually, Guard};
use crate::common::netns::Net;
use super::cut::expect_cut;
use super::job::{Job, Rdzv};
use super::{epoch, scenario, Checks, ETCD_CLIENT_PORT, ETCD_PEER_PORT, FAST};

/// Three etcd 3.4 members, member k (e1..e3) on host `hosts[k-1]`, listening on that host's address.
fn start_etcd(job: &mut Job, hosts: &[usize]) -> Vec<std::net::SocketAddr> {
    let bin = crate::common::etcd::Etcd::V34.binary();
    let peer = |h: usize| format!("http://{}:{ETCD_PEER_PORT}", job.net.host(h).addr());
    let cluster: Vec<String> = hosts.iter().enumerate().map(|(k, &h)| format!("e{}={}", k + 1, peer(h))).collect();
    let cluster = cluster.join(",");
    for (k, &h) in hosts.iter().enumerate() {
        let name = format!("e{}", k + 1);
        let host = job.net.host(h);
        let client = format!("http://{}:{ETCD_CLIENT_PORT}", host.addr());
        let mut cmd = host.command(&bin);
        cmd.args(["--name", &name, "--data-dir"])
            .arg(job.path().join(format!("{name}.data")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer(h), "--initial-advertise-peer-urls", &peer(h)])
            .args(["--initial-cluster", &cluster, "--initial-cluster-token", &job.token])
            .args(["--initial-cluster-state", "new", "--log-level", "warn"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(job.path().join(format!("{name}.log"))).unwrap());
        job.services.push(Guard::spawn(&mut cmd));
    }
    let members: Vec<std::net::SocketAddr> = hosts.iter().map(|&h| job.net.host(h).socket(ETCD_CLIENT_PORT)).collect();
    let ok = eventually(Duration::from_secs(30), || {
        hosts.iter().zip(&members).all(|(&h, &m)| etcd_status(job.net, h, m).is_some_and(|(_, leader)| leader != "0"))
    });
    assert!(ok, "the etcd members did not elect a leader within 30 s\n{}", job.logs());
    members
}

/// `(member_id, leader)` from `POST /v3/maintenance/status` on `member`, asked from host `from`.
fn etcd_status(net: &Net, from: usize, member: std::net::SocketAddr) -> Option<(String, String)> {
    let body = net.host(from).http_post(member, "/v3/maintenance/status", "{}", Duration::from_secs(1)).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let text = |v: &Value| v.as_str().map(str::to_string).or_else(|| v.as_u64().map(|n| n.to_string()));
    Some((text(&v["header"]["member_id"])?, text(&v["leader"]).unwrap_or_else(|| "0".into())))
}

/// The index in `hosts` of the member that leads (its status says `leader` == its own `member_id`).
fn etcd_leader(net: &Net, hosts: &[usize], members: &[std::net::SocketAddr]) -> Option<usize> {
    hosts
        .iter()
        .zip(members)
        .position(|(&h, &m)| etcd_status(net, h, m).is_some_and(|(id, leader)| id == leader))
}

/// Agent host 5 is cut: as c10d's cut, and it exits 3 at fence + join_timeout.
#[test]
fn a_silently_cut_agent_host_is_fenced_before_the_survivors_reform_and_exits_3() {
    let (_serial, mut report) = scenario("etcd-cut");
    let net = Net::new(6);
    let endpoints = (0..3).map(|h| net.host(h).socket(ETCD_CLIENT_PORT).to_string()).collect::<Vec<_>>().join(",");
    let mut job = Job::new(&net, FAST, Rdzv::Etcd(endpoints), "2:3");
    start_etcd(&mut job, &[0, 1, 2]);
    for h in [3, 4, 5] {
        job.start_agent(h, "");
    }
    let (t_cut, _, checks) = expect_cut(&mut job, &[3, 4, 5], 5, FAST.join_s(), Net::cut, 0.0, &mut report);
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&[3, 4]);
}

/// The host of the agent with GROUP_RANK 0 cut (nobody hosts the rendezvous with etcd; the others re-form
/// with a new rank 0): never two RANK=0 workers alive at once, and the cut as above.
#[test]
fn the_group_rank_0_host_cut_never_two_rank_0_workers() {
    let (_serial, mut report) = scenario("etcd-cut-rank0");
    let net = Net::new(6);
    let endpoints = (0..3).map(|h| net.host(h).socket(ETCD_CLIENT_PORT).to_string()).collect::<Vec<_>>().join(",");
    let mut job = Job::new(&net, FAST, Rdzv::Etcd(endpoints), "2:3");
    start_etcd(&mut job, &[0, 1, 2]);
    for h in [3, 4, 5] {
        job.start_agent(h, "");
    }
    job.wait_running(&[3, 4, 5], 0.0, crate::common::cluster::LONG, "the first round");
    super::c10d::rank_0_host_cut(&mut job, &[3, 4, 5], FAST.join_s(), &mut report);
}

/// The leader's host cut: the two other members elect a new leader, requests fail over, and no
/// agent re-forms (no transition to "stopping" anywhere); the workers run on and the job finishes. The
/// leader's endpoint comes first in --rdzv-endpoint, so the member the agents talk to is the one cut (the
/// hard case: each agent's request to it waits out its attempt bound before failing over, during the
/// election).
#[test]
fn the_leader_host_cut_nothing_reforms_and_training_goes_on() {
    let (_serial, mut report) = scenario("etcd-leader-cut");
    let net = Net::new(6);
    let timings = FAST;
    let mut job = Job::new(&net, timings, Rdzv::Etcd(String::new()), "2:3");
    let members = start_etcd(&mut job, &[0, 1, 2]);
    let first = etcd_leader(&net, &[0, 1, 2], &members).unwrap_or_else(|| panic!("no etcd leader\n{}", job.logs()));
    let mut order: Vec<usize> = vec![first];
    order.extend((0..3).filter(|h| *h != first));
    job.rdzv = Rdzv::Etcd(order.iter().map(|&h| members[h].to_string()).collect::<Vec<_>>().join(","));
    for h in [3, 4, 5] {
        job.start_agent(h, "");
    }
    job.settled(&[3, 4, 5]);
    let leader = etcd_leader(&net, &[0, 1, 2], &members).unwrap_or_else(|| panic!("no etcd leader\n{}", job.logs()));
    report.set("cut_host", leader);
    report.set("leader_was_first_endpoint", leader == first);
    let before = job.steady();
    let t_cut = epoch(net.cut(leader));
    // Long enough for an eviction (W + I), an election and a fence to have shown: 3 W.
    std::thread::sleep(Duration::from_secs_f64(3.0 * timings.w()));
    let others: Vec<usize> = (0..3).filter(|h| *h != leader).collect();
    let new_leader = etcd_leader(&net, &others, &others.iter().map(|&h| members[h]).collect::<Vec<_>>());
    let mut checks = Checks::default();
    checks.check(new_leader.is_some(), || "the two members left did not elect a leader".into());
    job.check_steady(&before, &[3, 4, 5], "the leader's cut", &mut checks);
    report.set("split_brain_s", 0.0);
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&[3, 4, 5]);
}
