"""The in-place cost benchmark's driver (run by scripts/bench/inplace-cost.sh, which documents it)."""

import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--muster", required=True)
    p.add_argument("--torchrun", required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--model", nargs=argparse.REMAINDER, default=[], help="big_model.py's own arguments")
    return p.parse_args()


def job(launcher, mode, out, extra=(), model=()):
    cmd = [*launcher, "--standalone", "--nproc-per-node=2", *extra, a.script, f"--mode={mode}", f"--out={out}", *a.model, *model]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def loopback_copy_s(nbytes):
    """Seconds to send `nbytes` once over a TCP connection on loopback (the state copied once, plainly)."""
    server = socket.create_server(("127.0.0.1", 0))
    got = [0]

    def receive():
        conn, _ = server.accept()
        buf = bytearray(1 << 22)
        while got[0] < nbytes:
            n = conn.recv_into(buf)
            if not n:
                break
            got[0] += n
        conn.close()

    t = threading.Thread(target=receive)
    t.start()
    chunk = bytes(1 << 22)
    with socket.create_connection(server.getsockname()) as c:
        start = time.monotonic()
        left = nbytes
        while left > 0:
            c.sendall(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
        t.join()
        return time.monotonic() - start


a = parse_args()
os.makedirs(a.work, exist_ok=True)
plain, api = os.path.join(a.work, "plain.jsonl"), os.path.join(a.work, "api.jsonl")
for _ in range(a.runs):
    # Alternated, so that both see the same machine over time.
    job([a.torchrun], "plain", plain)
    job([a.muster], "api", api)
fault = os.path.join(a.work, "fault.jsonl")
# Rank 1 SIGKILLed as step 15's backward begins.
job([a.muster], "api", fault, ["--max-restarts=1"], ["--kill=1:15"])
p, q = lines(plain), lines(api)
sp, sq = statistics.median(r["steps_per_s"] for r in p), statistics.median(r["steps_per_s"] for r in q)
restores = [json.loads(open(os.path.join(a.work, f)).read()) for f in os.listdir(a.work) if f.startswith("fault.jsonl.restore-")]
received = [r for r in restores if r["received"]]
print(json.dumps({
    "params": p[0]["params"], "state_bytes": p[0]["state_bytes"],
    "plain_torchrun_steps_per_s": [round(r["steps_per_s"], 4) for r in p],
    "api_muster_steps_per_s": [round(r["steps_per_s"], 4) for r in q],
    "ratio_of_medians": round(sq / sp, 4),
    "vote_ms": [round(r["vote_ms"], 3) for r in q],
    "peak_rss_mb": {"plain": max(r["peak_rss_mb"] for r in p), "api": max(r["peak_rss_mb"] for r in q)},
    "fault": lines(fault)[-1] if os.path.exists(fault) else None,
    "restores": restores,
    "loopback_copy_s": round(loopback_copy_s(max((r["received"] for r in received), default=0)), 3),
}, indent=1))
