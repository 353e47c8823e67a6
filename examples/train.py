"""A small, real data-parallel training job with checkpoint/resume, for muster (or torchrun).

Run it on one node with two CPU workers:

    muster --standalone --nproc-per-node=2 examples/train.py

Survive a worker crash: with restarts allowed, muster restarts the whole local group, and every rank
resumes from the last checkpoint that rank 0 wrote:

    muster --standalone --nproc-per-node=2 --max-restarts=1 examples/train.py \\
        --crash-at-step 12 --crash-rank 1 --ckpt-every 5

The model is a 2-layer MLP fitting a fixed synthetic regression task. A DataLoader with a
DistributedSampler gives each rank its own shard of the data, reshuffled every epoch, and
DistributedDataParallel (gloo) averages the gradients: the shape of most users' training loops.
"""

import argparse
import gc
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SAMPLES, FEATURES, HIDDEN, BATCH = 1024, 16, 32, 128


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to train for")
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--ckpt-dir", default=None,
                   help="checkpoint directory (default: $TMPDIR/muster-train-<TORCHELASTIC_RUN_ID>)")
    p.add_argument("--ckpt-every", type=int, default=5, help="rank 0 checkpoints every N steps")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="crash on reaching this step (first attempt only; for testing restarts)")
    p.add_argument("--crash-rank", type=int, default=0, help="the rank that crashes")
    p.add_argument("--result", default=None, help="rank 0 writes a JSON summary here")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds each step sleeps (a harness paces the job; scripts/chaos.sh)")
    p.add_argument("--step-log", default=None,
                   help="a harness's record: every rank appends 'start <unix time> <rank> <pid> <restart count> "
                        "<world size>' when it starts, rank 0 'step <unix time> <step>' after each step "
                        "(scripts/bench/goodput.sh)")
    p.add_argument("--hold-file", default=None,
                   help="before the last step, wait while this file exists (a harness keeps the job alive "
                        "until it is done with it; scripts/chaos.sh)")
    return p.parse_args()


def dataset():
    """The same synthetic regression data on every rank: y = 3 tanh(x @ w / 4) + noise."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    y = 3 * torch.tanh(x @ w / 4) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return x, y


def batches_from(loader, sampler, step):
    """This rank's batches from optimizer step `step` on, epoch after epoch: the sampler reshuffles each
    epoch (the same order on every rank, by epoch), and a resumed job skips the batches of its epoch that
    the checkpoint's steps already consumed, so it sees what an uninterrupted run would have."""
    per_epoch = len(loader)
    epoch, skip = divmod(step, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        for i, batch in enumerate(loader):
            if i >= skip:
                yield batch
        epoch, skip = epoch + 1, 0


def save_checkpoint(path, model, optimizer, step):
    """Atomic: a reader (or a restart) sees the old checkpoint or the new one, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def log_line(path, line):
    """One line appended at once (O_APPEND), so the ranks' lines never interleave."""
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


@record
def main():
    args = parse_args()
    dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the launcher
    rank, world = dist.get_rank(), dist.get_world_size()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_line(args.step_log, f"start {time.time():.6f} {rank} {os.getpid()} {restart_count} {world}")

    ckpt_dir = args.ckpt_dir or os.path.join(
        tempfile.gettempdir(), f"muster-train-{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}")
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(ckpt_dir, "checkpoint.pt")

    torch.manual_seed(0)  # identical initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DDP(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    start, resumed_from = 0, None
    if os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, map_location="cpu")
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = resumed_from = state["step"]
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    # Every rank must agree on where to start, or the collectives below would deadlock.
    agreed = torch.tensor([start])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    assert agreed.item() == start, f"rank {rank} resumed from step {start}, another rank from {agreed.item()}"

    data = TensorDataset(*dataset())
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    batches = batches_from(loader, sampler, start)

    loss = torch.tensor(float("nan"))
    for step in range(start, args.steps):
        if args.step_sleep:
            time.sleep(args.step_sleep)
        while args.hold_file and step == args.steps - 1 and os.path.exists(args.hold_file):
            time.sleep(0.2)
        if args.crash_at_step == step and args.crash_rank == rank and restart_count == 0:
            print(f"rank {rank}: injected crash at step {step}", flush=True)
            os._exit(1)
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        optimizer.step()
        done = step + 1
        if rank == 0 and done % args.ckpt_every == 0:
            save_checkpoint(ckpt_path, model.module, optimizer, done)
        if rank == 0:
            log_line(args.step_log, f"step {time.time():.6f} {done}")
        if rank == 0 and (done == 1 or done % 10 == 0):
            print(f"step {done}: loss={loss.item():.4f}", flush=True)

    # The group is intact: the ranks sum to 0 + 1 + ... + (world - 1).
    ranks = torch.tensor([rank])
    dist.all_reduce(ranks)
    assert ranks.item() == world * (world - 1) // 2, f"all_reduce of ranks gave {ranks.item()}"

    # Report the loss averaged over every rank's last batch.
    final = loss.detach().clone()
    dist.all_reduce(final)
    final_loss = final.item() / world
    if rank == 0:
        print(f"done: steps={args.steps} world_size={world} loss={final_loss:.4f}", flush=True)
        if args.result:
            with open(args.result, "w") as f:
                json.dump({"steps": args.steps, "resumed_from": resumed_from, "world_size": world,
                           "restart_count": restart_count, "final_loss": final_loss,
                           "use_agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE")}, f)
    # Free DDP (which holds the process group) before tearing the group down. Left to interpreter
    # shutdown, about one run in ten on a busy 2-core machine aborted after a clean finish
    # ("terminate called without an active exception", SIGABRT), under torchrun and muster alike.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
