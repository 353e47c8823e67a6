//! c10d: the agent on host 0 (or an external `muster store` there) hosts the rendezvous store; another
//! node's host is cut off, silently or otherwise.

use std::time::{Duration, SystemTime};

use crate::common::cluster;
use crate::common::netns::Net;
use crate::common::{alive, eventually};
use super::cut::{check_rounds, expect_cut};
use super::job::{Job, Rdzv};
use super::{epoch, max_overlap, now, round3, scenario, Checks, Seen, DEFAULT_KEEP_ALIVE, FAST, STORE_PORT};

/// Three agents on three hosts, the store hosted by host 0's agent; host 2 is hit by `fault`: the
/// expectations of a cut (with `late` s more for the survivors' re-form), then the survivors finish.
fn host_2_faulted(name: &'static str, fault: fn(&Net, usize) -> SystemTime, late: f64) {
    let (_serial, mut report) = scenario(name);
    let net = Net::new(3);
    let mut job = Job::c10d(&net, FAST);
    let (t_cut, _, checks) = expect_cut(&mut job, &[0, 1, 2], 2, FAST.read_s(), fault, late, &mut report);
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&[0, 1]);
}

/// (a) Host 2 cut silently: fenced before the survivors re-form, then exit 3.
#[test]
fn a_silently_cut_node_is_fenced_before_the_survivors_reform_and_exits_3() {
    host_2_faulted("c10d-cut", Net::cut, 0.0);
}

/// (a') As (a) but only the packets to host 2 are dropped: it still sends (its heartbeats and, when it gives
/// up on a connection, its FIN reach the store), and hears nothing. It must fence before the survivors run
/// without it all the same. Its beats reach the store until it gives up on its connection, about one
/// heartbeat after the cut: the survivors' window starts up to I later.
#[test]
fn an_inbound_only_cut_node_is_fenced_before_the_survivors_reform() {
    host_2_faulted("c10d-cut-inbound", Net::cut_inbound, FAST.i());
}

/// (a'') As (a) with host 2's bridge port down (its link loses carrier) instead of a silent drop.
#[test]
fn a_node_whose_link_goes_down_is_fenced_before_the_survivors_reform() {
    host_2_faulted("c10d-link-down", Net::link_down, 0.0);
}

/// (b) The same cut healed once the survivors run without the cut node, before it gives up: it comes back
/// as a newcomer, appended after the survivors, whose group ranks do not change.
#[test]
fn a_cut_node_healed_in_time_rejoins_as_a_newcomer_with_the_highest_group_rank() {
    let (_serial, mut report) = scenario("c10d-cut-heal");
    let net = Net::new(3);
    let mut job = Job::c10d(&net, FAST);
    job.settled(&[0, 1, 2]);
    let t_cut = epoch(net.cut(2));
    let bound = FAST.w() + FAST.i() + 15.0;
    let r1 = job.wait_running(&[0, 1], t_cut, Duration::from_secs_f64(bound), "the survivors without h2");
    let reform = [0, 1].iter().flat_map(|&h| job.events_after(h, t_cut)).filter(|t| t.to == "running").map(|t| t.t - t_cut);
    report.set("reform_s", round3(reform.fold(0.0, f64::max)));
    let ranks1 = job.group_ranks(&[0, 1], 2);
    let t_heal = epoch(net.heal());
    report.set("heal_s", round3(t_heal - t_cut));
    let rejoin_bound = Duration::from_secs_f64(FAST.read_s() + FAST.join_s());
    let ok = eventually(rejoin_bound, || job.running_round(&[0, 1, 2], t_heal).is_some_and(|r| r > r1));
    let mut checks = Checks::default();
    checks.check(ok, || format!("no round of all three nodes after the heal within {rejoin_bound:?}"));
    let rejoin = job.events_after(2, t_heal).into_iter().find(|t| t.to == "running").map(|t| t.t - t_heal);
    report.set("rejoin_s", rejoin.map(round3));
    let fence = job.events_after(2, t_cut).into_iter().find(|t| t.to == "stopping");
    report.set("fence_s", fence.as_ref().map(|f| round3(f.t - t_cut)));
    checks.check(fence.as_ref().is_some_and(|f| f.reason.as_deref() == Some("fenced") && f.t < t_heal), || {
        format!("the cut node was not fenced before the heal: {fence:?}")
    });
    checks.check(alive(job.node(2).agent.guard.pid()), || "the cut node exited although it was healed in time".into());
    if ok {
        let ranks2 = job.group_ranks(&[0, 1, 2], 3);
        for h in [0, 1] {
            checks.check(ranks2[&h] == ranks1[&h], || {
                format!("survivor h{h}'s GROUP_RANK changed when the cut node came back: {:?} -> {:?}", ranks1[&h], ranks2[&h])
            });
        }
        checks.check(ranks2[&2] == Some(2), || format!("the returned node's GROUP_RANK is {:?}, not the highest (2)", ranks2[&2]));
        report.set("returned_group_rank", ranks2[&2]);
    }
    let (split, pair) = job.split_brain(2, t_cut);
    report.set("split_brain_s", round3(split));
    checks.check(split == 0.0, || format!("split brain: {split:.3} s: {pair:?}"));
    check_rounds(&job, &mut checks);
    job.assert_checks(checks, t_cut, &format!("the cut; heal at {:+.3}", t_heal - t_cut));
    job.expect_finished(&[0, 1, 2]);
}

