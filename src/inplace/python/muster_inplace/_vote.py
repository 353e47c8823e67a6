"""The vote before every optimizer step. A step's reductions either succeed on every rank or the step is not
applied anywhere: before any optimizer steps, every rank takes part in one all-reduce of one number, which
completes only once every rank has finished the step's reductions. A rank whose reductions or vote failed
applies nothing and re-forms; the others fail at their next collective. So every survivor's live state is
the state after the last step it applied, the ranks' steps differ by one at most, and no copy of the state
is ever needed (the idea of torchft's `should_commit`). The hooks are torch's global optimizer hooks: every
optimizer of the process votes, wherever and whenever it was made."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import _groups

_paused = 0


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No vote and no count (a restore's own optimizer steps: see `_layout.materialize`)."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


def _vote() -> None:
    flag = torch.ones(1, device=_groups.device())
    dist.all_reduce(flag)
    # The result is read, so that on a GPU the step waits for the vote (and its failure raises here).
    if int(flag.item()) != dist.get_world_size():
        raise RuntimeError(f"muster_inplace: the step's vote counted {int(flag.item())} of {dist.get_world_size()} ranks")


class Hooks:
    """Installed while `run` runs under an agent: `on_applied` is called after each step applied."""

    def __init__(self, on_applied: Callable[[], None]) -> None:
        def pre(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if not _paused:
                _vote()

        def post(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if not _paused:
                on_applied()

        self._handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
