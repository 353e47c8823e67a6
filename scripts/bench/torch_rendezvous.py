"""torch's own dynamic rendezvous (the c10d backend torchrun uses) timed with N simulated nodes.

N threads in one process, each with its own DynamicRendezvousHandler (distinct node descriptors: the
handler factory gives every handler of a process its own local id) over one shared c10d TCPStore server
hosted in this process, min = max = N. Each node has its own client connection to that server, as each
torchrun agent has: one client object shared by all threads deadlocks, since a blocking get (rank 1 reading
MASTER_ADDR before rank 0 wrote it) holds the client's lock that rank 0 needs. It times from the start until every thread's next_rendezvous() has returned,
checks the ranks, and prints one JSON line:

    {"nodes": N, "seconds": S, "ok": true}                      every node joined the round
    {"nodes": N, "timeout": T, "finished": K}                    only K of N had returned after T seconds

Usage: python torch_rendezvous.py NODES [TIMEOUT_SECONDS]
"""

import json
import os
import resource
import sys
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler


def main() -> None:
    nodes = int(sys.argv[1])
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 600.0
    run_id = "bench"
    # Two descriptors a node (its client and the server's end), as muster's simulation.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # One store server for every simulated node, as the agents of a job share the one at --rdzv-endpoint.
    server = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=timedelta(seconds=timeout))
    params = RendezvousParameters(
        backend="c10d",
        endpoint=f"127.0.0.1:{server.port}",
        run_id=run_id,
        min_nodes=nodes,
        max_nodes=nodes,
        local_addr="127.0.0.1",
        # Past the bench's own bound, so torch never gives up before we do.
        join_timeout=str(int(timeout) + 60),
    )

    results: list = [None] * nodes
    errors: list = []
    done = threading.Semaphore(0)

    def node(i: int) -> None:
        try:
            store = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=timeout))
            handler = create_handler(store, C10dRendezvousBackend(store, run_id), params)
            info = handler.next_rendezvous()
            results[i] = (info.rank, info.world_size)
        except Exception as e:  # reported below; the thread must still count as done
            errors.append(f"node {i}: {type(e).__name__}: {e}")
        finally:
            done.release()

    start = time.monotonic()
    # Daemon threads: a run that does not finish is abandoned at the deadline, not waited for.
    for i in range(nodes):
        threading.Thread(target=node, args=(i,), name=f"node-{i}", daemon=True).start()
    finished = 0
    while finished < nodes:
        left = start + timeout - time.monotonic()
        if left <= 0 or not done.acquire(timeout=left):
            break
        finished += 1
    elapsed = time.monotonic() - start

    if finished < nodes:
        print(json.dumps({"nodes": nodes, "timeout": timeout, "finished": finished}), flush=True)
        # Stuck threads hold the store; leave at once instead of joining them.
        os._exit(0)
    ranks = sorted(r[0] for r in results if r is not None)
    ok = not errors and ranks == list(range(nodes)) and all(r[1] == nodes for r in results if r is not None)
    out = {"nodes": nodes, "seconds": round(elapsed, 3), "ok": ok}
    if errors:
        out["errors"] = errors[:3]
    print(json.dumps(out), flush=True)
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
