//! What the health-gate tests share: a one-node job on `tests/fixtures/incident_worker.py` whose
//! `--on-node-fault` hook writes the fault's `MUSTER_FAULT_*` variables to `DIR/hook.env`, and what a node
//! that failed its gate must show.

use std::path::Path;

use super::cluster::{starts, Agent, AgentArgs, Start, LONG};
use super::{alive, eventually, fixture};

/// The command line of a node hosting its own one-node job of `nproc` workers, `opts` added, its workers and
/// hook writing to `dir`.
pub fn hooked_node(dir: &Path, nproc: u32, opts: &[&str]) -> Vec<String> {
    let hook = format!("env | grep '^MUSTER_FAULT_' > {}", dir.join("hook.env").display());
    AgentArgs::c10d(1, "127.0.0.1:0")
        .nproc(nproc)
        .conf("is_host=1")
        .opts(["--on-node-fault", &hook])
        .opts(opts)
        .script(fixture("incident_worker.py"))
        .arg(dir)
        .build()
}

/// The node failed check `check`, having seen `saw`: exit 75, the line, the hook run with the check's name,
/// no worker started. Returns what the hook was given.
pub fn expect_gate_failed(agent: &mut Agent, dir: &Path, check: &str, saw: &str) -> String {
    assert_eq!(agent.exit_code(LONG), Some(75), "{check}: {}", agent.log());
    let line = format!("health check '{check}' failed: {saw}");
    assert!(agent.log().contains(&line), "{check}: no {line:?} in\n{}", agent.log());
    let env = std::fs::read_to_string(dir.join("hook.env")).expect("the hook ran");
    assert!(env.contains(&format!("MUSTER_FAULT_KIND={check}")), "{check}: {env}");
    assert!(starts(dir).is_empty(), "{check}: a worker started on a node that failed its gate");
    env
}

/// A link dropped while the workers of `world` ran, the agent having seen `saw`. With `drain`: exit 75, the
/// line, the hook with `network`, the workers gone. Without: the drop said once, the workers alive through
/// it; `heal` runs, then the job finishes (exit 0).
pub fn expect_link_drop(agent: &mut Agent, dir: &Path, world: &[Start], saw: &str, drain: bool, heal: impl FnOnce()) {
    if drain {
        assert_eq!(agent.exit_code(LONG), Some(75), "{}", agent.log());
        let line = format!("health check 'network' failed: {saw}; links that stay up (--on-link-drop drain)");
        assert!(agent.log().contains(&line), "no {line:?} in\n{}", agent.log());
        let hook = std::fs::read_to_string(dir.join("hook.env")).expect("the hook ran");
        assert!(hook.contains("MUSTER_FAULT_KIND=network"), "{hook}");
        assert!(world.iter().all(|s| !alive(s.pid)), "a worker outlived the drain");
        return;
    }
    let said = format!("network: {saw}; training goes on (--on-link-drop report)");
    assert!(eventually(LONG, || agent.log().contains(&said)), "no {said:?} in\n{}", agent.log());
    heal();
    assert!(world.iter().all(|s| alive(s.pid)), "a worker ended on a reported drop: {}", agent.log());
    std::fs::write(dir.join("finish"), "").expect("finish");
    assert_eq!(agent.exit_code(LONG), Some(0), "{}", agent.log());
    assert_eq!(agent.log().matches(&said).count(), 1, "one drop, said once: {}", agent.log());
}
