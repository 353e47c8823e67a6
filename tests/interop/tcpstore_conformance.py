"""Drive a TCPStore server with torch's own client and print a deterministic log.

Usage: tcpstore_conformance.py HOST PORT [--no-queues]

Every operation of torch's TCPStore client runs against the server at HOST:PORT (which must be
fresh: key counts are logged), one line per step: `<step> -> <result>`. Bytes print as hex,
errors as `error:<exception class>`. Running it against torch's servers and against muster's
must give identical logs; `tests/it/store_interop.rs` checks that, and runs muster's Rust client
through the same steps. `--no-queues` leaves out the queue steps, which torch's legacy server
does not implement. `ping` is not exposed in Python; the client's constructor sends one.
"""

import sys
import threading
from datetime import timedelta

import torch.distributed as dist


def show(value):
    if value is None:
        return "ok"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return str(value)


def step(name, call):
    try:
        result = show(call())
    except Exception as error:  # the log records which error torch raised
        result = "error:" + type(error).__name__
    print(f"{name} -> {result}", flush=True)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    queues = "--no-queues" not in sys.argv[3:]
    connect = lambda: dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10))
    store, other = connect(), connect()
    short = timedelta(milliseconds=300)

    step("set k v1", lambda: store.set("k", "v1"))
    step("get k", lambda: store.get("k"))
    step("set bin 00ff", lambda: store.set("bin", b"\x00\xff"))
    step("get bin", lambda: store.get("bin"))
    step("add cnt 5", lambda: store.add("cnt", 5))
    step("add cnt -2", lambda: store.add("cnt", -2))
    step("get cnt", lambda: store.get("cnt"))
    step("compare_set k v1 v2 (match)", lambda: store.compare_set("k", "v1", "v2"))
    step("compare_set k zz v3 (mismatch)", lambda: store.compare_set("k", "zz", "v3"))
    step("compare_set new '' n1 (missing, empty expected)", lambda: store.compare_set("new", "", "n1"))
    step("compare_set missing2 x y (missing)", lambda: store.compare_set("missing2", "x", "y"))
    step("check [k]", lambda: store.check(["k"]))
    step("check [k, nope]", lambda: store.check(["k", "nope"]))
    step("wait [k, cnt]", lambda: store.wait(["k", "cnt"]))
    step("wait [k, cnt] 300ms", lambda: store.wait(["k", "cnt"], short))
    step("wait [nope] 300ms", lambda: store.wait(["nope"], short))
    timer = threading.Timer(0.2, lambda: other.set("later", "x"))
    timer.start()
    step("wait [later] set by another client", lambda: store.wait(["later"], timedelta(seconds=5)))
    timer.join()
    step("num_keys", lambda: store.num_keys())
    step("delete_key k", lambda: store.delete_key("k"))
    step("delete_key k again", lambda: store.delete_key("k"))
    step("check [k] after delete", lambda: store.check(["k"]))
    step("append ap ab", lambda: store.append("ap", "ab"))
    step("append ap cd", lambda: store.append("ap", "cd"))
    step("get ap", lambda: store.get("ap"))
    step("multi_get [ap, cnt]", lambda: store.multi_get(["ap", "cnt"]))
    step("multi_set [m1, m2]", lambda: store.multi_set(["m1", "m2"], ["x", "yy"]))
    step("multi_get [m1, m2]", lambda: store.multi_get(["m1", "m2"]))
    step("list_keys (sorted)", lambda: sorted(store.list_keys()))
    if queues:
        step("queue_push q item1", lambda: store.queue_push("q", "item1"))
        step("queue_push q item2", lambda: store.queue_push("q", "item2"))
        step("queue_len q", lambda: store.queue_len("q"))
        step("check [q] (non-empty queue)", lambda: store.check(["q"]))
        step("queue_pop q", lambda: store.queue_pop("q", block=False))
        step("queue_pop q blocking", lambda: store.queue_pop("q", block=True))
        step("queue_pop q empty", lambda: store.queue_pop("q", block=False))
        step("queue_len q empty", lambda: store.queue_len("q"))
        timer = threading.Timer(0.2, lambda: other.queue_push("q2", "late"))
        timer.start()
        step("queue_pop q2 blocking, pushed by another client", lambda: store.queue_pop("q2"))
        timer.join()
    step("barrier bar 1", lambda: store.barrier("bar", 1))
    step("barrier bar2 2 300ms (alone)", lambda: store.barrier("bar2", 2, short))
    step("get bar2", lambda: store.get("bar2"))
    timer = threading.Timer(0.2, lambda: other.barrier("bar3", 2))
    timer.start()
    step("barrier bar3 2 with another client", lambda: store.barrier("bar3", 2, timedelta(seconds=5)))
    timer.join()
    step("add bar3 0", lambda: store.add("bar3", 0))
    step("num_keys at end", lambda: store.num_keys())
    step("list_keys at end (sorted)", lambda: sorted(store.list_keys()))


if __name__ == "__main__":
    main()
