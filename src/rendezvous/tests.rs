//! The rendezvous: pure rank assignment, then one shared suite run against every `Store` (invariant 8):
//! the in-memory store, muster's TCP store over loopback and etcd (a real member on loopback).

use super::join::assign_ranks;
use super::wire::{parse_round, Record, Seal};
use super::*;

fn rec(id: &str, slot: i64, prev: Option<u32>, pref: Option<u32>) -> Record {
    let prev_round = prev.map(|_| 4);
    Record { node: NodeInfo { id: id.into(), addr: id.into(), nproc: 2 }, slot, prev_rank: prev, prev_round, pref_rank: pref, restarts: None, in_place: None }
}

fn settings(max: u32, strict: bool) -> Settings {
    Settings {
        run_id: "t".into(),
        min_nodes: 1,
        max_nodes: max,
        join_timeout: Duration::from_secs(1),
        last_call_timeout: Duration::from_secs(1),
        exit_barrier_timeout: Duration::from_secs(1),
        keep_alive_interval: Duration::from_secs(1),
        keep_alive_max_attempt: 3,
        heartbeat_timeout: Duration::from_secs(1),
        store_timeout: Duration::from_secs(10),
        node_rank: None,
        strict_rank: strict,
        restart_budget: None,
            exclude_after: None,
    }
}

fn ids(v: &[Record]) -> Vec<&str> {
    v.iter().map(|r| r.node.id.as_str()).collect()
}

#[test]
fn previous_members_keep_their_order_and_newcomers_follow() {
    let r = vec![rec("new", 1, None, None), rec("b", 2, Some(2), None), rec("a", 3, Some(0), None)];
    assert_eq!(ids(&assign_ranks(r, &settings(4, false)).unwrap()), ["a", "b", "new"]);
}

#[test]
fn a_node_back_from_an_older_round_is_a_newcomer() {
    // "old" held rank 0 in round 3 and was evicted while cut off; "a" and "b" re-formed in round 4 without it.
    let mut old = rec("old", 1, Some(0), None);
    old.prev_round = Some(3);
    let r = vec![old, rec("b", 2, Some(1), None), rec("a", 3, Some(0), None), rec("new", 4, None, None)];
    assert_eq!(ids(&assign_ranks(r, &settings(4, false)).unwrap()), ["a", "b", "old", "new"]);
    // Records of agents before `prev_round` keep their previous order as they did.
    let mut legacy = vec![rec("b", 1, Some(1), None), rec("a", 2, Some(0), None)];
    legacy.iter_mut().for_each(|r| r.prev_round = None);
    assert_eq!(ids(&assign_ranks(legacy, &settings(4, false)).unwrap()), ["a", "b"]);
}

#[test]
fn scheduler_rank_orders_newcomers_and_max_truncates() {
    let r = vec![rec("x", 1, None, Some(5)), rec("y", 2, None, Some(1)), rec("z", 3, None, None)];
    assert_eq!(ids(&assign_ranks(r, &settings(2, false)).unwrap()), ["y", "x"]);
}

#[test]
fn static_ranks_must_be_exact() {
    let ok = vec![rec("b", 1, None, Some(1)), rec("a", 2, None, Some(0))];
    assert_eq!(ids(&assign_ranks(ok, &settings(2, true)).unwrap()), ["a", "b"]);
    let dup = vec![rec("b", 1, None, Some(1)), rec("a", 2, None, Some(1))];
    assert!(assign_ranks(dup, &settings(2, true)).is_err());
}

#[test]
fn seals_round_trip() {
    let members = vec![
        NodeInfo { id: "h1_10_0".into(), addr: "h1".into(), nproc: 8 },
        NodeInfo { id: "[::1]_11_0".into(), addr: "::1".into(), nproc: 2 },
    ];
    assert_eq!(Seal::decode(&Seal { members: members.clone() }.encode()).unwrap().members, members);
    assert!(Seal::decode(b"x y").is_err());
}

