//! The health gate's network check on a real interface: a host's veth loses its carrier (its bridge port
//! down, as when a cable is pulled), and an agent on that host fails the check before it joins.

use crate::common::cluster::Agent;
use crate::common::gate::{expect_gate_failed, hooked_node};
use crate::common::muster;
use crate::common::netns::Net;
use super::serial;

/// The interface that carries `--local-addr` has no carrier: exit 75 naming the check and the interface,
/// the hook with `network`, no worker started.
#[test]
fn an_interface_without_carrier_fails_the_network_check() {
    let _serial = serial();
    let net = Net::new(1);
    let host = net.host(0);
    net.link_down(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let local = format!("--local-addr={}", host.addr());
    let mut cmd = muster();
    cmd.args(hooked_node(dir.path(), 1, &[&local])).env("MUSTER_TEST_NODE", "h0");
    let mut agent = Agent::spawn(host.wrap(&mut cmd));
    let saw = format!("vh0 has no carrier (its cable, switch port or peer is down): it carries {}", host.addr());
    expect_gate_failed(&mut agent, dir.path(), "network", &saw);
}
