use super::*;
use crate::store::etcd::testing::TestEtcd;

fn args(line: &str) -> RendezvousArgs {
    let argv = ["muster bench", "rendezvous"].into_iter().chain(line.split_whitespace());
    match BenchArgs::try_parse_from(argv) {
        Ok(BenchArgs { command: BenchCommand::Rendezvous(a) }) => a,
        Err(e) => panic!("{line}: {e}"),
    }
}

const HOST: capacity::Host = capacity::Host { open_files: 20000, ephemeral_ports: Some(28232) };

fn plan(line: &str) -> Result<StorePlan, String> {
    store_plan(&args(line), HOST).map_err(|e| e.to_string())
}

#[test]
fn the_backend_and_its_etcd_flags_are_checked_before_anything_starts() {
    assert_eq!(plan("--nodes 64"), Ok(StorePlan::Tcp { max_connections: 128 }));
    assert_eq!(plan("--nodes 64 --backend tcp"), Ok(StorePlan::Tcp { max_connections: 128 }));
    assert_eq!(plan("--nodes 64 --backend etcd"), Ok(StorePlan::EtcdStart { binary: "etcd".into() }));
    assert_eq!(
        plan("--nodes 64 --backend etcd --etcd-binary /opt/etcd-3.5/etcd"),
        Ok(StorePlan::EtcdStart { binary: "/opt/etcd-3.5/etcd".into() })
    );
    let Ok(StorePlan::EtcdAt { target, .. }) = plan("--nodes 64 --backend etcd --etcd-endpoint 127.0.0.1:2379,h2") else {
        panic!("an endpoint list is an etcd already running");
    };
    assert_eq!(target.endpoints, ["127.0.0.1:2379", "h2:2379"]);
    assert_eq!((target.tls, target.namespace.as_str()), (None, "/"));
    assert_eq!(
        plan("--nodes 64 --backend k8s --kubeconfig /k/config --namespace train"),
        Ok(StorePlan::Kube { kubeconfig: "/k/config".into(), namespace: Some("train".into()) })
    );

    for (line, needle) in [
        ("--nodes 64 --etcd-endpoint h:1", "--etcd-endpoint needs --backend etcd"),
        ("--nodes 64 --backend tcp --etcd-binary etcd", "--etcd-binary needs --backend etcd"),
        ("--nodes 64 --backend etcd --etcd-endpoint h:1 --etcd-binary etcd", "give one of them"),
        ("--nodes 64 --backend etcd --etcd-endpoint h:x", "invalid value 'h:x' for '--etcd-endpoint'"),
        ("--nodes 64 --backend etcd --etcd-endpoint ftp://h:1", "'--etcd-endpoint'"),
        (
            "--nodes 7000 --backend etcd --etcd-endpoint a:1,b:1,c:1",
            "--nodes 7000 with --backend etcd needs up to 21000 connections (3 a node, one per member)",
        ),
        ("--nodes 64 --kubeconfig k", "--kubeconfig needs --backend k8s"),
        ("--nodes 64 --backend etcd --namespace n", "--namespace needs --backend k8s"),
        ("--nodes 64 --backend k8s", "--backend k8s needs --kubeconfig PATH"),
        ("--nodes 64 --backend k8s --kubeconfig k --etcd-binary etcd", "need --backend etcd"),
        ("--nodes 5000 --backend k8s --kubeconfig k", "--nodes 5000 with --backend k8s needs up to 20000 connections (4 a node"),
    ] {
        match plan(line) {
            Err(e) => assert!(e.contains(needle), "{line}: {e}"),
            Ok(p) => panic!("{line}: accepted as {p:?}"),
        }
    }
    let unknown = BenchArgs::try_parse_from(["muster bench", "rendezvous", "--nodes", "8", "--backend", "redis"]);
    assert!(unknown.is_err_and(|e| e.to_string().contains("[possible values: tcp, etcd, k8s]")));
}

/// What `--json` prints, as a user's script reads it.
fn report_json(args: &RendezvousArgs) -> serde_json::Value {
    let report = bench_rendezvous(args).unwrap_or_else(|e| panic!("the bench failed: {e}"));
    serde_json::to_value(&report).expect("the report encodes")
}

fn assert_a_sealed_round_of_8(report: &serde_json::Value, store: &str) {
    assert!(report["store"].as_str().is_some_and(|s| s.starts_with(store)), "{report}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    assert_eq!((report["nodes"].as_u64(), report["world_size"].as_u64()), (Some(8), Some(8)), "{report}");
    for field in ["total_ms", "register_ms", "join_ms", "join_p50_ms", "join_p99_ms"] {
        assert!(report[field].as_f64().is_some_and(|v| v >= 0.0), "{field}: {report}");
    }
    let ops = report["ops_per_node"]["mean"].as_f64().unwrap_or(0.0);
    let join_ops = report["join_ops_per_node"]["mean"].as_f64().unwrap_or(f64::MAX);
    assert!(ops > 0.0 && join_ops <= ops, "{report}");
    assert!(report["ops_by_kind"]["set_session"].as_u64().is_some_and(|n| n >= 8), "{report}");
    // etcd's own count: every store operation is at least one request.
    assert!(report["server_per_node"]["requests"].as_f64().is_some_and(|n| n >= ops), "{report}");
    assert!(report["server"]["requests_by_method"]["Txn"].as_u64().is_some_and(|n| n > 0), "{report}");
    assert!(report["server_per_node"]["writes"].as_f64().is_some_and(|n| n > 0.0), "{report}");
}

#[test]
fn eight_nodes_seal_one_round_on_an_etcd_the_user_names() {
    let etcd = TestEtcd::start();
    let report = report_json(&args(&format!("--nodes 8 --backend etcd --etcd-endpoint {} --timeout 60", etcd.endpoint)));
    assert_a_sealed_round_of_8(&report, "etcd ");
    assert!(report["store"].as_str().is_some_and(|s| s.ends_with(&etcd.endpoint)), "{report}");
}

#[test]
fn eight_nodes_seal_one_round_on_an_etcd_the_bench_starts() {
    let binary = std::env::var("MUSTER_ETCD").unwrap_or_else(|_| "etcd".into());
    let report = report_json(&args(&format!("--nodes 8 --backend etcd --etcd-binary {binary} --timeout 60")));
    assert_a_sealed_round_of_8(&report, "etcd ");
    assert!(report["store"].as_str().is_some_and(|s| s.contains(" at 127.0.0.1:")), "{report}");
}
