"""examples/train.py written with muster's in-place API: when the job's membership changes, the healthy
workers keep their processes, their memory and their step; only what failed starts again.

    muster --standalone --nproc-per-node=2 --max-restarts=3 examples/train_inplace.py

The same script runs under torchrun (with `pip install` of muster's `src/inplace/python`) and under muster
with `--in-place off`: `run` then calls the training function once, and a fault restarts every worker from
the last checkpoint, as examples/train.py does. What adopting the API changed, against examples/train.py:

- the training state (model, optimizer, step) lives in a `muster_inplace.State`; each optimizer step is its
  commit (a survivor keeps its live state, a new rank receives it from a survivor), and `state.step` is
  updated right after it;
- the training loop is a function decorated with `@muster_inplace.run`, which creates the process group;
- what holds the process group or depends on the world (DDP, the sampler's shard) is built inside it.

Every start (cold, or a worker started again beside kept ones) loads a frozen "backbone" from the checkpoint
directory, `--backbone-mb` megabytes of pretrained weights, as a real job's start pays for its checkpoint.
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import muster_inplace

SAMPLES, FEATURES, HIDDEN, BATCH = 1024, 16, 32, 64


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to train for")
    p.add_argument("--lr", type=float, default=0.03)
    p.add_argument("--ckpt-dir", default=None,
                   help="checkpoint directory (default: $TMPDIR/muster-train-<TORCHELASTIC_RUN_ID>)")
    p.add_argument("--ckpt-every", type=int, default=5, help="rank 0 checkpoints every N steps")
    p.add_argument("--backbone-mb", type=int, default=8,
                   help="size of the frozen backbone every start loads from the checkpoint directory")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds each step sleeps (a harness paces it)")
    p.add_argument("--width", type=int, default=HIDDEN, help="the hidden layers' width")
    p.add_argument("--layers", type=int, default=1,
                   help="hidden layers (--width 4096 --layers 7: 101M parameters, a real-size state)")
    p.add_argument("--optimizer", choices=["adam", "adamw"], default="adam")
    p.add_argument("--step-log", default=None,
                   help="a harness's record: every rank appends 'start <unix time> <rank> <pid> <restart count> "
                        "<world size>' each time it (re)starts training, rank 0 'step <unix time> <step>' after "
                        "each step (scripts/bench/goodput.sh)")
    return p.parse_args()


def log_line(path, line):
    """One line appended at once (O_APPEND), so the ranks' lines never interleave."""
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def save(path, obj):
    """Atomic: a reader sees the old file or the new one, never half of one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_backbone(ckpt_dir, megabytes):
    """The frozen backbone, made once (by whichever process gets there first) and loaded at every start."""
    path = os.path.join(ckpt_dir, f"backbone-{megabytes}mb.pt")
    if not os.path.exists(path):
        rows = max(1, megabytes * 2**20 // (4 * FEATURES))
        save(path, torch.randn(rows, FEATURES, generator=torch.Generator().manual_seed(1)))
    return torch.load(path, map_location="cpu")


def data(backbone):
    """The same synthetic regression data on every rank, its features shifted by the frozen backbone."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g)
    x = x + 1e-3 * backbone[torch.arange(SAMPLES) % len(backbone)]
    y = 3 * torch.tanh(x @ w / 4) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


args = parse_args()
ckpt_dir = args.ckpt_dir or os.path.join(
    tempfile.gettempdir(), f"muster-train-{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}")
os.makedirs(ckpt_dir, exist_ok=True)
ckpt_path = os.path.join(ckpt_dir, "checkpoint.pt")
dataset = data(load_backbone(ckpt_dir, args.backbone_mb))

torch.manual_seed(0)
hidden = [m for _ in range(args.layers - 1) for m in (torch.nn.Linear(args.width, args.width), torch.nn.ReLU())]
model = torch.nn.Sequential(torch.nn.Linear(FEATURES, args.width), torch.nn.ReLU(), *hidden, torch.nn.Linear(args.width, 1))
optimizer = (torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam)(model.parameters(), lr=args.lr)
state = muster_inplace.State(model=model, optimizer=optimizer, step=0)
# A cold start resumes from the last checkpoint; in place, the state the survivors kept wins over it.
if os.path.exists(ckpt_path):
    saved = torch.load(ckpt_path, map_location="cpu")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    state.step = saved["step"]


@muster_inplace.run
def train(state):
    rank, world = dist.get_rank(), dist.get_world_size()
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    log_line(args.step_log, f"start {time.time():.6f} {rank} {os.getpid()} {restart_count} {world}")
    ddp = DDP(state.model)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    per_epoch = len(loader)
    loss = torch.tensor(float("nan"))
    while state.step < args.steps:
        # The batch a step takes follows from the step alone: a rolled-back step takes the same one again.
        epoch, position = divmod(state.step, per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < position:
                continue
            if args.step_sleep:
                time.sleep(args.step_sleep)
            state.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # DDP all-reduces (averages) the gradients here
            state.optimizer.step()
            state.step += 1
            if rank == 0 and state.step % args.ckpt_every == 0:
                save(ckpt_path, {"model": state.model.state_dict(), "optimizer": state.optimizer.state_dict(),
                                 "step": state.step})
            if rank == 0:
                log_line(args.step_log, f"step {time.time():.6f} {state.step}")
            if rank == 0 and (state.step == 1 or state.step % 10 == 0):
                print(f"step {state.step}: loss={loss.item():.4f} world_size={world}", flush=True)
            if state.step >= args.steps:
                break
    if rank == 0:
        print(f"done: steps={args.steps} world_size={world} loss={loss.item():.4f}", flush=True)


train(state)
dist.destroy_process_group()
