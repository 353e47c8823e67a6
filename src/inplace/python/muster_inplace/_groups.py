"""Every process group the script makes (the default one, a device mesh's, any `new_group`), and how a
re-formation ends them all. gloo has no abort: a collective blocked on a peer that vanished ends only when
its sockets do, so each group's TCP sockets are recorded as it is made (torch makes every group through
one helper, and meets at a store made by another, both patched here; the import order of the script does
not matter, as torch calls them by their module globals) and shut down when an assignment comes."""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from . import _sockets

# The module (`torch.distributed.rendezvous` as an attribute is the function of the same name).
_rendezvous = importlib.import_module("torch.distributed.rendezvous")

# Every socket of every group made since the import (and of a default group made before it).
_lock = threading.Lock()
_owned: set[int] = set()
# While a group is being made: the sockets there were before it (what it opened is the rest).
_making: list[set[int]] = []


def _record(make: Callable[..., Any]) -> Callable[..., Any]:
    """`make`, recording the sockets it opens as the groups'."""

    @functools.wraps(make)
    def made(*args: Any, **kwargs: Any) -> Any:
        before = _sockets.inodes()
        with _lock:
            _making.append(before)
        try:
            return make(*args, **kwargs)
        finally:
            opened = _sockets.inodes() - before
            with _lock:
                _making.remove(before)
                _owned.update(opened)

    made.__muster_inplace__ = True  # type: ignore[attr-defined]
    return made


def install() -> None:
    """Records the sockets of every group made from now on, and of the stores their ranks meet at (a rank
    waits there for a peer that never comes); a default group that exists already owns every connected TCP
    socket there is (it is what made them)."""
    if getattr(c10d._new_process_group_helper, "__muster_inplace__", False):
        return
    c10d._new_process_group_helper = _record(c10d._new_process_group_helper)
    _rendezvous._create_c10d_store = _record(_rendezvous._create_c10d_store)
    if dist.is_initialized():
        with _lock:
            _owned.update(_sockets.inodes())


def interrupt(evicted: tuple[str, ...]) -> int:
    """From the channel's thread, as an assignment comes: whatever the main thread waits on in any group, or
    in a group it is making, ends with an error. How many sockets were shut down."""
    with _lock:
        group = set(_owned)
        making = list(_making)
    for before in making:
        group |= _sockets.inodes() - before
    return _sockets.shut_down(group, evicted)


def end(evicted: tuple[str, ...]) -> None:
    """Ends every group without waiting on any peer: their sockets shut down, then all aborted (which also
    resets the count that names new groups, so that this process names its next groups as a process
    started cold names its first)."""
    with _lock:
        group = set(_owned)
        _owned.clear()
    _sockets.shut_down(group, evicted)
    if dist.is_initialized():
        c10d._abort_process_group()
    else:
        # A join a newer assignment ended halfway had already counted its group.
        c10d._world.group_count = 0


def init(backend: Optional[str]) -> str:
    """Joins the default group of the current environment (`env://`); the backend it used."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend=backend, init_method="env://")
    return backend


def ensure(backend: Optional[str]) -> str:
    """The default group: the script's, or one made here."""
    if dist.is_initialized():
        return str(dist.get_backend())
    return init(backend)


def device() -> torch.device:
    """Where a collective of the default group runs: the current GPU under nccl, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
