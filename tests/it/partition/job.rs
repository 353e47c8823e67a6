//! A job of the partition scenarios: its agents, each in a host of a `Net`, what they run, and what
//! their event logs, the workers' start records and the /proc sampler say.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::cluster::{self, Agent, AgentArgs};
use crate::common::netns::Net;
use crate::common::*;
use super::{max_overlap, now, show, starts, transitions, Checks, Sampler, Seen, Timings, Tr, STORE_PORT};

/// What every agent of a job runs: `script OUTDIR args...` (OUTDIR: the job's directory).
pub(crate) struct Workload {
    pub(crate) script: PathBuf,
    pub(crate) args: Vec<String>,
    /// --shutdown-timeout
    pub(crate) shutdown_timeout: u32,
}

impl Workload {
    /// tests/fixtures/netns_worker.py: records its start, sleeps until the job's finish file exists.
    pub(crate) fn sleeper() -> Workload {
        Workload { script: fixture("netns_worker.py"), args: Vec::new(), shutdown_timeout: 5 }
    }
}

/// What is running at one moment, to show later that nothing was stopped or started since.
pub(crate) struct Steady {
    pub(crate) t: f64,
    workers: Vec<Seen>,
    starts: usize,
}

pub(crate) enum Rdzv {
    /// `--rdzv-backend c10d --rdzv-endpoint ADDR:PORT`; the agent on that host hosts the store unless an
    /// external `muster store` runs there.
    C10d(String),
    /// `--rdzv-backend etcd --rdzv-endpoint e1:2379,e2:2379,e3:2379`.
    Etcd(String),
    /// `--rdzv-backend k8s --rdzv-endpoint KUBECONFIG`.
    Kube(String),
}

/// One agent, on host `host`, named `h<host>` (its MUSTER_TEST_NODE).
pub(crate) struct Node {
    pub(crate) host: usize,
    pub(crate) agent: Agent,
    pub(crate) exit: Option<(f64, Option<i32>)>,
}

impl Node {
    pub(crate) fn name(&self) -> String {
        format!("h{}", self.host)
    }
}

pub(crate) struct Job<'n> {
    pub(crate) net: &'n Net,
    dir: tempfile::TempDir,
    pub(crate) token: String,
    pub(crate) timings: Timings,
    pub(crate) rdzv: Rdzv,
    nnodes: String,
    pub(crate) workload: Workload,
    /// Workers a node (`--nproc-per-node`).
    pub(crate) nproc: u32,
    /// More options for every agent.
    pub(crate) opts: Vec<String>,
    pub(crate) nodes: Vec<Node>,
    /// Other processes of the job (stores, etcd members), killed on drop.
    pub(crate) services: Vec<Guard>,
    pub(crate) sampler: Sampler,
}

