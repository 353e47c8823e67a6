"""`run`: calls the training function, and on a re-formation ends every process group, joins the new one,
restores the state and calls the function again."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, Optional, TypeVar, overload

import torch.distributed as dist

from . import _groups, _vote
from ._channel import JOINING_VAR, Assignment, Channel, ChannelError, connect
from ._plan import LostStateError
from ._state import State

R = TypeVar("R")

# The exit status of a worker whose state cannot be restored in place (`LostStateError`): a worker failure,
# so its agent restarts the group cold (from the script's checkpoint) while a restart is left.
LOST_STATE_EXIT = 1


def _say(line: str) -> None:
    print(f"muster_inplace: rank {os.environ.get('RANK', '?')}: {line}", file=sys.stderr, flush=True)


def _restored(state: State, how: str) -> None:
    r = state.restored
    if r is None or not r.kept:
        return
    moved = f"received {r.received} bytes from rank {r.source}" if r.source is not None else "kept its own state"
    if r.copied:
        moved += f" (copied {r.copied} bytes into the objects built for the new group)"
    if r.sent:
        moved += ", sent " + ", ".join(f"{b} bytes to rank {d}" for d, b in sorted(r.sent.items()))
    _say(f"{how} at optimizer step {r.version} of this start: {moved} in {r.seconds:.3f}s")


def _reform(state: State, backend: Optional[str], channel: Channel, got: Assignment) -> None:
    channel.taken(got.round)
    _groups.end(got.evicted)
    os.environ.update(got.env)
    _groups.init(backend)
    state._sync()
    channel.reformed(got.round, state.commits)
    _restored(state, f"re-formed in place in round {got.round} (world {dist.get_world_size()})")


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
    if isinstance(error, LostStateError):
        _say(str(error))
        channel.lost(error.place)
        sys.exit(LOST_STATE_EXIT)
    wait = channel.bound_s if channel.pending() or _group_failure(error) else 0.0
    got = channel.take(wait)
    if got is None:
        if wait > 0:
            _say(f"no re-formation from the agent within {wait:g}s after: {error!r}")
        raise error
    _say(f"re-forming in place after: {error!r}")
    return got


def _reform_until_done(state: State, backend: Optional[str], channel: Channel, got: Assignment) -> None:
    """Re-forms with `got`, or with a later assignment when one ends this re-formation (a second failure)."""
    while True:
        try:
            _reform(state, backend, channel, got)
            return
        except Exception as error:
            got = _next(channel, error)


def _first(state: State, backend: Optional[str], channel: Channel) -> None:
    """The first group of this process: a worker started before its node joined the job waits for its ranks
    (the variables it started with are provisional; its agent bounds the wait)."""
    if os.environ.pop(JOINING_VAR, None) == "1":
        _say("started before its node joined the job; waiting for its ranks")
        got = channel.take(None)
        if got is None:
            raise ChannelError("the agent closed the in-place channel before this worker had its ranks")
        _reform_until_done(state, backend, channel, got)
        return
    try:
        backend = _groups.ensure(backend)
        state._sync()
        _restored(state, "restored")
    except Exception as error:
        _reform_until_done(state, backend, channel, _next(channel, error))


def _call(fn: Callable[..., R], backend: Optional[str], state: State, args: Any, kwargs: Any) -> R:
    channel = connect(lambda got: _groups.interrupt(got.evicted))
    if channel is None:
        _groups.ensure(backend)
        state._start()
        return fn(state, *args, **kwargs)
    hooks = _vote.Hooks(state._applied)
    try:
        _first(state, backend, channel)
        while True:
            try:
                return fn(state, *args, **kwargs)
            except Exception as error:
                _reform_until_done(state, backend, channel, _next(channel, error))
    finally:
        hooks.remove()


@overload
def run(fn: Callable[..., R]) -> Callable[..., R]: ...
@overload
def run(*, backend: Optional[str] = None) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


def run(fn: Optional[Callable[..., R]] = None, *, backend: Optional[str] = None) -> Any:
    """Decorates `train(state, ...)`. Under a muster agent with in-place re-formation, it joins (or adopts)
    the default process group, restores the state, and calls `train`; when the job's membership changes, it
    ends every process group, joins the new one, brings every rank to the newest step every part of the
    state is held at, and calls `train` again. Elsewhere it calls `train` once. `backend`: the group's, when
    `run` creates it (default: nccl with CUDA, else gloo)."""

    def wrap(f: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(f)
        def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
            return _call(f, backend, state, args, kwargs)

        return wrapper

    return wrap(fn) if fn is not None else wrap
