//! The health gate's network check on a real interface: a host's veth loses its carrier (its bridge port
//! down, as when a cable is pulled), before the join (the check fails) or while the workers run (the drop
//! is reported, or drains the node).

use crate::common::cluster::{wait_world, Agent};
use crate::common::gate::{expect_gate_failed, expect_link_drop, hooked_node};
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

/// The interface that carries `--local-addr` loses its carrier while the workers run (its bridge port down):
/// by default the agent says so once and the workers train on; with `--on-link-drop drain` the node drains
/// (exit 75, the line naming the interface, the hook with `network`, its workers gone).
#[test]
fn a_link_that_drops_while_training_is_reported_or_drains_the_node() {
    let _serial = serial();
    for drain in [false, true] {
        let net = Net::new(1);
        let host = net.host(0);
        let dir = tempfile::tempdir().expect("tempdir");
        let local = format!("--local-addr={}", host.addr());
        let mut opts = vec![local.as_str()];
        if drain {
            opts.push("--on-link-drop=drain");
        }
        let mut cmd = muster();
        cmd.args(hooked_node(dir.path(), 1, &opts)).env("MUSTER_TEST_NODE", "h0");
        let mut agent = Agent::spawn(host.wrap(&mut cmd));
        let world = wait_world(dir.path(), 1, 1);
        net.link_down(0);
        expect_link_drop(&mut agent, dir.path(), &world, "vh0 lost its carrier while the workers ran", drain, || {
            net.heal();
        });
    }
}
