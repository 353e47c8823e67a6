"""Chaos driver (run by scripts/chaos.sh): four muster agents x two workers training examples/train.py
against an external `muster store`, while a seeded random schedule kills, stops and faults them.

After each event the driver waits (with a deadline) until every node runs again and the event logs are
quiet, so each restart falls in exactly one event's window; then it waits a random interval and goes on.
At the end it releases the job (the hold file) and checks what checks.py lists. Exit 0 only if all hold.
Everything it started is killed on every exit path.
"""

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checks import check_all, summary  # noqa: E402
from cluster import Cluster, now, wait_until  # noqa: E402
from faults import EXTRA_KINDS, KINDS, Faults  # noqa: E402

NODES = ["n0", "n1", "n2", "n3"]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/chaos.sh", description=__doc__)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--events", type=int, required=True)
    p.add_argument("--muster", required=True, help="the muster binary")
    p.add_argument("--fake-nvml", required=True, help="the fake libnvidia-ml.so")
    p.add_argument("--train", required=True, help="examples/train.py")
    p.add_argument("--work-dir", default=None, help="where the run's logs go (default: a new temp dir)")
    p.add_argument("--interval", type=float, nargs=2, default=[1.0, 5.0], metavar=("MIN", "MAX"),
                   help="seconds between one event's recovery and the next event")
    p.add_argument("--recover-timeout", type=float, default=180.0, help="deadline for the job to re-form")
    p.add_argument("--settle", type=float, default=3.0, help="seconds of quiet event logs that count as settled")
    p.add_argument("--only", action="append", choices=KINDS + EXTRA_KINDS, metavar="KIND",
                   help=f"draw events of this kind only (repeatable; one of {', '.join(KINDS + EXTRA_KINDS)})")
    a = p.parse_args(argv)
    if a.seed < 0 or a.events < 1 or a.interval[0] < 0 or a.interval[1] < a.interval[0]:
        p.error("--seed must be >= 0, --events >= 1, --interval MIN <= MAX")
    a.nnodes, a.nproc = "2:4", 2
    a.max_restarts = 2 * a.events + 2  # collateral restarts (a peer's worker dying mid-collective) included
    a.steps, a.ckpt_every, a.step_sleep = 400, 10, 0.05
    a.last_call_timeout, a.keep_alive_interval, a.keep_alive_max_attempt = 1, 1, 3
    return a


class Run:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.dir = a.work_dir or tempfile.mkdtemp(prefix=f"muster-chaos-s{a.seed}-")
        os.makedirs(self.dir, exist_ok=True)
        self.journal = open(os.path.join(self.dir, "chaos.jsonl"), "w")
        self.cluster = Cluster(a, self.dir, self.log)
        self.faults = Faults(self.cluster, self.rng, self.log)
        self.events = []
        self.t_start = now()

    def log(self, what, msg, **fields):
        t = now()
        print(f"[chaos {t - self.t_start:8.2f}s] {what}: {msg}", flush=True)
        self.journal.write(json.dumps(dict(t=t, what=what, msg=msg, **fields)) + "\n")
        self.journal.flush()

    def wait_settled(self, since, changed, what):
        t = wait_until(self.a.recover_timeout, lambda: self.cluster.settled(since, changed, self.a.settle), poll=0.2)
        if not t:
            raise RuntimeError(f"{what}: the job did not re-form within {self.a.recover_timeout} s; "
                               f"states {self.cluster.state()}")
        return t

    def start(self):
        self.log("run", f"dir {self.dir}; seed {self.a.seed}; {self.a.events} events"
                        f"{' of ' + ', '.join(self.a.only) if self.a.only else ''}; max_restarts {self.a.max_restarts}")
        self.cluster.store.start()
        for node in NODES:
            self.cluster.start_agent(node)
        self.wait_settled(0, False, "start")
        self.log("run", "all four nodes running")

    def one_event(self, i):
        kind = self.rng.choice(self.a.only or KINDS)
        t0 = now()
        fill_before = bool(self.faults.idle)
        node, detail, changed = self.faults.inject(kind)
        self.log("event", f"#{i} {kind} {node or '-'}: {detail}", i=i, kind=kind, node=node)
        if fill_before and kind != "fill_port":
            self.faults.close_idle()
        reformed = self.wait_settled(t0, changed, f"event #{i} {kind}")
        self.events.append(dict(i=i, kind=kind, node=node, detail=detail, t0=t0, reformed=reformed,
                                recovered=now(), restarts=[]))
        self.log("recovered", f"#{i} {kind}: running again {max(reformed - t0, 0):.1f} s after the event")

    def finish(self):
        self.faults.close_idle()
        os.unlink(self.cluster.hold_file)
        self.log("run", "events done; the job may finish now")
        ok = wait_until(self.a.recover_timeout, lambda: all(not ag.alive() for ag in self.cluster.agents.values()))
        self.cluster.reap()
        if not ok:
            self.log("run", f"agents still running {self.a.recover_timeout} s after release: {self.cluster.state()}")
        self.cluster.store.stop()

    def main(self):
        self.start()
        for i in range(self.a.events):
            self.one_event(i)
            time.sleep(self.rng.uniform(*self.a.interval))
        self.finish()
        results, _ = check_all(self.cluster, self.events, self.a)
        print(summary(self.cluster, self.events, results, now() - self.t_start), flush=True)
        print(f"logs: {self.dir}", flush=True)
        return 0 if all(ok for _, ok, _ in results) else 1


def main(argv):
    a = parse_args(argv)
    run = Run(a)

    def on_signal(sig, _frame):
        raise SystemExit(128 + sig)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        return run.main()
    except Exception as e:  # noqa: BLE001 - report any failure as the run's result, then clean up
        run.log("error", f"{type(e).__name__}: {e}")
        print(f"chaos: FAILED (seed {a.seed}): {e}; logs: {run.dir}", flush=True)
        return 1
    finally:
        run.faults.close_idle()
        run.cluster.kill_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