#[test]
fn assignments_round_trip() {
    let info = RoundInfo {
        round: 3,
        group_rank: 1,
        group_world_size: 3,
        base_global_rank: 8,
        world_size: 24,
        neighbours: vec![NodeInfo { id: "h2_1_0".into(), addr: "h2".into(), nproc: 8 }],
    };
    assert_eq!(RoundInfo::decode(3, &info.encode()).unwrap(), info);
    assert!(RoundInfo::decode(3, b"1 2").is_err());
}

#[test]
fn round_values() {
    assert_eq!(parse_round(b"3"), (3, None));
    assert_eq!(parse_round(b"4/2"), (4, Some(2)));
    assert_eq!(parse_round(b""), (0, None));
}

#[test]
fn fingerprint_differences_name_what_differs() {
    let job = Fingerprint { entrypoint: "a.py".into(), args: vec![], nproc_spec: "2".into(), nnodes: "2:4".into(), restart_budget: String::new(), exclude_after: String::new() };
    let me = Fingerprint { entrypoint: "b.py".into(), args: vec![], nproc_spec: "4".into(), nnodes: "2:3".into(), restart_budget: String::new(), exclude_after: String::new() };
    let d = me.differences(&job).join("; ");
    assert!(d.contains("b.py") && d.contains("--nproc-per-node 4"), "{d}");
    assert!(d.contains("--nnodes 2:3 (the job uses 2:4)"), "{d}");
}

pub(super) mod shared {
    use std::future::Future;
    use std::net::SocketAddr;
    use std::pin::Pin;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::remote::RemoteStore;
    use crate::store::tcp::{Server, ServerConfig};