/// (d) The agent hosting the store on host 0 is SIGKILLed while its host stays up, with the default
/// keep-alive (W = 15 s, read_timeout 60 s): host 0's kernel refuses the others' connections, which says the
/// store went with its agent (and its workers with it). Both others stop their workers and exit 3 within
/// the liveness window, saying the store's host ended, instead of waiting out read_timeout.
#[test]
fn a_killed_store_host_agent_ends_the_others_with_3_within_the_window() {
    let (_serial, mut report) = scenario("c10d-store-host-agent-killed");
    let net = Net::new(3);
    let mut job = Job::c10d(&net, DEFAULT_KEEP_ALIVE);
    job.settled(&[0, 1, 2]);
    let t_kill = now();
    job.node(0).agent.kill9();
    let bound = Duration::from_secs_f64(DEFAULT_KEEP_ALIVE.w());
    let mut checks = Checks::default();
    let mut last = 0.0f64;
    for h in [1, 2] {
        let exit = job.wait_exit(h, cluster::LONG);
        let took = exit.map(|(t, _)| t - t_kill);
        last = last.max(took.unwrap_or(f64::INFINITY));
        checks.check(exit.is_some_and(|(_, code)| code == Some(3)), || format!("h{h} exited {exit:?}, not 3"));
        checks.check(took.is_some_and(|t| t < bound.as_secs_f64()), || format!("h{h} exited {took:?} s after the kill, not within W"));
        let log = job.node(h).agent.log();
        checks.check(log.contains("the rendezvous store's host ended: node"), || format!("h{h} does not say the store's host ended"));
    }
    report.set("members_exit_s", round3(last));
    let workers: Vec<i32> = job.sampler.seen().iter().map(|w| w.pid).collect();
    checks.check(eventually(Duration::from_secs(5), || workers.iter().all(|p| !alive(*p))), || "a worker outlived its agent".into());
    job.assert_checks(checks, t_kill, "the kill of the store's host agent");
}

/// (c) An external `muster store` on host 0 and agents on hosts 1-3; the host of the agent with GROUP_RANK
/// 0 is cut: never two RANK=0 workers alive at once, and the cut as in (a).
#[test]
fn external_store_the_group_rank_0_host_cut_never_two_rank_0_workers() {
    let (_serial, mut report) = scenario("c10d-external-store-cut-rank0");
    let net = Net::new(4);
    let mut job = Job::new(&net, FAST, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
    job.start_c10d_external(0, &[1, 2, 3]);
    job.wait_running(&[1, 2, 3], 0.0, cluster::LONG, "the first round");
    rank_0_host_cut(&mut job, &[1, 2, 3], FAST.read_s(), &mut report);
}

/// Cuts the host of the agent with GROUP_RANK 0 among `hosts` (running, world 3): the expectations of a cut,
/// never two RANK=0 workers alive at once, and the survivors finish.
pub(crate) fn rank_0_host_cut(job: &mut Job, hosts: &[usize], store_timeout: f64, report: &mut super::Report) {
    let ranks = job.group_ranks(hosts, 3);
    let victim = *ranks.iter().find(|(_, g)| **g == Some(0)).unwrap_or_else(|| panic!("no GROUP_RANK 0: {ranks:?}")).0;
    report.set("cut_host", victim);
    let (t_cut, o, mut checks) = expect_cut(job, hosts, victim, store_timeout, Net::cut, 0.0, report);
    let seen = job.sampler.seen();
    let rank0: Vec<&Seen> = seen.iter().filter(|s| s.rank == "0").collect();
    let (twice, pair) = max_overlap(&rank0, &rank0);
    report.set("rank0_overlap_s", round3(twice));
    report.set("split_brain_s", round3(twice.max(o.split_brain)));
    checks.check(twice == 0.0, || format!("two RANK=0 workers alive at once for {twice:.3} s: {pair:?}"));
    checks.check(rank0.len() >= 2, || format!("expected a RANK=0 worker in each round, saw {rank0:?}"));
    job.assert_checks(checks, t_cut, "the cut");
    job.expect_finished(&hosts.iter().copied().filter(|h| *h != victim).collect::<Vec<_>>());
}
