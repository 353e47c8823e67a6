"""The training table of scripts/bench/recovery.sh (which documents it): how soon the survivors train again.

Two agents of two gloo workers each on loopback (c10d, --nnodes 1:2, --max-restarts 3), a fresh job per run,
scripts/bench/inplace_worker.py as the worker: each start loads a checkpoint of CKPT_MB megabytes, then
trains, one step every 20 ms. Faults: a worker exits 1 (crash: the job goes on in a world of 4) or the
second agent is SIGKILLed (agent-kill: a world of 2). Measured: the time from the fault to the first step of
a group formed after it, in the expected world. Launchers: torchrun, muster (--in-place off), muster-warm
(--in-place off --warm-spares), muster-inplace (in place, --warm-spares); the warm spares import
torch.distributed and torch._dynamo (what an optimizer's first construction imports).
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import jobs

LAUNCHERS = ("torchrun", "muster", "muster-warm", "muster-inplace")
SCENARIOS = {"crash": 4, "agent-kill": 2}
WARM = "--warm-spares=torch.distributed,torch._dynamo"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--muster", required=True)
    p.add_argument("--torchrun", required=True)
    p.add_argument("--api", required=True, help="the folder muster_inplace is imported from under torchrun")
    p.add_argument("--work", required=True)
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--ckpt-mb", type=int, default=300)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--warm-wait", type=float, default=6.0)
    p.add_argument("--model", choices=["small", "big"], default="small",
                   help="the workers' model: big is 101M parameters with AdamW (1.2 GB of state)")
    return p.parse_args()


def worker_script():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "inplace_worker.py")


def steps(dir):
    """(time, world, generation) of every step logged."""
    out = []
    try:
        lines = open(os.path.join(dir, "steps")).read().splitlines()
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) == 3:
            out.append((float(f[0]), int(f[1]), float(f[2])))
    return out


def wait(f, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = f()
        if v is not None:
            return v
        time.sleep(0.02)
    return None


class Job:
    def __init__(self, args, launcher, dir, checkpoint):
        self.args, self.launcher, self.dir, self.checkpoint = args, launcher, dir, checkpoint
        os.makedirs(dir)
        self.agents = []

    def start(self):
        a = self.args
        run_id = f"inplace{os.getpid()}{int(time.time() * 1000) % 10**9}"
        common = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-id={run_id}", "--max-restarts=3"]
        if self.launcher in ("muster", "muster-warm"):
            common.append("--in-place=off")
        if self.launcher in ("muster-warm", "muster-inplace"):
            common += [WARM, "--warm-spares-delay=0"]
        script = [worker_script(), self.dir, self.checkpoint]
        env = dict(os.environ)
        if self.launcher == "torchrun":
            env["PYTHONPATH"] = ":".join(filter(None, [env.get("PYTHONPATH"), a.api]))
            port = jobs.free_port()
            for node, conf in (("a", "is_host=1"), ("b", "is_host=0")):
                self.spawn(node, [a.torchrun, *common, f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-conf={conf}", *script], env)
            return
        self.spawn("a", [a.muster, *common, "--rdzv-endpoint=127.0.0.1:0", "--rdzv-conf=is_host=1", *script], env)
        port = wait(lambda: jobs.hosted_port(os.path.join(self.dir, "a.log")), 60)
        if port is None:
            sys.exit(f"inplace_recovery: the first muster agent reported no store port; see {self.dir}/a.log")
        self.spawn("b", [a.muster, *common, f"--rdzv-endpoint=127.0.0.1:{port}", *script], env)

    def spawn(self, node, cmd, env):
        log = open(os.path.join(self.dir, f"{node}.log"), "w")
        self.agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))

    def stop(self):
        open(os.path.join(self.dir, "finish"), "w").close()
        jobs.stop(self.agents, self.dir)


def one(args, launcher, scenario, run, checkpoint):
    """Seconds from the fault to the first step of a group formed after it, or None (not within the timeout)."""
    job = Job(args, launcher, os.path.join(args.work, f"{launcher}-{scenario}-{run}"), checkpoint)
    try:
        job.start()
        if wait(lambda: next((1 for _, w, _ in steps(job.dir) if w == 4), None), 180) is None:
            sys.exit(f"inplace_recovery: {launcher}: the job never trained in a world of 4; see {job.dir}")
        time.sleep(1 + (args.warm_wait if launcher in ("muster-warm", "muster-inplace") else 0))
        t0 = time.time()
        if scenario == "crash":
            open(os.path.join(job.dir, "crash"), "w").close()
        else:
            os.killpg(job.agents[1].pid, signal.SIGKILL)
        world = SCENARIOS[scenario]
        first = wait(lambda: next((t for t, w, g in steps(job.dir) if g > t0 and w == world), None), args.timeout)
        return None if first is None else first - t0
    finally:
        job.stop()


def seconds(value, timeout):
    return f"{value:.2f} s" if value != float("inf") else f"no step in {timeout:g} s"


def p95(values):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]


def main():
    args = parse_args()
    # The workers inherit it through their agents.
    os.environ["BENCH_MODEL"] = args.model
    os.makedirs(args.work, exist_ok=True)
    checkpoint = os.path.join(args.work, f"checkpoint-{args.ckpt_mb}mb.pt")
    import torch
    torch.save(torch.randn(args.ckpt_mb * 2**20 // 64, 16), checkpoint)
    results = {}
    for scenario in args.scenarios.split(","):
        for launcher in args.launchers.split(","):
            if launcher not in LAUNCHERS or scenario not in SCENARIOS:
                sys.exit(f"inplace_recovery: unknown launcher '{launcher}' or scenario '{scenario}'")
            got = []
            for run in range(1, args.runs + 1):
                s = one(args, launcher, scenario, run, checkpoint)
                got.append(s)
                print(f"  {launcher:15} {scenario:11} run {run}/{args.runs}: "
                      + (f"{s * 1000:8.1f} ms" if s is not None else f"no step within {args.timeout:g} s"), flush=True)
            results[(launcher, scenario)] = got
    print()
    print(f"fault -> the survivors' first step, each start loading a {args.ckpt_mb} MB checkpoint "
          f"(median / p95 of {args.runs} runs; a run that did not recover counts as slower than any)")
    print(f"| scenario | " + " | ".join(args.launchers.split(",")) + " |")
    print("|---|" + "---|" * len(args.launchers.split(",")))
    for scenario in args.scenarios.split(","):
        cells = []
        for launcher in args.launchers.split(","):
            got = [s if s is not None else float("inf") for s in results[(launcher, scenario)]]
            cells.append(" / ".join(seconds(v, args.timeout) for v in (statistics.median(got), p95(got))))
        print(f"| {scenario} | " + " | ".join(cells) + " |")
    print()
    for scenario, what in (("agent-kill", "a peer's loss"), ("crash", "a worker's death")):
        got = results.get(("muster-inplace", scenario))
        if got:
            m = statistics.median([s if s is not None else float("inf") for s in got])
            print(f"goal: the survivors' first step within 1 s of {what}, muster-inplace: "
                  + ("met" if m < 1 else "NOT MET") + f" (median {m * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
