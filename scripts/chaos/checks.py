"""The end-of-run checks: the job's last step, the final checkpoint, nothing left running, every restart
caused by an injected event, the restart budget honoured; and the summary table."""

import collections
import glob
import os

from cluster import cmdline, marked_pids, wait_until

# A restart this long after an event's recovery still belongs to it (the event log's last transition and
# the driver's clock are read a moment apart).
SLACK_S = 2.0


def restarts(agent):
    """(time of the stop that caused it, restart_count after it) for every restart an incarnation spent."""
    out, spent, stop_t = [], 0, None
    for e in agent.transitions():
        if e["to"] == "stopping":
            stop_t = e["t"]
        if e["to"] == "restarting" and e.get("restart_count", 0) > spent:
            spent = e["restart_count"]
            out.append((stop_t if stop_t is not None else e["t"], spent))
    return out


def reforms(agent):
    return sum(1 for e in agent.transitions() if e["to"] == "restarting")


def cause_of(t, events):
    """The latest injected event whose window holds time `t` (windows overlap by the slack)."""
    for ev in reversed(events):
        if ev["t0"] - 0.5 <= t <= ev["recovered"] + SLACK_S:
            return ev
    return None


def check_all(cluster, events, a):
    """Returns a list of (check, ok, detail)."""
    results = []
    finals = list(cluster.agents.values())
    codes = {ag.name: ag.exit_code for ag in cluster.history}
    bad_final = {ag.name: ag.exit_code for ag in finals if ag.exit_code != 0}
    results.append(("every final agent exited 0", not bad_final, bad_final or f"{len(finals)} agents"))
    bad_old = {ag.name: ag.exit_code for ag in cluster.history if ag not in finals and ag.exit_code not in (-9, 75)}
    results.append(("replaced agents ended by SIGKILL or drain (75)", not bad_old, bad_old or "ok"))

    done = f"done: steps={a.steps} "
    outs = [p for p in glob.glob(os.path.join(cluster.run_dir, "*", "stdout")) if done in open(p, errors="replace").read()]
    results.append(("the job reached its last step", bool(outs), outs[0] if outs else f"no '{done}' in any stdout"))

    results.append(check_checkpoint(cluster, a))

    wait_until(5, lambda: not marked_pids(cluster.run_id))
    left = {pid: cmdline(pid)[:80] for pid in marked_pids(cluster.run_id)}
    results.append(("no process of the run is left", not left, left or "none"))

    uncaused, by_event = [], collections.Counter()
    for ag in cluster.history:
        for t, count in restarts(ag):
            ev = cause_of(t, events)
            if ev is None:
                uncaused.append(f"{ag.name} restart {count} at {t:.3f}")
            else:
                ev["restarts"].append(ag.name)
                by_event[ev["kind"]] += 1
    results.append(("every restart has a cause", not uncaused, uncaused or f"{sum(by_event.values())} mapped"))

    over = {ag.name: n for ag in cluster.history if (n := len(restarts(ag))) > a.max_restarts}
    results.append((f"restart budget honoured (<= {a.max_restarts} per agent)", not over, over or "ok"))
    missing = [f"#{ev['i']} {ev['kind']} {ev['node']}" for ev in events
               if ev["kind"] in ("kill_worker", "xid13", "store_mid_reform") and ev["node"] not in {n.split(".")[0] for n in ev["restarts"]}]
    results.append(("each worker kill / XID 13 spent a restart on its node", not missing, missing or "ok"))
    return results, codes


def check_checkpoint(cluster, a):
    path = os.path.join(cluster.ckpt_dir, "checkpoint.pt")
    try:
        import torch
        state = torch.load(path, map_location="cpu")
        ok = state["step"] == a.steps and "model" in state and "optimizer" in state
        return ("the final checkpoint loads", ok, f"{path}: step {state['step']}")
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        return ("the final checkpoint loads", False, f"{path}: {e}")


def summary(cluster, events, results, duration):
    lines = ["", "== chaos summary: seed %d, %d events, %.0f s ==" % (cluster.a.seed, len(events), duration)]
    kinds = collections.Counter(ev["kind"] for ev in events)
    lines.append(f"{'event':<14} {'count':>5} {'restarts':>8} {'re-form s (max)':>16}")
    for kind in sorted(kinds):
        evs = [ev for ev in events if ev["kind"] == kind]
        rs = sum(len(ev["restarts"]) for ev in evs)
        worst = max(max(ev["reformed"] - ev["t0"], 0) for ev in evs)
        lines.append(f"{kind:<14} {kinds[kind]:>5} {rs:>8} {worst:>16.1f}")
    total_restarts = sum(len(restarts(ag)) for ag in cluster.history)
    total_reforms = sum(reforms(ag) for ag in cluster.history)
    lines.append(f"agents started: {len(cluster.history)}; restarts spent: {total_restarts}; "
                 f"re-formations (restarting transitions): {total_reforms}; store starts: {cluster.store.starts}")
    for name, ok, detail in results:
        lines.append(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    return "\n".join(lines)
