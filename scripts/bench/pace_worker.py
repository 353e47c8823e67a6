"""The straggler bench's training job (scripts/bench/straggler.sh). Usage: pace_worker.py OUTDIR

Environment: BENCH_NODE (this node's name), PACE_DEADLINE (unix time at which training stops), PACE_SLOW_NODE
(the node whose local rank 1 works three times as long per step; none by default), PACE_WORK (`sleep`, the
default: the step's work leaves the CPUs free, so steps/s show the straggler alone; `compute`: a CPU matmul
loop, so that what the launcher takes of the CPUs shows), PACE_STEP_MS (one step's work, 40), PACE_JOB
(`collective`, the default: each step is the work, then an explicit all-reduce that also carries rank 0's
"time is up", so every rank stops at the same step; `ddp`: as most jobs are written, the work, then a
DistributedDataParallel step (Linear 256-256-1) whose all-reduce is inside backward, "time is up" agreed every
10 steps, an evaluation pass every 50 steps and a checkpoint by rank 0 every 100). Rank 0 keeps "<steps> <seconds>" of its stretch in OUTDIR/steps-<start>-<pid>, rewritten every
second (a job that re-forms has several stretches, each file one).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

outdir = sys.argv[1]
node = os.environ.get("BENCH_NODE", "?")
deadline = float(os.environ["PACE_DEADLINE"])
step_s = float(os.environ.get("PACE_STEP_MS", "40")) / 1000
slow = node == os.environ.get("PACE_SLOW_NODE") and os.environ.get("LOCAL_RANK") == "1"
compute = os.environ.get("PACE_WORK", "sleep") == "compute"

dist.init_process_group("gloo")
rank = dist.get_rank()
a = torch.rand(128, 128)


def work(seconds):
    end = time.perf_counter() + seconds
    if not compute:
        time.sleep(seconds)
        return
    while time.perf_counter() < end:
        torch.mm(a, a)


def record(steps, start):
    # Rewritten as it goes: a stretch stopped by a re-formation leaves its count.
    path = os.path.join(outdir, f"steps-{start:.3f}-{os.getpid()}")
    with open(path + ".tmp", "w") as f:
        f.write(f"{steps} {time.time() - start:.3f}\n")
    os.replace(path + ".tmp", path)


def ddp_step(step):
    x, y = torch.randn(32, 256), torch.randn(32, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 50 == 0:
        with torch.no_grad():
            for _ in range(5):
                model(torch.randn(32, 256))
    if step % 100 == 0 and rank == 0:
        torch.save(model.module.state_dict(), os.path.join(outdir, f"ckpt-{os.getpid()}.pt"))


ddp = os.environ.get("PACE_JOB", "collective") == "ddp"
if ddp:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

start, steps, written = time.time(), 0, time.time()
while True:
    work(step_s * (3 if slow else 1))
    steps += 1
    if ddp:
        ddp_step(steps)
        if steps % 10:
            continue
    up = torch.tensor([1 if rank == 0 and time.time() >= deadline else 0])
    dist.all_reduce(up, op=dist.ReduceOp.MAX)
    if rank == 0 and (up.item() or time.time() - written >= 1):
        record(steps, start)
        written = time.time()
    if up.item():
        break
dist.destroy_process_group()
