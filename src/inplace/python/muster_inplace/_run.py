"""`run`: calls the training function, and on a re-formation rolls back, re-forms and calls it again."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional, TypeVar, overload

import torch
import torch.distributed as dist

from . import _sockets
from ._channel import JOINING_VAR, Assignment, Channel, ChannelError, connect
from ._state import State

R = TypeVar("R")

# This process's TCP sockets before the script could create a process group: what the group's are not.
_BEFORE = _sockets.inodes()


class _Group:
    """The process group of one generation: how to make the next, and the sockets to shut down to end it
    (or to end the joining of the next, when a newer assignment comes meanwhile)."""

    def __init__(self, backend: Optional[str]) -> None:
        self.backend = backend
        self.sockets: set[int] = set()
        # While a group is being joined: the sockets there were before (what the join opened is the rest).
        self.joining: Optional[set[int]] = None

    def ensure(self) -> None:
        if dist.is_initialized():
            self.backend = self.backend or str(dist.get_backend())
            self.sockets |= _sockets.inodes() - _BEFORE
            return
        self.init()

    def init(self) -> None:
        self.backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        before = _sockets.inodes()
        self.joining = before
        try:
            dist.init_process_group(backend=self.backend, init_method="env://")
        finally:
            self.joining = None
        self.sockets |= _sockets.inodes() - before

    def interrupt(self, evicted: tuple[str, ...]) -> None:
        """From the channel's thread, as an assignment comes: whatever the main thread waits on in the current
        group, or in the one it is joining, ends with an error."""
        group = set(self.sockets)
        joining = self.joining
        if joining is not None:
            group |= _sockets.inodes() - joining
        _sockets.shut_down(group, evicted)

    def end(self, evicted: tuple[str, ...]) -> None:
        """Ends the current group without waiting on any peer: its sockets shut down, then aborted."""
        _sockets.shut_down(self.sockets, evicted)
        self.sockets.clear()
        if dist.is_initialized():
            dist.distributed_c10d._abort_process_group()
        else:
            # A join a newer assignment ended halfway had already counted its group: the next one must be
            # named as a fresh process names its first, or it never meets the ranks started cold.
            dist.distributed_c10d._world.group_count = 0


def _say(line: str) -> None:
    print(f"muster_inplace: rank {os.environ.get('RANK', '?')}: {line}", file=sys.stderr, flush=True)


def _reform(state: State, group: _Group, channel: Channel, got: Assignment) -> None:
    channel.taken(got.round)
    group.end(got.evicted)
    os.environ.update(got.env)
    group.init()
    state._sync(reset=True)
    channel.reformed(got.round, state.commits)
    _say(f"re-formed in place in round {got.round} (world {dist.get_world_size()}, commit {state.commits})")


# Words of the errors a process group raises when a peer is gone or the group was ended under it.
_GROUP_ERRORS = ("gloo", "nccl", "c10d", "tcpstore", "connection closed", "connection reset", "broken pipe", "socket")


def _group_failure(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a process group's: a peer gone, or the group ended here."""
    seen: Optional[BaseException] = error
    while seen is not None:
        if isinstance(seen, dist.DistError) or any(w in str(seen).lower() for w in _GROUP_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _next(channel: Channel, error: Exception) -> Assignment:
    """The assignment that explains `error`: one already here, or, for a process group's failure, the one
    the agent sends within the bound. Otherwise the error is the script's own and is raised at once."""
    wait = channel.bound_s if channel.pending() or _group_failure(error) else 0.0
    got = channel.take(wait)
    if got is None:
        if wait > 0:
            _say(f"no re-formation from the agent within {wait:g}s after: {error!r}")
        raise error
    _say(f"re-forming in place after: {error!r}")
    return got


def _reform_until_done(state: State, group: _Group, channel: Channel, got: Assignment) -> None:
    """Re-forms with `got`, or with a later assignment when one ends this re-formation (a second failure)."""
    while True:
        try:
            _reform(state, group, channel, got)
            return
        except Exception as error:
            got = _next(channel, error)


def _join(state: State, group: _Group, channel: Channel) -> None:
    """A worker started before its node joined the job: the variables it started with are provisional (a
    world of its node alone), its ranks come with the others' re-formation. Its agent bounds the wait."""
    _say("started before its node joined the job; waiting for its ranks")
    got = channel.take(None)
    if got is None:
        raise ChannelError("the agent closed the in-place channel before this worker had its ranks")
    _reform_until_done(state, group, channel, got)


def _call(fn: Callable[..., R], backend: Optional[str], state: State, args: Any, kwargs: Any) -> R:
    group = _Group(backend)
    channel = connect(lambda got: group.interrupt(got.evicted))
    if channel is None:
        group.ensure()
        return fn(state, *args, **kwargs)
    state._keep()
    if os.environ.pop(JOINING_VAR, None) == "1":
        _join(state, group, channel)
    else:
        try:
            group.ensure()
            state._sync(reset=False)
        except Exception as error:
            _reform_until_done(state, group, channel, _next(channel, error))
    while True:
        try:
            return fn(state, *args, **kwargs)
        except Exception as error:
            _reform_until_done(state, group, channel, _next(channel, error))


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
