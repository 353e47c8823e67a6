//! The health gate's network check on a real interface: a host's veth loses its carrier (its bridge port
//! down, as when a cable is pulled), and an agent on that host fails the check before it joins.

use crate::common::cluster::{starts, Agent, AgentArgs, LONG};
use crate::common::netns::Net;
use crate::common::{fixture, muster};
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
    let hook_out = dir.path().join("hook.env");
    let hook = format!("env | grep '^MUSTER_FAULT_' > {}", hook_out.display());
    let args = AgentArgs::c10d(1, "127.0.0.1:0")
        .nproc(1)
        .conf("is_host=1")
        .opts([format!("--local-addr={}", host.addr()), "--on-node-fault".into(), hook])
        .script(fixture("incident_worker.py"))
        .arg(dir.path())
        .build();
    let mut cmd = muster();
    cmd.args(&args).env("MUSTER_TEST_NODE", "h0");
    let mut agent = Agent::spawn(host.wrap(&mut cmd));
    assert_eq!(agent.exit_code(LONG), Some(75), "{}", agent.log());
    let want = format!("health check 'network' failed: vh0 has no carrier (its cable, switch port or peer is down): it carries {}", host.addr());
    assert!(agent.log().contains(&want), "{}", agent.log());
    let env = std::fs::read_to_string(&hook_out).expect("the hook ran");
    assert!(env.contains("MUSTER_FAULT_KIND=network"), "{env}");
    assert!(starts(dir.path()).is_empty(), "a worker started on a node that failed its gate");
}
