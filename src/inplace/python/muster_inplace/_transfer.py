"""A restore, on every rank of the new group in the same order: each rank says which step it holds and what
it holds and needs (one small object each), every rank computes the same plan (`_plan.plan`), and only the
ranks that lack their part at the agreed step receive it, tensor by tensor, from a rank that holds the same
part (`send`/`recv` on the new group, nothing pickled but the non-tensor leaves). A rank that holds its part
receives nothing and sends only what others lack."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from . import _groups, _layout, _vote
from ._plan import NONE, Plan, Row, plan


@dataclass(frozen=True)
class Restore:
    """This rank's own account of its last restore: the step it holds now, the rank it received its part
    from (None: it kept its own), the bytes it received over the group, copied in its own memory (objects
    rebuilt for the new group) and sent to each rank that lacked them, how long it took, and how long of that
    the tensors took to move (received or sent)."""

    version: int
    source: Optional[int] = None
    received: int = 0
    copied: int = 0
    sent: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    moving: float = 0.0
    # Whether the state came from the ranks that kept it (a re-formation); False at a start where no rank
    # kept anything, where the script loads its checkpoint.
    kept: bool = False


def _versions(version: int) -> list[int]:
    mine = torch.tensor([version], dtype=torch.int64, device=_groups.device())
    every = [torch.zeros(1, dtype=torch.int64, device=_groups.device()) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]


def _send(leaves: _layout.Leaves, dst: int) -> int:
    dist.send_object_list([leaves.others], dst=dst)
    sent = 0
    for _, t in leaves.tensors:
        if t.numel():
            dist.send(t.contiguous(), dst=dst)
            sent += t.numel() * t.element_size()
    return sent


def _receive(leaves: _layout.Leaves, src: int) -> tuple[dict[str, Any], int]:
    box: list[Any] = [None]
    dist.recv_object_list(box, src=src)
    received = 0
    for _, t in leaves.tensors:
        if not t.numel():
            continue
        buf = t if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)
        dist.recv(buf, src=src)
        if buf is not t:
            t.copy_(buf)
        received += t.numel() * t.element_size()
    return box[0], received


def _copy(held: _layout.Leaves, needed: _layout.Leaves) -> int:
    copied = 0
    for (_, dst), (_, src) in zip(needed.tensors, held.tensors):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
            copied += dst.numel() * dst.element_size()
    return copied


def _load(values: dict[str, Any], needed: _layout.Leaves, others: dict[str, Any]) -> dict[str, Any]:
    """Loads the written leaves into each value; the plain values, rebuilt."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        tree = _layout.rebuild(needed.tree[name], others, f"/{name!r}")
        if _layout.stateful(value):
            value.load_state_dict(tree)
            out[name] = value
        else:
            out[name] = tree
    return out


def restore(
    held: dict[str, Any], version: int, needed: dict[str, Any], rebuilt: bool, forget: Callable[[], None]
) -> tuple[Plan, Restore, dict[str, Any]]:
    """Brings `needed` (the values for the new group) to the step every rank agrees on. `held`: the values
    this rank kept, at step `version` (NONE: nothing); `rebuilt`: `needed` are new objects (else they are
    `held`); `forget` is called before anything held is overwritten. Returns the plan, this rank's account
    and the values to use."""
    started = time.monotonic()
    versions = _versions(version)
    if all(v == NONE for v in versions):
        return Plan(version=0), Restore(version=0), needed
    fresh = rebuilt or version == NONE
    if fresh and max(versions) >= 1:
        with _vote.paused():
            for opt in _layout.optimizers(needed):
                _layout.materialize(opt)
    need = _layout.leaves(needed)
    have = None if version == NONE else (need if not rebuilt else _layout.leaves(held))
    row = Row(version, have.signature() if have else "", need.signature(), need.place)
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    agreed = plan(rows)
    me = dist.get_rank()
    moving = time.monotonic()
    sent = {r: _send(have, r) for r, s in sorted(agreed.sources.items()) if s == me and have is not None}
    account = Restore(version=agreed.version, sent=sent, kept=True)
    values = needed
    if me in agreed.sources:
        if not rebuilt:
            forget()
        others, received = _receive(need, agreed.sources[me])
        account = Restore(agreed.version, agreed.sources[me], received=received, sent=sent, kept=True)
        moving = time.monotonic() - moving
        values = _load(needed, need, others)
    else:
        moving = time.monotonic() - moving
        if rebuilt and have is not None:
            account = Restore(agreed.version, copied=_copy(have, need), sent=sent, kept=True)
            values = _load(needed, need, have.others)
    _layout.clear_grads(values)
    return agreed, dataclasses.replace(account, seconds=time.monotonic() - started, moving=moving), values
