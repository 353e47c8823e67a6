"""The goodput benchmark's driver (run by scripts/bench/goodput.sh, which documents it).

One job per launcher and seed: two agents of two gloo workers each on loopback (c10d rendezvous, --nnodes
1:2), examples/train_inplace.py with a checkpoint every K steps, a frozen backbone of BACKBONE_MB loaded at
every start, and a step log, and a seeded schedule of faults, one
every T seconds: a worker SIGKILLed, the second agent SIGKILLed, or the second agent leaving (SIGTERM); a
node that went is replaced by a fresh agent R seconds later. The job has STEPS steps; it runs until it
finishes, until DEADLINE_FACTOR times the time it would take fault-free, or until it is stuck (no fault left
to come and no step for STALL seconds).
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import jobs

LAUNCHERS = ("torchrun", "muster", "muster-warm", "muster-inplace")
# What the spares import: torch, and what an optimizer's first construction imports (1.6 s here).
WARM = "--warm-spares=torch,torch._dynamo"
FAULTS = ("crash", "kill", "leave")
PHASES = ("detect", "stop", "rendezvous", "spawn", "warmup", "reform", "finish")  # a recovery's order, then the end


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--muster", required=True)
    p.add_argument("--torchrun", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--api", required=True, help="the folder muster_inplace is imported from under torchrun")
    p.add_argument("--backbone-mb", type=int, default=300)
    p.add_argument("--work", required=True)
    p.add_argument("--launchers", default=",".join(LAUNCHERS))
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--interval", type=float, default=60.0, help="T: seconds between faults")
    p.add_argument("--minutes", type=float, default=10.0, help="M: minutes of faults (the job is sized to them)")
    p.add_argument("--step-sleep", type=float, default=0.2)
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--replace-after", type=float, default=5.0, help="R: seconds before a gone node is replaced")
    p.add_argument("--deadline-factor", type=float, default=2.0)
    p.add_argument("--stall", type=float, default=120.0, help="after the last fault: no step for this long is stuck")
    p.add_argument("--model", default="", help="the training script's model arguments (the 100M model: "
                   "'--width=4096 --layers=7 --optimizer=adamw')")
    p.add_argument("--reference-steps", type=int, default=40,
                   help="steps of the fault-free reference: the plain script under torchrun, whose median step "
                        "time every ETTR is measured against and the jobs are sized by")
    return p.parse_args()


class Job:
    def __init__(self, args, launcher, seed, steps):
        self.args, self.launcher, self.seed, self.steps = args, launcher, seed, steps
        self.dir = os.path.join(args.work, f"{launcher}-{seed}")
        os.makedirs(self.dir, exist_ok=True)
        self.steplog = os.path.join(self.dir, "steps.log")
        self.run_id = f"goodput{os.getpid()}{launcher.replace('-', '')}{seed}"
        self.agents = {}  # name -> Popen
        self.port = None
        self.generation = 0
        self.faults = []  # (time, kind)

    def command(self, name):
        a = self.args
        host = name == "a"
        steps = self.steps
        common = ["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-id={self.run_id}",
                  "--max-restarts=100"]
        if self.launcher in ("muster-warm", "muster-inplace"):
            # Not at once: the spares would import beside the workers' own start, on two cores.
            common += [WARM, "--warm-spares-delay=10"]
        conf = "is_host=1" if host else "is_host=0"
        script = [a.train, f"--steps={steps}", f"--ckpt-every={a.ckpt_every}", f"--step-sleep={a.step_sleep}",
                  f"--step-log={self.steplog}", f"--ckpt-dir={os.path.join(self.dir, 'ckpt')}",
                  f"--backbone-mb={a.backbone_mb}", *a.model.split()]
        if self.launcher == "torchrun":
            return [a.torchrun, *common, f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-conf={conf}", *script]
        endpoint = "127.0.0.1:0" if host else f"127.0.0.1:{self.port}"
        # The agent's own account of its time (the goodput event); cold, the progress pattern lets it time
        # the warm-up, and the hang timeout is long enough never to fire here (in place runs without it).
        own = [f"--event-log={os.path.join(self.dir, name + '.events')}"]
        if self.launcher == "muster-inplace":
            own.append("--in-place=on")
        else:
            own += ["--in-place=off", "--hang-timeout=300", r"--progress-pattern=step \d+"]
        return [a.muster, *common, *own, f"--rdzv-endpoint={endpoint}", f"--rdzv-conf={conf}", *script]

    def start(self, name):
        host = name == "a"
        if host and self.launcher == "torchrun":
            self.port = jobs.free_port()
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        env = dict(os.environ)
        if self.launcher == "torchrun":
            env["PYTHONPATH"] = ":".join(filter(None, [env.get("PYTHONPATH"), self.args.api]))
        self.agents[name] = subprocess.Popen(self.command(name), stdout=log, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True)
        if host and self.launcher != "torchrun":
            self.port = wait_for(lambda: jobs.hosted_port(os.path.join(self.dir, "a.log")), 60, "the host's store port")

    def alive(self, name):
        p = self.agents.get(name)
        return p is not None and p.poll() is None

    def workers(self):
        """The pids of the workers of the latest start of each rank, alive now."""
        latest = {}
        for kind, fields in read_log(self.steplog):
            if kind == "start":
                latest[int(fields[1])] = int(fields[2])
        return [pid for pid in latest.values() if os.path.exists(f"/proc/{pid}")]

    def fault(self, rng, now):
        kind = rng.choice(FAULTS)
        second = [n for n in self.agents if n != "a" and self.alive(n)]
        if kind != "crash" and not second:
            kind = "crash"
        if kind == "crash":
            pids = self.workers()
            if not pids:
                return None
            os.kill(rng.choice(pids), signal.SIGKILL)
        else:
            name = second[0]
            os.killpg(self.agents[name].pid, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        self.faults.append((now, kind))
        return kind

    def replace(self):
        self.generation += 1
        self.start(f"b{self.generation}")

    def stop(self):
        # The step log's path is this job's own.
        jobs.stop(list(self.agents.values()), f"--step-log={self.steplog}")


def wait_for(f, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = f()
        if v:
            return v
        time.sleep(0.05)
    sys.exit(f"goodput: no {what} within {timeout} s")


def last_step(path):
    return max((float(f[0]) for kind, f in read_log(path) if kind == "step"), default=0.0)


def read_log(path):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        f = line.split()
        if f and f[0] in ("start", "step"):
            out.append((f[0], f[1:]))
    return out


def reference(args):
    """The plain script's fault-free step time under torchrun (the API does nothing there): the median gap
    between its steps over `--reference-steps`, the first few (warm-up) left out."""
    job = Job(args, "torchrun", "reference", args.reference_steps)
    job.start("a")
    job.start("b")
    wait_for(lambda: not job.alive("a"), 60 + 60 * args.reference_steps, "end of the fault-free reference")
    job.stop()
    times = [float(f[0]) for kind, f in read_log(job.steplog) if kind == "step"][3:]
    gaps = [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        sys.exit(f"goodput: the fault-free reference made no steps (see {job.dir})")
    return statistics.median(gaps)


def run(args, launcher, seed, clean):
    # Sized so that a fault-free run of the plain script takes about M minutes.
    job = Job(args, launcher, seed, max(10, int(args.minutes * 60 / clean)))
    rng = random.Random(seed)
    began = time.time()
    job.start("a")
    job.start("b")
    wait_for(lambda: any(k == "step" for k, _ in read_log(job.steplog)), 180, "first step")
    clean_wall = job.steps * clean
    deadline = began + clean_wall * args.deadline_factor
    next_fault = began + args.interval
    last_fault = began + args.minutes * 60
    pending_replace = None
    finished = False
    while time.time() < deadline:
        now = time.time()
        if not job.alive("a"):
            finished = job.agents["a"].returncode == 0
            break
        if now > last_fault + args.stall and now - last_step(job.steplog) > args.stall:
            break  # stuck: no fault is left to come, and no step came for STALL seconds
        if pending_replace and now >= pending_replace:
            job.replace()
            pending_replace = None
        if now >= next_fault and now <= last_fault:
            kind = job.fault(rng, now)
            if kind in ("kill", "leave"):
                pending_replace = now + args.replace_after
            next_fault += args.interval
        time.sleep(0.05)
    ended = time.time()
    job.stop()
    # A job that did not finish had the whole window to train in.
    window = ended - began if finished else max(ended - began, args.minutes * 60)
    return analyse(job, window, finished, clean)


def analyse(job, wall, finished, reference_step):
    events = read_log(job.steplog)
    steps, attempts = [], []  # (time, step, attempt)
    attempt = 0
    restarts = 0
    for kind, f in events:
        if kind == "start" and f[1] == "0":
            attempt += 1
            attempts.append(float(f[0]))
            restarts = max(restarts, int(f[3]))
        elif kind == "step":
            steps.append((float(f[0]), int(f[1]), attempt))
    # Steps redone after a checkpoint restore are not new: the useful ones are the furthest step reached.
    useful = max((s for _, s, _ in steps), default=0)
    gaps = [b[0] - a[0] for a, b in zip(steps, steps[1:]) if a[2] == b[2]]
    clean = statistics.median(gaps) if gaps else float("nan")
    recover = []
    for t, kind in job.faults:
        at_fault = max((a for tt, _, a in steps if tt <= t), default=0)
        after = [tt for tt, _, a in steps if tt > t and a != at_fault]
        later = [tt for tt, _, _ in steps if tt > t]
        first = after[0] if after else (later[0] if later else None)
        recover.append(first - t if first else float("inf"))
    finite = sorted(r for r in recover if r != float("inf"))
    return {
        "launcher": job.launcher, "seed": job.seed, "ettr": useful * reference_step / wall if wall > 0 else 0.0,
        "reference_step_s": reference_step, "clean_step_s": clean, "useful_steps": useful, "wall_s": wall, "faults": len(job.faults),
        "fault_kinds": [k for _, k in job.faults],
        "recover_mean_s": statistics.mean(finite) if finite else None,
        "recover_p95_s": finite[min(len(finite) - 1, int(round(0.95 * (len(finite) - 1))))] if finite else None,
        "never_recovered": len(recover) - len(finite), "attempts": attempt, "max_restart_count": restarts,
        "finished": finished, "redone_steps": len(steps) - useful,
        "agent_a": own_account(os.path.join(job.dir, "a.events")),
    }


def own_account(path):
    """Node a's last goodput event (muster only): its training and lost seconds by phase."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    events = [json.loads(line) for line in lines if '"muster.agent.goodput"' in line]
    if not events:
        return None
    e = events[-1]
    return {"goodput": e["goodput"], "productive_s": e["productive_s"], "wall_s": e["wall_s"], "lost": e["lost"]}


