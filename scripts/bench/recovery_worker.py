"""The worker of scripts/bench/recovery.sh (muster and torchrun alike). Usage: recovery_worker.py OUTDIR

Once its process group is up (after init_process_group, i.e. when it could train), it writes
OUTDIR/running/<pid>: "<unix time> <WORLD_SIZE> <RANK> <TORCHELASTIC_RESTART_COUNT> <node>", atomically (a
rename), so the script can tell when every worker of a new generation is running and when it got there.
Then it idles (no collectives: a dead peer must be noticed by the launcher, not by a collective timing out)
until OUTDIR/finish exists, exiting 0. When OUTDIR/crash appears, exactly one worker takes it (an atomic
rename) and exits 1: the crash of scenario (a). It also exits when its parent goes away, so a launcher
killed with SIGKILL that leaves its workers behind (torchrun does) leaves nothing running for long.
"""

import os
import sys
import time

import torch.distributed as dist

outdir = sys.argv[1]
parent = os.getppid()
dist.init_process_group("gloo")

env = os.environ
line = (
    f"{time.time():.6f} {env['WORLD_SIZE']} {env['RANK']} {env.get('TORCHELASTIC_RESTART_COUNT', '0')} "
    f"{env.get('BENCH_NODE', '?')}\n"
)
running = os.path.join(outdir, "running")
tmp = os.path.join(running, f".{os.getpid()}")
with open(tmp, "w") as f:
    f.write(line)
os.rename(tmp, os.path.join(running, str(os.getpid())))

crash = os.path.join(outdir, "crash")
finish = os.path.join(outdir, "finish")
while not os.path.exists(finish):
    if os.getppid() != parent:
        os._exit(0)
    try:
        os.rename(crash, os.path.join(outdir, f"crashed-{os.getpid()}"))
        os._exit(1)
    except FileNotFoundError:
        pass
    time.sleep(0.01)
dist.destroy_process_group()
