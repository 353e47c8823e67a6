//! The etcd test harness itself (tests/it/common/etcd.rs over scripts/etcd/cluster.py), against both supported
//! majors: what the etcd rendezvous tests rely on.

use crate::common;

use std::time::Duration;

use common::etcd::{Etcd, EtcdCluster};

const ELECTION: Duration = Duration::from_secs(30);

fn leader_fails_over_and_members_come_back(version: Etcd) {
    let cluster = EtcdCluster::start_version(version, 3, false);
    assert_eq!(cluster.endpoints().split(',').count(), 3, "endpoints: {}", cluster.endpoints());
    let old = cluster.wait_leader(ELECTION);

    cluster.kill(&old);
    let new = cluster.wait_leader(ELECTION);
    assert_ne!(new, old, "the killed member still leads");
    assert!(cluster.names().contains(&new), "leader {new} is not a member of {:?}", cluster.names());

    // All down (the "etcd outage" tests), then back on the same ports and data, the killed member included.
    cluster.stop_all();
    assert_eq!(cluster.leader(), None, "a leader while every member is stopped");
    cluster.start_all();
    cluster.wait_leader(ELECTION);
}

#[test]
fn etcd_34_leader_fails_over_and_members_come_back() {
    leader_fails_over_and_members_come_back(Etcd::V34);
}

#[test]
fn etcd_35_leader_fails_over_and_members_come_back() {
    leader_fails_over_and_members_come_back(Etcd::V35);
}

#[test]
fn tls_cluster_hands_out_its_client_certificates() {
    let cluster = EtcdCluster::start(1, true);
    let tls = cluster.tls().expect("a --tls cluster has TLS paths").clone();
    for path in [&tls.ca, &tls.cert, &tls.key] {
        assert!(path.is_file(), "{} is missing", path.display());
    }
    assert!(cluster.tls_rdzv_conf().starts_with("protocol=https,cacert="), "{}", cluster.tls_rdzv_conf());
    assert_eq!(cluster.wait_leader(ELECTION), "e1");
}
