"""The in-place benchmarks' real-size job (run by scripts/bench/inplace-cost.sh): DDP over gloo, an MLP of
`--layers` x `--width`^2 parameters (6 x 4096^2 = 101M) trained with AdamW (12 bytes a parameter of state:
1.2 GB), batches from a DataLoader over a DistributedSampler.

    big_model.py --mode plain   the script as under torchrun, no API
    big_model.py --mode api     the same job written with muster_inplace (State, run; the vote per step)

Rank 0 appends one JSON line to `--out`: the mode, the parameters, the mean seconds per step after
`--warmup` steps, steps per second, its peak RSS, and under the API the restores it made (`--kill R:S`: rank R
SIGKILLs itself as step S's backward begins, once; the line then also gives the survivors' time from the
fault to their first step after it, and the restored rank's transfer)."""

import argparse
import json
import os
import resource
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["plain", "api"], required=True)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--out", required=True)
    p.add_argument("--kill", default="", help="R:S: rank R SIGKILLs itself at step S (once; --mode api)")
    return p.parse_args()


args = parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
params = sum(p.numel() for p in model.parameters())
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(1024, args.width, generator=g), torch.randn(1024, args.width, generator=g))
times = []  # (step, wall time when it ended)


def loop(state_step, set_step, ddp):
    rank, world = dist.get_rank(), dist.get_world_size()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    kill_rank, kill_step = (int(v) for v in (args.kill or "-1:-1").split(":"))
    marker = f"{args.out}.killed"
    while state_step() < args.steps:
        epoch, position = divmod(state_step(), len(loader))
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < position:
                continue
            optimizer.zero_grad()
            out = ddp(x)
            if (rank, state_step()) == (kill_rank, kill_step) and not os.path.exists(marker):
                open(marker, "w").close()
                times.append(("fault", time.time()))
                with open(f"{args.out}.fault", "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            torch.nn.functional.mse_loss(out, y).backward()
            optimizer.step()
            set_step(state_step() + 1)
            times.append((state_step(), time.time()))
            if state_step() >= args.steps:
                break


def report(extra):
    if dist.get_rank() != 0:
        return
    steady = [t for s, t in times if isinstance(s, int) and s >= args.warmup]
    per_step = (steady[-1] - steady[0]) / (len(steady) - 1) if len(steady) > 1 else float("nan")
    line = {"mode": args.mode, "params": params, "state_bytes": params * 12, "world": dist.get_world_size(),
            "seconds_per_step": per_step, "steps_per_s": 1 / per_step,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}
    with open(args.out, "a") as f:
        f.write(json.dumps(line) + "\n")


if args.mode == "plain":
    dist.init_process_group("gloo")
    step = [0]
    loop(lambda: step[0], lambda v: step.__setitem__(0, v), DistributedDataParallel(model))
    report({})
else:
    import muster_inplace

    state = muster_inplace.State(model=model, optimizer=optimizer, step=0)
    calls = []
    # The vote's own time: torch runs the global pre-hooks in the order they were registered (this one, then
    # the API's vote, registered when train is called), then the optimizer's own.
    votes, began = [], [0.0]
    register_optimizer_step_pre_hook(lambda *_: began.__setitem__(0, time.perf_counter()))
    optimizer.register_step_pre_hook(lambda *_: votes.append(time.perf_counter() - began[0]))

    @muster_inplace.run
    def train(state):
        calls.append(time.time())
        r = state.restored
        if r is not None and r.kept:
            with open(f"{args.out}.restore-{dist.get_rank()}-{os.getpid()}", "w") as f:
                f.write(json.dumps({"received": r.received, "sent": sum(r.sent.values()), "seconds": r.seconds, "moving": r.moving,
                                    "source": r.source}))
        loop(lambda: state.step, lambda v: setattr(state, "step", v), DistributedDataParallel(state.model))

    train(state)
    extra = {"vote_ms": 1000 * sum(votes) / max(len(votes), 1)}
    if os.path.exists(f"{args.out}.fault") and len(calls) > 1:
        with open(f"{args.out}.fault") as f:
            fault = float(f.read())
        after = [t for s, t in times if isinstance(s, int) and t > fault]
        extra["first_step_after_fault_s"] = after[0] - fault if after else None
        # The steady rate is measured over the steps before the fault.
        times[:] = [(s, t) for s, t in times if t < fault]
    report(extra)
dist.destroy_process_group()
