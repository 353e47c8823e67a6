"""Run torch's own TCPStore servers until stdin closes.

Usage: torch_store_server.py libuv|legacy

Starts a server on an ephemeral port (world_size unset, so no `init/` key) and prints one line,
`torch store listening on <port>`; each line read from stdin starts one more, fresh server and
prints its line the same way (a fresh store costs no new torch import). Used by
`tests/it/store_interop.rs` and `scripts/bench/store.sh`.
"""

import sys
from datetime import timedelta

import torch.distributed as dist


def main():
    use_libuv = {"libuv": True, "legacy": False}[sys.argv[1]]
    stores = []

    def serve():
        store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, use_libuv=use_libuv, timeout=timedelta(seconds=30)
        )
        stores.append(store)
        print(f"torch store listening on {store.port}", flush=True)

    serve()
    for _ in sys.stdin:
        serve()


if __name__ == "__main__":
    main()