impl<'n> Job<'n> {
    pub(crate) fn new(net: &'n Net, timings: Timings, rdzv: Rdzv, nnodes: &str) -> Job<'n> {
        let token = format!("part{}", net.prefix());
        Job {
            net,
            dir: tempfile::Builder::new().prefix("muster-partition-").tempdir().unwrap(),
            sampler: Sampler::start(&token),
            token,
            timings,
            rdzv,
            nnodes: nnodes.to_string(),
            workload: Workload::sleeper(),
            nproc: 1,
            opts: Vec::new(),
            nodes: Vec::new(),
            services: Vec::new(),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn events_path(&self, host: usize) -> PathBuf {
        self.path().join(format!("events-h{host}.jsonl"))
    }

    pub(crate) fn events(&self, host: usize) -> Vec<Tr> {
        transitions(&self.events_path(host))
    }

    pub(crate) fn node(&self, host: usize) -> &Node {
        self.nodes.iter().find(|n| n.host == host).unwrap_or_else(|| panic!("no agent on host {host}"))
    }

    pub(crate) fn node_mut(&mut self, host: usize) -> &mut Node {
        self.nodes.iter_mut().find(|n| n.host == host).unwrap_or_else(|| panic!("no agent on host {host}"))
    }

    /// A c10d job of the netns worker on every host of `net`, the store hosted by host 0's agent.
    pub(crate) fn c10d(net: &'n Net, timings: Timings) -> Job<'n> {
        let mut job = Job::new(net, timings, Rdzv::C10d(net.host(0).socket(STORE_PORT).to_string()), "2:3");
        job.start_c10d(&(0..net.len()).collect::<Vec<_>>());
        job
    }

    /// An agent on `host` running the job's workload, `nproc` workers a node.
    pub(crate) fn start_agent(&mut self, host: usize, extra_conf: &str) {
        let h = self.net.host(host);
        let (backend, endpoint) = match &self.rdzv {
            Rdzv::C10d(e) => ("c10d", e.clone()),
            Rdzv::Etcd(e) => ("etcd", e.clone()),
            Rdzv::Kube(kubeconfig) => ("k8s", kubeconfig.clone()),
        };
        let mut conf = self.timings.conf();
        if !extra_conf.is_empty() {
            conf = format!("{conf},{extra_conf}");
        }
        let args = AgentArgs::rdzv(backend, &self.nnodes, endpoint)
            .nproc(self.nproc)
            .run_id(&self.token)
            .conf(conf)
            .opt(format!("--local-addr={}", h.addr()))
            .opt(format!("--event-log={}", self.events_path(host).display()))
            .opt(format!("--log-dir={}", self.path().join(format!("logs-h{host}")).display()))
            .opt("--max-restarts=3")
            .opt(format!("--shutdown-timeout={}", self.workload.shutdown_timeout))
            .opts(&self.opts)
            .script(&self.workload.script)
            .arg(self.path())
            .args(&self.workload.args)
            .build();
        let mut cmd = muster();
        h.wrap(&mut cmd);
        // gloo picks its address from the hostname, which every host shares (and /etc/hosts maps to
        // loopback): the workers are told their host's interface.
        cmd.env("MUSTER_TEST_NODE", format!("h{host}"))
            .env("MUSTER_PARTITION_JOB", &self.token)
            .env("GLOO_SOCKET_IFNAME", format!("vh{host}"))
            .args(args);
        self.nodes.push(Node { host, agent: Agent::spawn(&mut cmd), exit: None });
    }

    /// Waits until `to` on `from` accepts TCP connections.
    pub(crate) fn wait_listening(&self, from: usize, to: std::net::SocketAddr, what: &str) {
        let ok = eventually(Duration::from_secs(30), || self.net.host(from).connect(to, Duration::from_millis(500)).is_ok());
        assert!(ok, "{what} at {to} did not listen within 30 s\n{}", self.logs());
    }

    /// c10d with the store hosted by the agent on `hosts[0]`, then the others.
    pub(crate) fn start_c10d(&mut self, hosts: &[usize]) {
        let store = self.net.host(hosts[0]).socket(STORE_PORT);
        self.start_agent(hosts[0], "is_host=1");
        self.wait_listening(hosts[1], store, "the agent-hosted store");
        for &h in &hosts[1..] {
            self.start_agent(h, "is_host=0");
        }
    }

    /// `muster store` on `store_host`, then agents on `hosts` (none hosting).
    pub(crate) fn start_c10d_external(&mut self, store_host: usize, hosts: &[usize]) {
        let h = self.net.host(store_host);
        let mut cmd = muster();
        h.wrap(&mut cmd);
        cmd.args(["store", "--host", &h.addr(), "--port", &STORE_PORT.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(self.path().join("store.log")).unwrap());
        self.services.push(Guard::spawn(&mut cmd));
        self.wait_listening(hosts[0], h.socket(STORE_PORT), "muster store");
        for &a in hosts {
            self.start_agent(a, "is_host=0");
        }
    }

    /// Waits for the first round of every agent on `hosts`, then a moment in it, so that heartbeats flow as
    /// usual when a fault comes; returns the round.
    pub(crate) fn settled(&self, hosts: &[usize]) -> i64 {
        let round = self.wait_running(hosts, 0.0, cluster::LONG, "the first round");
        std::thread::sleep(Duration::from_secs(2));
        round
    }

    /// The last round in which every agent on `hosts` runs, each with a worker of a world of
    /// `hosts.len()` recorded and alive, after `after` (epoch seconds); the test fails after `timeout`.
    pub(crate) fn wait_running(&self, hosts: &[usize], after: f64, timeout: Duration, what: &str) -> i64 {
        let mut round = None;
        let ok = eventually(timeout, || {
            round = self.running_round(hosts, after);
            round.is_some()
        });
        assert!(ok, "{what}: hosts {hosts:?} were not all running one round of {} within {timeout:?}\n{}", hosts.len(), self.logs());
        round.unwrap_or_default()
    }

    pub(crate) fn running_round(&self, hosts: &[usize], after: f64) -> Option<i64> {
        let mut rounds = Vec::new();
        for &h in hosts {
            let last = self.events(h).into_iter().rfind(|t| t.t >= after)?;
            if last.to != "running" {
                return None;
            }
            rounds.push(last.round?);
        }
        rounds.dedup();
        let [round] = rounds[..] else { return None };
        let world = hosts.len() as u32;
        let st = starts(self.path());
        let all = hosts.iter().all(|h| {
            st.iter().any(|s| s.node == format!("h{h}") && s.world_size == Some(world) && alive(s.pid))
        });
        all.then_some(round)
    }

    /// The group rank each node's worker had in the last start recorded with world size `world`.
    pub(crate) fn group_ranks(&self, hosts: &[usize], world: u32) -> HashMap<usize, Option<u32>> {
        let st = starts(self.path());
        hosts
            .iter()
            .map(|&h| {
                let g = st.iter().rfind(|s| s.node == format!("h{h}") && s.world_size == Some(world)).and_then(|s| s.group_rank);
                (h, g)
            })
            .collect()
    }

    /// Waits up to `timeout` for the agent on `host` to exit; remembers when (epoch seconds) and how.
    pub(crate) fn wait_exit(&mut self, host: usize, timeout: Duration) -> Option<(f64, Option<i32>)> {
        let node = self.node_mut(host);
        if node.exit.is_none() {
            if let Some(status) = node.agent.guard.wait_timeout(timeout) {
                node.exit = Some((now(), status.code()));
            }
        }
        node.exit
    }

    pub(crate) fn finish(&self) {
        std::fs::write(self.path().join("finish"), "").unwrap();
    }

    /// The job told to finish, and every agent on `hosts` seen to exit 0.
    pub(crate) fn expect_finished(&mut self, hosts: &[usize]) {
        self.finish();
        for &h in hosts {
            let code = self.wait_exit(h, cluster::LONG).map(|(_, c)| c);
            assert_eq!(code, Some(Some(0)), "h{h} did not finish with exit 0: {}", self.node(h).agent.log());
        }
    }

    /// The transitions of the agent on `host` at or after `t` (epoch seconds).
    pub(crate) fn events_after(&self, host: usize, t: f64) -> Vec<Tr> {
        self.events(host).into_iter().filter(|e| e.t >= t).collect()
    }

    /// The longest time a worker of `victim` started before `t_cut` was alive together with a worker another
    /// node started after it (split brain), and the pair.
    pub(crate) fn split_brain(&self, victim: usize, t_cut: f64) -> (f64, Option<(Seen, Seen)>) {
        let seen = self.sampler.seen();
        let name = format!("h{victim}");
        let old: Vec<&Seen> = seen.iter().filter(|s| s.node == name && s.first < t_cut).collect();
        let new: Vec<&Seen> = seen.iter().filter(|s| s.node != name && s.first > t_cut).collect();
        max_overlap(&old, &new)
    }

    /// The workers alive and the starts recorded now.
    pub(crate) fn steady(&self) -> Steady {
        let workers = self.sampler.seen().into_iter().filter(|s| !s.gone).collect();
        Steady { t: now(), workers, starts: starts(self.path()).len() }
    }

    /// Since `before`, no agent on `hosts` stopped its workers, every worker alive then still is, and none
    /// was started; `after_what` names the fault for the messages.
    pub(crate) fn check_steady(&self, before: &Steady, hosts: &[usize], after_what: &str, checks: &mut Checks) {
        for &h in hosts {
            let stops: Vec<Tr> = self.events_after(h, before.t).into_iter().filter(|t| t.to == "stopping").collect();
            checks.check(stops.is_empty(), || format!("agent h{h} stopped its workers after {after_what}: {}", show(&stops, before.t)));
        }
        let still: Vec<Seen> = self.sampler.seen().into_iter().filter(|s| !s.gone).collect();
        checks.check(before.workers.iter().all(|w| still.iter().any(|s| s.pid == w.pid)), || {
            format!("workers ended after {after_what}: before {:?}, now {still:?}", before.workers)
        });
        let started = starts(self.path()).len();
        checks.check(started == before.starts, || format!("{} worker(s) started after {after_what}", started - before.starts));
    }

    /// Fails the test with every failed expectation, the timeline relative to `t0` and the logs.
    pub(crate) fn assert_checks(&self, checks: Checks, t0: f64, t0_is: &str) {
        checks.assert_all(|| format!("timeline (s from {t0_is}):\n{}\n{}", self.timeline(t0), self.logs()));
    }

    /// Every agent's event log and the tail of its stderr, for a failing test's message.
    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let log = n.agent.log();
            let tail: Vec<&str> = log.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect();
            out.push_str(&format!("--- agent {} ({}):\n{}\n", n.name(), self.net.host(n.host).addr(), tail.join("\n")));
        }
        out.push_str(&format!("--- starts:\n{}", std::fs::read_to_string(self.path().join("starts")).unwrap_or_default()));
        for f in ["store.log", "e1.log", "e2.log", "e3.log", "progress", "signals"] {
            if let Ok(text) = std::fs::read_to_string(self.path().join(f)) {
                let tail: Vec<&str> = text.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
                out.push_str(&format!("--- {f}:\n{}\n", tail.join("\n")));
            }
        }
        out
    }

    /// The event logs relative to `t0`, one line an agent.
    pub(crate) fn timeline(&self, t0: f64) -> String {
        self.nodes.iter().map(|n| format!("{}: {}", n.name(), show(&self.events(n.host), t0))).collect::<Vec<_>>().join("\n")
    }
}
