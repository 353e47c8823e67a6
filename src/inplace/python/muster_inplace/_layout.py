"""A state as leaves: every tensor by its key path (a DTensor as its local shard, with where that shard sits
in the whole tensor) and every other value by its key path. What a rank holds is one signature of its
tensors' keys, dtypes, whole shapes and parts: two ranks that hold the same part of every tensor (two
replicas of an HSDP shard, any two DDP ranks) have the same signature, whatever their meshes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # a torch without DTensor nor FSDP2: every tensor is a plain one
    DTensor = None  # type: ignore[assignment,misc]
    FSDPModule = None  # type: ignore[assignment,misc]


def stateful(value: object) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def _is_dtensor(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


@dataclass
class Leaves:
    """`tree`: name -> the value's state dict (stateful) or the value itself. `tensors`: key -> the local
    tensor (the storage a transfer reads or writes), in key order. `others`: key -> every other leaf."""

    tree: dict[str, Any]
    tensors: list[tuple[str, torch.Tensor]]
    specs: list[str]
    others: dict[str, Any]
    place: str

    def signature(self) -> str:
        return hashlib.sha256("\n".join(self.specs).encode()).hexdigest()[:32]


def _walk(tree: Any, key: str) -> Iterator[tuple[str, Any]]:
    if isinstance(tree, dict):
        for k in sorted(tree, key=repr):
            yield from _walk(tree[k], f"{key}/{k!r}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _walk(v, f"{key}/{i}")
    else:
        yield key, tree


def _spec(key: str, t: torch.Tensor) -> tuple[str, torch.Tensor, str]:
    """(spec, local tensor, place in words or '') of one tensor leaf."""
    if _is_dtensor(t):
        local = t._local_tensor
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        spec = f"{key}|{t.dtype}|{tuple(t.shape)}|{tuple(shape)}@{tuple(offset)}"
        return spec, local, _place(t)
    return f"{key}|{t.dtype}|{tuple(t.shape)}", t, ""


def _place(t: Any) -> str:
    mesh = t.device_mesh
    names = mesh.mesh_dim_names or tuple(str(i) for i in range(mesh.ndim))
    coordinate = mesh.get_coordinate() or ()
    parts = [
        f"{name} {c} of {n}" if p.is_shard() else f"{name}: a replica"
        for name, c, n, p in zip(names, coordinate, mesh.shape, t.placements)
    ]
    return "mesh " + ", ".join(parts)


def leaves(values: dict[str, Any]) -> Leaves:
    """The leaves of `values` (name -> a stateful object or a plain value). Modules sharded by FSDP2 are
    resharded first (a fault mid-forward leaves them unsharded; resharding talks to no peer)."""
    tree: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, torch.nn.Module):
            for m in value.modules():
                if FSDPModule is not None and isinstance(m, FSDPModule):
                    m.reshard()
        tree[name] = value.state_dict() if stateful(value) else value
    tensors: list[tuple[str, torch.Tensor]] = []
    specs: list[str] = []
    others: dict[str, Any] = {}
    place = ""
    for key, leaf in _walk(tree, ""):
        if isinstance(leaf, torch.Tensor):
            spec, local, where = _spec(key, leaf)
            tensors.append((key, local))
            specs.append(spec)
            place = place or where
        else:
            others[key] = leaf
            specs.append(f"{key}|-")
    return Leaves(tree, tensors, specs, others, place or "the whole state: it is replicated")


def rebuild(tree: Any, others: dict[str, Any], key: str = "") -> Any:
    """`tree` with every non-tensor leaf replaced by `others[key]` (tensors kept: they were written in place)."""
    if isinstance(tree, dict):
        return {k: rebuild(v, others, f"{key}/{k!r}") for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [rebuild(v, others, f"{key}/{i}") for i, v in enumerate(tree)]
        return type(tree)(items) if isinstance(tree, list) else tuple(items)
    if isinstance(tree, torch.Tensor):
        return tree
    return others.get(key, tree)


def optimizers(values: dict[str, Any]) -> list[torch.optim.Optimizer]:
    return [v for v in values.values() if isinstance(v, torch.optim.Optimizer)]


def clear_grads(values: dict[str, Any]) -> None:
    """A step interrupted by the fault is redone whole: the gradients it left are dropped."""
    for opt in optimizers(values):
        opt.zero_grad(set_to_none=True)
    for v in values.values():
        if isinstance(v, torch.nn.Module):
            v.zero_grad(set_to_none=True)


def materialize(opt: torch.optim.Optimizer) -> None:
    """An optimizer that has not stepped holds no state (AdamW's moments come with its first step): made,
    with zero moments, by a step of zero gradients at a learning rate of 0, so that a part can be received
    into it. Called only on a rank whose part is then overwritten."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(opt)