    /// Connects one more agent to the store under test.
    pub(in crate::rendezvous) trait Backend: Send + Sync + 'static {
        type S: Store;
        fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>>;
    }

    pub(in crate::rendezvous) struct Memory(MemoryStore);

    impl Backend for Memory {
        type S = crate::store::memory::MemoryHandle;
        fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
            Box::pin(async move { self.0.handle() })
        }
    }

    pub(in crate::rendezvous) struct Tcp(pub(in crate::rendezvous) Server);

    impl Backend for Tcp {
        type S = RemoteStore;
        fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
            let addr = SocketAddr::from(([127, 0, 0, 1], self.0.port()));
            Box::pin(async move {
                RemoteStore::connect(addr, b"", Duration::from_secs(5), Duration::from_secs(10)).await.expect("connect")
            })
        }
    }

    /// etcd on loopback (`MUSTER_ETCD` names the binary): a member of its own per test.
    pub(in crate::rendezvous) struct Etcd(pub(in crate::rendezvous) crate::store::etcd::testing::TestEtcd);

    impl Backend for Etcd {
        type S = crate::store::etcd::EtcdStore;
        fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
            Box::pin(async move {
                // The session's lease lasts as long as the suite's heartbeats allow a hung node.
                let mut opts = self.0.options("/");
                opts.lease_ttl = Duration::from_secs(2);
                crate::store::etcd::EtcdStore::connect(&opts, Duration::from_secs(20)).await.expect("connect")
            })
        }
    }

    /// A kube-apiserver on loopback (`MUSTER_KUBE_APISERVER`, in front of `MUSTER_ETCD_35`): one per test,
    /// the agents signing in as a user granted packaging/k8s's Role.
    pub(in crate::rendezvous) struct Kube(pub(in crate::rendezvous) crate::store::k8s::testing::TestKube);

    impl Kube {
        pub(in crate::rendezvous) fn start() -> Kube {
            let kube = crate::store::k8s::testing::TestKube::start();
            kube.grant();
            Kube(kube)
        }
    }

    impl Backend for Kube {
        type S = crate::store::k8s::KubeStore;
        fn connect(&self) -> Pin<Box<dyn Future<Output = Self::S> + Send + '_>> {
            Box::pin(async move {
                use crate::store::k8s::testing::User;
                let mut opts = self.0.options(User::Agent, "default", &format!("{KEY_PREFIX}suite/"));
                opts.lease_ttl = Duration::from_secs(2);
                crate::store::k8s::KubeStore::connect(&opts, Duration::from_secs(20)).await.expect("connect")
            })
        }
    }

    pub(in crate::rendezvous) fn settings(min: u32, max: u32) -> Settings {
        Settings {
            run_id: "suite".into(),
            min_nodes: min,
            max_nodes: max,
            join_timeout: Duration::from_secs(10),
            last_call_timeout: Duration::from_millis(300),
            exit_barrier_timeout: Duration::from_secs(5),
            keep_alive_interval: Duration::from_millis(200),
            keep_alive_max_attempt: 3,
            heartbeat_timeout: Duration::from_secs(1),
        store_timeout: Duration::from_secs(10),
            node_rank: None,
            strict_rank: false,
            restart_budget: None,
            exclude_after: None,
        }
    }

    /// The launch of an agent with these settings, as the agent builds it.
    fn fingerprint(script: &str, s: &Settings) -> Fingerprint {
        let nnodes = format!("{}:{}", s.min_nodes, s.max_nodes);
        Fingerprint { entrypoint: script.into(), args: vec![], nproc_spec: "1".into(), nnodes, restart_budget: String::new(), exclude_after: String::new() }
    }

    pub(in crate::rendezvous) async fn agent<B: Backend>(b: &B, id: &str, nproc: u32, s: Settings) -> Rendezvous<B::S> {
        let me = NodeInfo { id: id.into(), addr: "127.0.0.1".into(), nproc };
        let fingerprint = fingerprint("train.py", &s);
        let mut r = Rendezvous::new(b.connect().await, s, me, fingerprint);
        r.register().await.expect("register");
        r
    }

    /// Every agent joins concurrently; returns them with their rounds.
    pub(in crate::rendezvous) async fn join_all<S: Store>(agents: Vec<Rendezvous<S>>) -> Vec<(Rendezvous<S>, RoundInfo)> {
        let tasks: Vec<_> = agents
            .into_iter()
            .map(|mut a| {
                tokio::spawn(async move {
                    let info = a.next_round().await.expect("round");
                    (a, info)
                })
            })
            .collect();
        // A bound so that a rendezvous bug fails the test instead of hanging the suite (a spare waits forever).
        let joined = tokio::time::timeout(Duration::from_secs(60), async {
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.expect("join task"));
            }
            out
        });
        joined.await.expect("every agent got its round within 60 s")
    }

    async fn forms_a_round_with_prefix_sum_ranks<B: Backend>(b: B) {
        let mut agents = Vec::new();
        for (i, nproc) in [1, 2, 3].into_iter().enumerate() {
            agents.push(agent(&b, &format!("n{i}"), nproc, settings(2, 3)).await);
        }
        let joined = join_all(agents).await;
        let mut by_rank: Vec<&RoundInfo> = joined.iter().map(|(_, i)| i).collect();
        by_rank.sort_by_key(|i| i.group_rank);
        assert_eq!(by_rank.iter().map(|i| i.group_rank).collect::<Vec<_>>(), [0, 1, 2]);
        let nproc_of_rank: Vec<u32> = {
            let mut by: Vec<(u32, u32)> = joined.iter().map(|(a, i)| (i.group_rank, a.me().nproc)).collect();
            by.sort();
            by.into_iter().map(|(_, n)| n).collect()
        };
        let mut base = 0;
        for info in by_rank {
            assert_eq!(info.group_world_size, 3);
            assert_eq!(info.world_size, 6);
            assert_eq!(info.base_global_rank, base, "prefix sum of nproc in group-rank order");
            base += nproc_of_rank[info.group_rank as usize];
        }
    }

    async fn seals_after_the_last_call_with_min_nodes<B: Backend>(b: B) {
        let agents = vec![agent(&b, "a", 1, settings(2, 4)).await, agent(&b, "b", 1, settings(2, 4)).await];
        let joined = join_all(agents).await;
        assert!(joined.iter().all(|(_, i)| i.group_world_size == 2));
    }

    /// Three agents (`--nnodes 1:3`) in one round, in group-rank order.
    async fn three_in_one_round<B: Backend>(b: &B) -> Vec<(Rendezvous<B::S>, RoundInfo)> {
        let agents = vec![
            agent(b, "a", 1, settings(1, 3)).await,
            agent(b, "b", 1, settings(1, 3)).await,
            agent(b, "c", 1, settings(1, 3)).await,
        ];
        let mut joined = join_all(agents).await;
        joined.sort_by_key(|(_, i)| i.group_rank);
        joined
    }

    async fn a_lost_peer_is_seen_and_the_group_reforms<B: Backend>(b: B) {
        let mut joined = three_in_one_round(&b).await;
        let before: Vec<String> = joined.iter().map(|(a, _)| a.me().id.clone()).collect();
        // The middle agent's process dies: its connection (and session key) goes with it.
        let (dead, _) = joined.remove(1);
        drop(dead);
        // Its ring predecessor sees the loss and opens the next round; the other sees the round change.
        let mut seen = Vec::new();
        for (a, _) in joined.iter_mut() {
            let event = tokio::time::timeout(Duration::from_secs(5), a.next_event()).await.expect("event").expect("ok");
            if matches!(event, RdzvEvent::PeerLost(_)) {
                a.open_next_round().await.expect("open");
            }
            seen.push(event);
        }
        assert!(seen.contains(&RdzvEvent::PeerLost(before[1].clone())), "{seen:?}");
        let survivors: Vec<_> = joined.into_iter().map(|(a, _)| a).collect();
        let again = join_all(survivors).await;
        for (a, info) in &again {
            assert_eq!(info.group_world_size, 2);
            let old = before.iter().position(|id| *id == a.me().id).expect("was a member");
            assert_eq!(info.group_rank as usize, if old == 0 { 0 } else { 1 }, "order kept, ranks compacted");
        }
    }

    async fn group_rank_0_lost_before_publishing_reforms_the_others<B: Backend>(b: B) {
        let mut joined = three_in_one_round(&b).await;
        // Group rank 0 dies after the seal, before it publishes the workers' store.
        let (rank0, _) = joined.remove(0);
        let lost = rank0.me().id.clone();
        drop(rank0);
        let mut seen = Vec::new();
        for (a, _) in joined.iter_mut() {
            // Far longer than the test's bound: only the membership event can end the wait in time.
            let waited = tokio::time::timeout(Duration::from_secs(10), a.wait_published("master", Duration::from_secs(600)));
            match waited.await.expect("the loss ends the wait").expect("ok") {
                Published::Changed(event) => {
                    if event != RdzvEvent::RoundChanged {
                        a.open_next_round().await.expect("open");
                    }
                    seen.push(event);
                }
                Published::Value(v) => panic!("nothing was published, got {v:?}"),
            }
        }
        assert!(seen.contains(&RdzvEvent::PeerLost(lost)), "{seen:?}");
        let again = join_all(joined.into_iter().map(|(a, _)| a).collect()).await;
        let mut ranks: Vec<u32> = again.iter().map(|(_, i)| i.group_rank).collect();
        ranks.sort();
        assert_eq!(ranks, [0, 1], "the survivors re-form without the lost rank 0");
        // In the new round the new rank 0 publishes and the other reads it.
        let (mut first, mut second): (Vec<_>, Vec<_>) = again.into_iter().partition(|(_, i)| i.group_rank == 0);
        first[0].0.publish("master", b"29500 node-b").await.expect("publish");
        let got = second[0].0.wait_published("master", Duration::from_secs(5)).await.expect("ok");
        assert_eq!(got, Published::Value(b"29500 node-b".to_vec()));
        drop(first.pop());
    }

    async fn a_hung_peer_is_evicted_by_its_neighbours<B: Backend>(b: B) {
        let agents = vec![agent(&b, "a", 1, settings(1, 2)).await, agent(&b, "b", 1, settings(1, 2)).await];
        let mut joined = join_all(agents).await;
        let (mut hung, _) = joined.pop().expect("two agents");
        hung.stop_heartbeat();
        let (mut a, _) = joined.pop().expect("two agents");
        let event = tokio::time::timeout(Duration::from_secs(5), a.next_event()).await.expect("evicted in time");
        assert_eq!(event.expect("ok"), RdzvEvent::PeerLost(hung.me().id.clone()));
        a.open_next_round().await.expect("open");
        let again = a.next_round().await.expect("re-formed alone");
        assert_eq!(again.group_world_size, 1);
    }

    /// A slot whose taker never wrote its record (the reply to its slot was lost, so it took another) does
    /// not hold the seal to the last call once the round is complete without it.
    async fn a_slot_without_a_record_does_not_hold_a_complete_round<B: Backend>(b: B) {
        let mut s = settings(2, 2);
        s.last_call_timeout = Duration::from_secs(600);
        let (a, c) = (agent(&b, "a", 1, s.clone()).await, agent(&b, "c", 1, s).await);
        a.store().add(&a.key("r/0/slot"), 1).await.expect("a slot taken, its record never written");
        let joined = tokio::time::timeout(Duration::from_secs(20), join_all(vec![a, c])).await;
        let joined = joined.expect("sealed long before the last call");
        assert!(joined.iter().all(|(_, i)| i.group_world_size == 2), "both in");
    }

    /// A neighbour's liveness key found gone when the round's watch is made again just after this node's
    /// link came back (an etcd that froze revokes every lease when it resumes) is not lost at once: it has
    /// a window to register again, and does.
    async fn a_neighbour_gone_at_a_rewatch_after_an_outage_gets_a_window<B: Backend>(b: B) {
        let agents = vec![agent(&b, "a", 1, settings(1, 2)).await, agent(&b, "b", 1, settings(1, 2)).await];
        let mut joined = join_all(agents).await;
        joined.sort_by_key(|(_, i)| i.group_rank);
        let (peer, _) = joined.pop().expect("two agents");
        let (mut a, info) = joined.pop().expect("two agents");
        let alive = a.key(&format!("alive/{}", peer.me().id));
        {
            let mut link = a.link.lock();
            link.fail();
            link.ack(Instant::now(), true);
        }
        a.store().delete(&alive).await.expect("delete");
        a.watch_round(&info).await.expect("watch");
        assert_eq!(a.pending, None, "judged in a window, not at once");
        peer.store().set_session(&alive, b"1").await.expect("register again");
        let window = a.timing.window;
        let event = tokio::time::timeout(window * 2, a.next_event()).await;
        assert!(event.is_err(), "back within the window, so nobody is lost: {event:?}");
        assert!(a.suspects.is_empty(), "judged: {:?}", a.suspects);
    }

    /// Two agents form a round; a third, late, waits as a spare and is let into the next one (MAX `max`).
    /// Returns the members of the second round and the late agent with its round.
    async fn a_late_node_joins<B: Backend>(b: &B, max: u32) -> (Vec<(Rendezvous<B::S>, RoundInfo)>, (Rendezvous<B::S>, RoundInfo)) {
        let agents = vec![agent(b, "a", 1, settings(2, max)).await, agent(b, "b", 1, settings(2, max)).await];
        let mut joined = join_all(agents).await;
        let mut late = agent(b, "late", 1, settings(2, max)).await;
        let late_task = tokio::spawn(async move {
            let info = late.next_round().await.expect("late round");
            (late, info)
        });
        for (a, _) in joined.iter_mut() {
            let e = tokio::time::timeout(Duration::from_secs(5), a.next_event()).await.expect("event").expect("ok");
            assert!(matches!(e, RdzvEvent::JoinersWaiting | RdzvEvent::RoundChanged), "{e:?}");
            a.open_next_round().await.expect("open");
        }
        let members: Vec<_> = joined.into_iter().map(|(a, _)| a).collect();
        let again = join_all(members).await;
        let late = tokio::time::timeout(Duration::from_secs(60), late_task)
            .await
            .expect("the late node joined within 60 s")
            .expect("late task");
        (again, late)
    }

    async fn a_late_node_waits_then_joins_the_next_round<B: Backend>(b: B) {
        let (again, (_, late_info)) = a_late_node_joins(&b, 3).await;
        assert_eq!(late_info.group_world_size, 3);
        assert_eq!(late_info.group_rank, 2, "newcomers are appended");
        assert!(again.iter().all(|(_, i)| i.round == late_info.round));
    }

    /// A spare let into a round deletes its waiting key only after it read its assignment: a member that
    /// watches the round meanwhile sees the key, and must not re-form at once for a joiner already in.
    async fn a_spare_let_in_is_not_waited_for_again<B: Backend>(b: B) {
        // The late agent kept: its session ending would be a peer lost.
        let (mut again, (_late, late_info)) = a_late_node_joins(&b, 4).await;
        assert_eq!(late_info.group_world_size, 3);
        // The key as the spare wrote it when the first round was sealed without it, not yet deleted.
        let (a, info) = &mut again[0];
        let stale = (info.round - 1).to_string();
        a.store().set(&a.key("waiting/late"), stale.as_bytes()).await.expect("set");
        // Three last calls: a joiner counted would have re-formed the group at once (it fills MAX).
        let event = tokio::time::timeout(Duration::from_millis(900), a.next_event()).await;
        assert!(event.is_err(), "a member re-formed for a spare already in the group: {event:?}");
        a.store().set(&a.key("waiting/late"), info.round.to_string().as_bytes()).await.expect("set");
        let e = tokio::time::timeout(Duration::from_secs(5), a.next_event()).await.expect("event").expect("ok");
        assert_eq!(e, RdzvEvent::JoinersWaiting, "a spare left out of this round is waited for");
    }

    async fn a_different_launch_is_refused<B: Backend>(b: B) {
        let _first = agent(&b, "a", 1, settings(1, 2)).await;
        let me = NodeInfo { id: "b".into(), addr: "h".into(), nproc: 1 };
        let mut other = Rendezvous::new(b.connect().await, settings(1, 2), me, fingerprint("other.py", &settings(1, 2)));
        let err = other.register().await.expect_err("mismatch");
        assert!(err.to_string().contains("other.py") && err.to_string().contains("train.py"), "{err}");
    }

    async fn a_different_nnodes_is_refused<B: Backend>(b: B) {
        let _first = agent(&b, "a", 1, settings(2, 4)).await;
        let me = NodeInfo { id: "b".into(), addr: "h".into(), nproc: 1 };
        let mut other = Rendezvous::new(b.connect().await, settings(2, 3), me, fingerprint("train.py", &settings(2, 3)));
        // Refused at once rather than waiting for a round it can never fit.
        let err = tokio::time::timeout(Duration::from_secs(5), other.register()).await.expect("refused in time");
        let err = err.expect_err("mismatch").to_string();
        assert!(err.contains("--nnodes 2:3 (the job uses 2:4)") && !err.contains('\n'), "{err}");
    }

    /// With the default 30 s last call, a joiner that brings the group to MAX is let in at once: nothing is
    /// left to batch.
    async fn a_joiner_that_fills_max_reforms_at_once<B: Backend>(b: B) {
        let agents = vec![agent(&b, "a", 1, settings(2, 3)).await, agent(&b, "b", 1, settings(2, 3)).await];
        let mut joined = join_all(agents).await;
        let slow = |mut s: Settings| {
            s.last_call_timeout = Duration::from_secs(30);
            s
        };
        for (a, _) in joined.iter_mut() {
            a.settings = slow(a.settings.clone());
        }
        let mut late = agent(&b, "late", 1, slow(settings(2, 3))).await;
        let reformed = async {
            let late_task = tokio::spawn(async move { late.next_round().await.expect("late round") });
            for (a, _) in joined.iter_mut() {
                let e = a.next_event().await.expect("event");
                assert!(matches!(e, RdzvEvent::JoinersWaiting | RdzvEvent::RoundChanged), "{e:?}");
                a.open_next_round().await.expect("open");
            }
            let again = join_all(joined.into_iter().map(|(a, _)| a).collect()).await;
            (again, late_task.await.expect("late task"))
        };
        // Far below the last call: only an immediate re-formation finishes in time.
        let (again, late_info) = tokio::time::timeout(Duration::from_secs(5), reformed).await.expect("re-formed at once");
        assert_eq!(late_info.group_world_size, 3);
        assert!(again.iter().all(|(_, i)| i.round == late_info.round && i.group_world_size == 3));
    }

    /// A node opens the next round (a failure of its own), then drains before it joins it (its health gate
    /// failed): the round it was counted in expects one node fewer. The others, with a 30 s last call, are
    /// sealed at once, whether they joined before it left (it seals) or after (they see the count lowered).
    async fn a_node_that_drains_after_opening_a_round_is_not_waited_for<B: Backend>(b: B) {
        drains_after_opening(b, true).await;
    }

    async fn a_node_that_drains_before_the_others_join_is_not_waited_for<B: Backend>(b: B) {
        drains_after_opening(b, false).await;
    }

    async fn drains_after_opening<B: Backend>(b: B, others_in_first: bool) {
        let mut joined = three_in_one_round(&b).await;
        for (a, _) in joined.iter_mut() {
            a.settings.last_call_timeout = Duration::from_secs(30);
        }
        let (mut leaver, info) = joined.pop().expect("three");
        leaver.open_next_round().await.expect("open");
        let slot = leaver.key(&format!("r/{}/slot", info.round + 1));
        let others = tokio::spawn(join_all(joined.into_iter().map(|(a, _)| a).collect()));
        if others_in_first {
            while leaver.store.add(&slot, 0).await.expect("slots") < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        leaver.leave().await.expect("leave");
        // Far below the last call: only a round sealed at once finishes in time.
        let again = tokio::time::timeout(Duration::from_secs(5), others).await.expect("sealed at once").expect("join task");
        let rounds: Vec<&RoundInfo> = again.iter().map(|(_, i)| i).collect();
        assert!(rounds.iter().all(|i| i.round == info.round + 1 && i.group_world_size == 2), "{rounds:?}");
    }

    /// Requests of the members are dropped midway, at many points (a published wait and an event wait
    /// cancelled by a timeout, a heartbeat write that took too long); the group still sees the next membership
    /// change, re-forms, and its new rank 0's publication reaches the other.
    async fn requests_dropped_midway_leave_the_group_able_to_reform<B: Backend>(b: B) {
        let mut joined = three_in_one_round(&b).await;
        for (a, _) in joined.iter_mut().take(2) {
            let beat = a.key(&format!("hb/{}", a.me().id));
            for us in (0..2000).step_by(37) {
                let cut = Duration::from_micros(us);
                let published = tokio::time::timeout(cut, a.wait_published("master", Duration::from_secs(600))).await;
                assert!(published.is_err(), "nothing was published or changed: {published:?}");
                let event = tokio::time::timeout(cut, a.next_event()).await;
                assert!(event.is_err(), "nothing changed: {event:?}");
                let _ = tokio::time::timeout(cut, a.store().set(&beat, us.to_string().as_bytes())).await;
            }
        }
        let (gone, _) = joined.pop().expect("three agents");
        drop(gone);
        let bounded = async {
            for (a, _) in joined.iter_mut() {
                if a.next_event().await.expect("event") != RdzvEvent::RoundChanged {
                    a.open_next_round().await.expect("open");
                }
            }
            let again = join_all(joined.into_iter().map(|(a, _)| a).collect()).await;
            let (first, mut second): (Vec<_>, Vec<_>) = again.into_iter().partition(|(_, i)| i.group_rank == 0);
            first[0].0.publish("master", b"29500 node-a").await.expect("publish");
            let got = second[0].0.wait_published("master", Duration::from_secs(5)).await.expect("ok");
            assert_eq!(got, Published::Value(b"29500 node-a".to_vec()));
            assert_eq!(second[0].1.group_world_size, 2);
        };
        tokio::time::timeout(Duration::from_secs(20), bounded).await.expect("re-formed instead of hanging");
    }

    /// A joiner writes no heartbeat until its round is sealed (nobody watches a joiner's beats, and the beats
    /// of thousands of joiners were most of a long round's writes); in the round it beats.
    async fn a_joiner_beats_only_once_its_round_is_sealed<B: Backend>(b: B) {
        let a = agent(&b, "a", 1, settings(2, 2)).await;
        let observer = b.connect().await;
        let beat = a.key("hb/a");
        let record = a.key("r/0/m/1");
        let joining = tokio::spawn(join_all(vec![a]));
        assert!(observer.wait(&record, Duration::from_secs(10)).await.expect("wait"), "joining");
        // Long enough for beats to show, were any written.
        tokio::time::sleep(settings(2, 2).keep_alive_interval * 2).await;
        assert_eq!(observer.get(&beat).await.expect("get"), None, "no beat while joining");
        let c = agent(&b, "c", 1, settings(2, 2)).await;
        let (mut first, others) = tokio::join!(joining, join_all(vec![c]));
        assert!(first.as_mut().is_ok_and(|j| j.len() == 1) && others.len() == 1, "both in the round");
        assert!(observer.wait(&beat, Duration::from_secs(10)).await.expect("wait"), "a beat in the round");
    }

    async fn too_few_nodes_time_out_and_closed_jobs_refuse<B: Backend>(b: B) {
        let mut s = settings(2, 2);
        s.join_timeout = Duration::from_millis(500);
        let mut lonely = agent(&b, "a", 1, s).await;
        let err = lonely.next_round().await.expect_err("timeout");
        assert!(matches!(err, RdzvError::Timeout { joined: 1, min: 2, .. }), "{err}");
        lonely.close(None).await.expect("close");
        let mut late = agent(&b, "b", 1, settings(2, 2)).await;
        assert!(matches!(late.next_round().await, Err(RdzvError::Closed(_))));
    }

    pub(in crate::rendezvous) async fn tcp() -> Tcp {
        Tcp(Server::bind(SocketAddr::from(([127, 0, 0, 1], 0)), ServerConfig::default()).await.expect("bind"))
    }

    pub(in crate::rendezvous) fn memory() -> Memory {
        Memory(MemoryStore::new())
    }

    macro_rules! suite {
        ($($name:ident),*) => {
            mod memory_store {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::memory()).await })*
            }
            mod tcp_store {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::tcp().await).await })*
            }
            mod etcd_store {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::Etcd(crate::store::etcd::testing::TestEtcd::start())).await })*
            }
            mod kube_store {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name(super::Kube::start()).await })*
            }
        };
    }

    suite!(
        forms_a_round_with_prefix_sum_ranks,
        seals_after_the_last_call_with_min_nodes,
        a_lost_peer_is_seen_and_the_group_reforms,
        group_rank_0_lost_before_publishing_reforms_the_others,
        a_hung_peer_is_evicted_by_its_neighbours,
        a_neighbour_gone_at_a_rewatch_after_an_outage_gets_a_window,
        a_slot_without_a_record_does_not_hold_a_complete_round,
        a_late_node_waits_then_joins_the_next_round,
        a_spare_let_in_is_not_waited_for_again,
        a_different_launch_is_refused,
        a_different_nnodes_is_refused,
        a_joiner_that_fills_max_reforms_at_once,
        a_node_that_drains_after_opening_a_round_is_not_waited_for,
        a_node_that_drains_before_the_others_join_is_not_waited_for,
        requests_dropped_midway_leave_the_group_able_to_reform,
        a_joiner_beats_only_once_its_round_is_sealed,
        too_few_nodes_time_out_and_closed_jobs_refuse
    );
}
