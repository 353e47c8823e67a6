//! Packet loss, not a cut: the store's host drops packets at random for minutes. TCP retransmits what is
//! lost, so with the default keep-alive (5 s × 3: a window of 15 s, each round trip bounded by 5 s) every
//! node stays heard and nobody may be fenced or evicted.

use std::time::Duration;

use crate::common::netns::{LossCounts, Net};
use super::job::Job;
use super::{epoch, now, round3, scenario, show, Checks, DEFAULT_KEEP_ALIVE};

/// How long the loss lasts: `MUSTER_LOSS_SECS` (to shorten a run by hand), else 240 s.
fn loss_secs() -> u64 {
    match std::env::var("MUSTER_LOSS_SECS") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("MUSTER_LOSS_SECS={v:?} is not a number of seconds")),
        Err(_) => 240,
    }
}

/// c10d, three agents on three hosts, the store hosted by host 0's agent, no keep-alive key in
/// --rdzv-conf. One packet in 10 is dropped each way at host 0's bridge port (everything the other agents
/// send the store, and its answers) for `loss_secs()`: no agent stops its workers, no worker is started
/// again, and every agent exits 0 once the job finishes (under the loss still). The report has how many
/// packets the rules dropped and how often an agent replaced its connection to the store.
#[test]
fn ten_percent_loss_each_way_at_the_store_host_evicts_nobody() {
    // A bad MUSTER_LOSS_SECS fails before anything starts.
    let secs = loss_secs();
    let (_serial, mut report) = scenario("c10d-store-loss-10pct");
    report.set("loss_s", secs);
    let net = Net::new(3);
    let mut job = Job::c10d(&net, DEFAULT_KEEP_ALIVE);
    job.settled(&[0, 1, 2]);
    let before = job.steady();
    let t_loss = epoch(net.loss(0, 10));
    std::thread::sleep(Duration::from_secs(secs));
    let LossCounts { crossed, dropped } = net.loss_counts();
    report.set("dropped_packets", dropped);
    report.set("crossed_packets", crossed);
    let mut checks = Checks::default();
    // A packet a second at the least crosses that port (two agents' heartbeats, the answers, the ACKs),
    // and about one in ten of them is dropped: 5 to 20% is many standard deviations either side.
    let share = dropped as f64 / crossed.max(1) as f64;
    checks.check(crossed >= secs && (0.05..=0.2).contains(&share), || {
        format!("the loss rules dropped {dropped} of {crossed} packets in {secs} s\n{}", net.ruleset())
    });
    job.check_steady(&before, &[0, 1, 2], "the loss started", &mut checks);
    for h in 0..3 {
        let stops: Vec<_> = job.events(h).into_iter().filter(|t| t.to == "stopping").collect();
        checks.check(stops.is_empty(), || format!("agent h{h} stopped its workers: {}", show(&stops, t_loss)));
    }
    let reconnects: usize = job.nodes.iter().map(|n| n.agent.log().matches("connected again").count()).sum();
    report.set("reconnects", reconnects);
    job.assert_checks(checks, t_loss, "the loss's start");
    let t_finish = now();
    job.expect_finished(&[0, 1, 2]);
    report.set("finish_s", round3(now() - t_finish));
    net.heal();
}
