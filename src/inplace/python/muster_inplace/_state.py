"""The training state that survives a re-formation: objects with `state_dict`/`load_state_dict` (a model, an
optimizer, a scheduler) and plain values (step, epoch), as attributes; and, for a job whose model is sharded
on a device mesh, the builder that makes the objects that hold a process group for each new group."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from . import _layout, _transfer
from ._plan import NONE
from ._transfer import Restore

Builder = Callable[[], Dict[str, Any]]


class State:
    """`State(model=model, optimizer=opt, step=0)`: each keyword becomes an attribute. A re-formation brings
    every rank to the newest optimizer step every part of the state is held at: a rank that holds it keeps
    its own, the others receive exactly their part from a rank that holds the same part."""

    def __init__(self, **values: Any) -> None:
        object.__setattr__(self, "_names", list(values))
        object.__setattr__(self, "_built", [])
        object.__setattr__(self, "_build", None)
        object.__setattr__(self, "_version", NONE)
        object.__setattr__(self, "_resets", [])
        object.__setattr__(self, "_restored", None)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def builder(self, build: Builder) -> Builder:
        """Decorates `build()`, which makes what is tied to a process group (the device mesh, the model
        sharded on it by `fully_shard`, its optimizer) and returns it by name: `run` calls it for each group
        (the first and every re-formation's, on every rank), before the state is restored; each name becomes
        an attribute, and the values with `state_dict` are part of the state."""
        object.__setattr__(self, "_build", build)
        return build

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Called, in order, on every rank of a re-formation (kept or started by it), once the state is
        restored: rebuild what holds the old process group, re-shard the data, rescale the learning rate."""
        self._resets.extend(callbacks)

    def commit(self) -> None:
        """Does nothing: every optimizer step is a commit (a vote before it makes the live state consistent;
        see `_vote`). Kept so that scripts written for the first API run unchanged."""

    @property
    def commits(self) -> int:
        """The optimizer steps applied, as every rank agreed at the last restore and counted since."""
        return max(self._version, 0)

    @property
    def restored(self) -> Optional[Restore]:
        """This rank's account of its last restore (None before one)."""
        return self._restored

    @property
    def kept(self) -> bool:
        """Whether the state was restored from the ranks that kept it (a re-formation in place): the same on
        every rank. False at a start where no rank kept anything (and under torchrun): load the checkpoint
        then, on every rank."""
        return self._restored is not None and self._restored.kept

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in [*self._names, *self._built]}

    def _applied(self) -> None:
        object.__setattr__(self, "_version", max(self._version, 0) + 1)

    def _forget(self) -> None:
        object.__setattr__(self, "_version", NONE)

    def _build_for_group(self) -> dict[str, Any]:
        return self._build() if self._build is not None else {}

    def _start(self) -> None:
        """Without an agent (torchrun, a plain python): the builder's objects, nothing restored."""
        self._adopt(self._build_for_group(), {})

    def _adopt(self, built: dict[str, Any], values: dict[str, Any]) -> None:
        for name, value in {**built, **values}.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_built", [n for n, v in built.items() if _layout.stateful(v) and n not in self._names])

    def _sync(self) -> None:
        """On every rank of a new group: the builder's objects, then the restore, then (after a
        re-formation) the reset callbacks."""
        held = self._values()
        built = self._build_for_group()
        needed = {**{n: getattr(self, n) for n in self._names}, **{n: v for n, v in built.items() if _layout.stateful(v)}}
        plan, account, values = _transfer.restore(held, self._version, needed, bool(built), self._forget)
        self._adopt(built, values)
        object.__setattr__(self, "_version", plan.version)
        object.__setattr__(self, "_restored", account)
        for callback in self._resets if plan.reformation else ():
            callback()
