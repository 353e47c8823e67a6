//! The Kubernetes API server: a kube-apiserver (and its etcd) on host 0, the agents on hosts 1-3; an agent's
//! host is cut off silently.

use crate::common::apiserver::{KubeServer, User};
use crate::common::netns::Net;
use super::cut::expect_cut;
use super::job::{Job, Rdzv};
use super::{scenario, FAST};

/// Agent host 3 cut: as etcd's cut (fenced before the survivors re-form, no split brain), and it exits 3 at
/// fence + join_timeout; the survivors finish.
#[test]
fn a_silently_cut_agent_host_is_fenced_before_the_survivors_reform_and_exits_3() {
    let (_serial, mut report) = scenario("k8s-cut");
    let net = Net::new(4);
    let server = KubeServer::on(net.host(0));
    let kubeconfig = server.kubeconfig(User::Agent).display().to_string();
    let mut job = Job::new(&net, FAST, Rdzv::Kube(kubeconfig), "2:3");
    for h in [1, 2, 3] {
        job.start_agent(h, "");
    }
    let (t_cut, _, checks) = expect_cut(&mut job, &[1, 2, 3], 3, FAST.join_s(), Net::cut, 0.0, &mut report);
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&[1, 2]);
}
