"""The training state that survives a re-formation: objects with `state_dict`/`load_state_dict` (the model,
the optimizer, a sampler, a scheduler) and plain values (step, epoch), as attributes."""

from __future__ import annotations

import copy
import io
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

# Commit number of a rank that has none (a worker started by the re-formation, a joiner).
NONE = -1


def _stateful(value: object) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_cpu(v) for v in tree)
    return copy.deepcopy(tree)


class State:
    """`State(model=model, optimizer=opt, step=0)`: each keyword becomes an attribute. `commit()` keeps an
    in-memory copy (under muster with in-place on; elsewhere it does nothing); a re-formation restores the
    newest commit any surviving rank holds, on every rank."""

    def __init__(self, **values: Any) -> None:
        object.__setattr__(self, "_names", list(values))
        object.__setattr__(self, "_saved", None)
        object.__setattr__(self, "_commits", 0)
        object.__setattr__(self, "_keeping", False)
        object.__setattr__(self, "_resets", [])
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Called, in order, after each re-formation once the state is restored (rebuild what holds the old
        process group, re-shard the data for the new world size, rescale the learning rate)."""
        self._resets.extend(callbacks)

    def commit(self) -> None:
        """Keeps a copy of the state in memory: what a re-formation rolls back to."""
        if self._keeping:
            object.__setattr__(self, "_saved", self._snapshot())
            object.__setattr__(self, "_commits", self._commits + 1)

    @property
    def commits(self) -> int:
        return self._commits

    def _keep(self) -> None:
        object.__setattr__(self, "_keeping", True)

    def _snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self._names:
            value = getattr(self, name)
            out[name] = ("stateful", _to_cpu(value.state_dict())) if _stateful(value) else ("value", copy.deepcopy(value))
        return out

    def _load(self, snapshot: dict[str, Any]) -> None:
        for name, (kind, saved) in snapshot.items():
            if kind == "stateful":
                getattr(self, name).load_state_dict(saved)
            else:
                object.__setattr__(self, name, saved)

    def _sync(self, reset: bool) -> None:
        """Every rank takes the newest commit any rank holds, from the lowest rank that holds it (the live
        state of rank 0 when nobody has committed yet), over the current process group; then, after a
        re-formation (`reset`), the reset callbacks."""
        mine = torch.tensor([self._commits if self._saved is not None else NONE], dtype=torch.int64)
        every = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        counts = [int(t.item()) for t in every]
        newest = max(counts)
        source = counts.index(newest) if newest != NONE else 0
        snapshot: Optional[dict[str, Any]] = None
        if dist.get_rank() == source:
            snapshot = self._saved if newest != NONE else self._snapshot()
        payload = [_pack(snapshot) if snapshot is not None else None]
        dist.broadcast_object_list(payload, src=source)
        got = _unpack(payload[0])
        self._load(got)
        object.__setattr__(self, "_saved", got if newest != NONE else None)
        object.__setattr__(self, "_commits", max(newest, 0))
        for callback in self._resets if reset else ():
            callback()


def _pack(snapshot: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(snapshot, buf)
    return buf.getvalue()


def _unpack(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, (bytes, bytearray)):
        raise RuntimeError("muster_inplace: the state broadcast after the re-formation carried nothing")
    return torch.load(io.BytesIO(raw), weights_only=False)
