"""The training worker of scripts/bench/inplace_recovery.py (every launcher alike). Usage:
inplace_worker.py OUTDIR CHECKPOINT

A DDP job written with muster_inplace: each start loads CHECKPOINT (a few hundred MB, what a real job's start
pays), then trains a small model (BENCH_MODEL=big: 101M parameters with AdamW), one all-reduced step every
20 ms (the big model's steps take what they take). Each rank appends
"<unix time> <WORLD_SIZE> <generation>" to OUTDIR/steps after each step, where the generation is the time the
training function was (re)entered: a step of a group formed after a fault has a generation after it.
When OUTDIR/crash appears, exactly one worker takes it (an atomic rename) and exits 1. It stops when
OUTDIR/finish exists, or when its parent goes away (torchrun leaves its workers behind when SIGKILLed).
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import muster_inplace

outdir, checkpoint = sys.argv[1], sys.argv[2]
parent = os.getppid()
backbone = torch.load(checkpoint, map_location="cpu")
torch.manual_seed(0)
# BENCH_MODEL=big: 101M parameters (16 -> 4096, 6 x 4096^2, -> 1) with AdamW, a real-size state (1.2 GB).
if os.environ.get("BENCH_MODEL", "small") == "big":
    hidden = [m for _ in range(6) for m in (torch.nn.Linear(4096, 4096), torch.nn.Tanh())]
    model = torch.nn.Sequential(torch.nn.Linear(16, 4096), torch.nn.Tanh(), *hidden, torch.nn.Linear(4096, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
else:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
state = muster_inplace.State(model=model, optimizer=optimizer, step=0)
crash, finish = os.path.join(outdir, "crash"), os.path.join(outdir, "finish")


def log(line):
    with open(os.path.join(outdir, "steps"), "a") as f:
        f.write(line + "\n")


@muster_inplace.run
def train(state):
    generation = time.time()
    world = dist.get_world_size()
    ddp = DDP(state.model)
    x = torch.randn(32, 16) + 1e-3 * backbone[: 32]
    y = torch.randn(32, 1)
    while not os.path.exists(finish):
        if os.getppid() != parent:
            os._exit(0)
        try:
            os.rename(crash, os.path.join(outdir, f"crashed-{os.getpid()}"))
            os._exit(1)
        except FileNotFoundError:
            pass
        state.optimizer.zero_grad()
        ((ddp(x) - y) ** 2).mean().backward()
        state.optimizer.step()
        state.step += 1
        log(f"{time.time():.6f} {world} {generation:.6f}")
        time.sleep(0.02)


train(state)
dist.destroy_process_group()
