"""`run`: calls the training function, and on a re-formation rolls back, re-forms and calls it again."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional, TypeVar, overload

import torch
import torch.distributed as dist

from . import _sockets
from ._channel import Assignment, Channel, connect
from ._state import State

R = TypeVar("R")

# This process's TCP sockets before the script could create a process group: what the group's are not.
_BEFORE = _sockets.inodes()


class _Group:
    """The process group of one generation: how to make the next, and the sockets to shut down to end it."""

    def __init__(self, backend: Optional[str]) -> None:
        self.backend = backend
        self.sockets: set[int] = set()

    def ensure(self) -> None:
        if dist.is_initialized():
            self.backend = self.backend or str(dist.get_backend())
            self.sockets |= _sockets.inodes() - _BEFORE
            return
        self.backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.init()

    def init(self) -> None:
        before = _sockets.inodes()
        dist.init_process_group(backend=self.backend, init_method="env://")
        self.sockets |= _sockets.inodes() - before

    def end(self, evicted: tuple[str, ...]) -> None:
        """Ends the current group without waiting on any peer: its sockets shut down, then aborted."""
        _sockets.shut_down(self.sockets, evicted)
        self.sockets.clear()
        if dist.is_initialized():
            dist.distributed_c10d._abort_process_group()


def _say(line: str) -> None:
    print(f"muster_inplace: rank {os.environ.get('RANK', '?')}: {line}", file=sys.stderr, flush=True)


def _reform(state: State, group: _Group, channel: Channel, got: Assignment) -> None:
    group.end(got.evicted)
    os.environ.update(got.env)
    group.init()
    state._sync(reset=True)
    channel.reformed(got.round, state.commits)
    _say(f"re-formed in place in round {got.round} (world {dist.get_world_size()}, commit {state.commits})")


def _call(fn: Callable[..., R], backend: Optional[str], state: State, args: Any, kwargs: Any) -> R:
    group = _Group(backend)
    channel = connect(lambda got: _sockets.shut_down(group.sockets, got.evicted))
    if channel is None:
        return fn(state, *args, **kwargs)
    state._keep()
    group.ensure()
    state._sync(reset=False)
    while True:
        try:
            return fn(state, *args, **kwargs)
        except Exception as error:
            got = channel.take(channel.bound_s)
            if got is None:
                _say(f"no re-formation from the agent within {channel.bound_s:g}s after: {error!r}")
                raise
            _say(f"re-forming in place after: {error!r}")
        while True:
            try:
                _reform(state, group, channel, got)
                break
            except Exception as error:
                # A further change during this one: the agent's next assignment supersedes it.
                later = channel.take(channel.bound_s)
                if later is None:
                    raise
                _say(f"re-forming again after: {error!r}")
                got = later


@overload
def run(fn: Callable[..., R]) -> Callable[..., R]: ...
@overload
def run(*, backend: Optional[str] = None) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def run(fn: Optional[Callable[..., R]] = None, *, backend: Optional[str] = None) -> Any:
    """Decorates `train(state, ...)`. Under a muster agent with in-place re-formation, it joins (or adopts)
    the default process group, brings every rank to the same state, and calls `train`; when the job's
    membership changes, it rolls back to the newest commit, joins the new group and calls `train` again.
    Elsewhere it calls `train` once. `backend`: the group's, when `run` creates it (default: nccl with CUDA,
    else gloo)."""

    def wrap(f: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(f)
        def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
            return _call(f, backend, state, args, kwargs)

        return wrapper

    return wrap(fn) if fn is not None else wrap
