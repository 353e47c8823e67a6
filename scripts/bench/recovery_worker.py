"""The worker of scripts/bench/recovery.sh (muster and torchrun alike). Usage: recovery_worker.py OUTDIR

Once its process group is up (after init_process_group, i.e. when it could train), it writes
OUTDIR/running/<pid>: "<unix time> <WORLD_SIZE> <RANK> <TORCHELASTIC_RESTART_COUNT> <node> <start time>",
atomically (a rename), so the script can tell when every worker of a new generation is running and when it
got there. The start time is taken before importing torch: what comes before it is the launcher's share of a
recovery, what comes after it (importing torch, forming the process group) the worker's.
Then it idles (no collectives: a dead peer must be noticed by the launcher, not by a collective timing out)
until OUTDIR/finish exists, exiting 0. When OUTDIR/crash appears, exactly one worker takes it (an atomic
rename) and exits 1: the crash of scenario (a); OUTDIR/crash-<node>, the same on node $BENCH_NODE alone. It also exits when its parent goes away, so a launcher
killed with SIGKILL that leaves its workers behind (torchrun does) leaves nothing running for long.
"""

import time

STARTED = time.time()  # first, before the slow imports

import os  # noqa: E402
import sys  # noqa: E402

import torch.distributed as dist  # noqa: E402

outdir = sys.argv[1]
parent = os.getppid()
dist.init_process_group("gloo")

env = os.environ
line = (
    f"{time.time():.6f} {env['WORLD_SIZE']} {env['RANK']} {env.get('TORCHELASTIC_RESTART_COUNT', '0')} "
    f"{env.get('BENCH_NODE', '?')} {STARTED:.6f}\n"
)
running = os.path.join(outdir, "running")
tmp = os.path.join(running, f".{os.getpid()}")
with open(tmp, "w") as f:
    f.write(line)
os.rename(tmp, os.path.join(running, str(os.getpid())))

crashes = [os.path.join(outdir, "crash"), os.path.join(outdir, f"crash-{env.get('BENCH_NODE', '?')}")]
finish = os.path.join(outdir, "finish")
while not os.path.exists(finish):
    if os.getppid() != parent:
        os._exit(0)
    for crash in crashes:
        try:
            os.rename(crash, os.path.join(outdir, f"crashed-{os.getpid()}"))
            os._exit(1)
        except FileNotFoundError:
            pass
    time.sleep(0.01)
dist.destroy_process_group()
