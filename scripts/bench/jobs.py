"""What the benchmark drivers share about the jobs they start: a free port, the port an agent hosting the
store reports, and stopping a job's agents and whatever its workers left behind."""

import os
import re
import signal
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hosted_port(log):
    """The rendezvous port muster's agent logged as hosted here, or None (not yet)."""
    try:
        m = re.search(r"rdzv_store=127\.0\.0\.1:(\d+) \(hosted here\)", open(log).read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def stop(agents, marker):
    """SIGTERM to each agent's session, SIGKILL after 10 s; then every process with `marker` among its
    arguments: torchrun leaves workers behind when it is SIGKILLed, in sessions of their own, some before
    they logged their start."""
    for p in agents:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + 10
    for p in agents:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for pid in [int(d) for d in os.listdir("/proc") if d.isdigit()]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