def table(results):
    """One row per launcher, the seeds' means (p95: the worst seed's)."""
    rows = ["| launcher | ETTR | fault → first step, mean | p95 | never recovered | restarts (node a) | finished |",
            "|---|---|---|---|---|---|---|"]
    for launcher in dict.fromkeys(r["launcher"] for r in results):
        rs = [r for r in results if r["launcher"] == launcher]
        means = [r["recover_mean_s"] for r in rs if r["recover_mean_s"] is not None]
        p95s = [r["recover_p95_s"] for r in rs if r["recover_p95_s"] is not None]
        rows.append("| {} | {:.1f}% | {} | {} | {} of {} | {:.1f} | {} of {} |".format(
            launcher, 100 * statistics.mean(r["ettr"] for r in rs),
            f"{statistics.mean(means):.2f} s" if means else "-", f"{max(p95s):.2f} s" if p95s else "-",
            sum(r["never_recovered"] for r in rs), sum(r["faults"] for r in rs),
            statistics.mean(r["max_restart_count"] for r in rs), sum(r["finished"] for r in rs), len(rs)))
    return "\n".join(rows)


def account_table(results):
    """Where node a's wall time went (muster's own goodput event), the seeds' means; redone: the steps a
    checkpoint restore made the workers do again, which the agent counts as training."""
    rows = ["| launcher | wall | training | redone | " + " | ".join(PHASES) + " |",
            "|---|---|---|---|" + "---|" * len(PHASES)]
    for launcher in dict.fromkeys(r["launcher"] for r in results if r["agent_a"]):
        rs = [r for r in results if r["launcher"] == launcher and r["agent_a"]]
        mean = lambda f: statistics.mean(f(r) for r in rs)
        redone = mean(lambda r: r["redone_steps"] * r["clean_step_s"])
        cells = [f"{mean(lambda r: r['agent_a']['wall_s']):.1f} s",
                 f"{mean(lambda r: r['agent_a']['productive_s']) - redone:.1f} s", f"{redone:.1f} s"]
        cells += [f"{mean(lambda r: r['agent_a']['lost'][p + '_s']):.1f} s" for p in PHASES]
        rows.append(f"| {launcher} | " + " | ".join(cells) + " |")
    return "\n".join(rows) if len(rows) > 2 else ""


def main():
    args = parse_args()
    results = []
    launchers = args.launchers.split(",")
    for launcher in launchers:
        if launcher not in LAUNCHERS:
            sys.exit(f"goodput: unknown launcher '{launcher}' (use {', '.join(LAUNCHERS)})")
    clean = reference(args)
    print(json.dumps({"reference": "torchrun, fault-free", "step_s": clean}), flush=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for launcher in launchers:
            r = run(args, launcher, seed, clean)
            print(json.dumps(r), flush=True)
            results.append(r)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))
    print()
    print(account_table(results))


if __name__ == "__main__":
    main()
