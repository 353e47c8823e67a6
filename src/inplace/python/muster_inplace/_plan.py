"""Which step every rank is brought to after a re-formation, and where each rank's part comes from: a pure
function of one row per rank (the step it holds, what it holds, what it needs), tested as a table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# The step of a rank that holds nothing worth keeping: started by this re-formation, or a joiner.
NONE = -1


@dataclass(frozen=True)
class Row:
    """One rank's account. `held` and `needed` are signatures of what it holds and of what it needs (every
    tensor's key, dtype, whole shape and the part of it this rank has): two ranks hold the same part of the
    state exactly when their signatures are equal. `place` says what it needs, in words."""

    version: int
    held: str
    needed: str
    place: str


@dataclass(frozen=True)
class Plan:
    """`version`: the step every rank holds afterwards. `sources`: receiver -> the rank it receives its part
    from (a rank absent from it keeps its own). `reformation`: some rank held a step (not a job's first start)."""

    version: int
    sources: dict[int, int] = field(default_factory=dict)
    reformation: bool = False


class LostStateError(RuntimeError):
    """No step can be restored on every rank: the part some rank needs is held by no survivor. Raised alike on
    every rank (each computes the same plan)."""

    def __init__(self, rank: int, place: str, version: int) -> None:
        self.rank, self.place, self.version = rank, place, version
        super().__init__(
            f"no surviving rank holds the state rank {rank} needs ({place}): it was only in the memory of a rank "
            "that is gone; the job restarts cold, from the script's checkpoint (a sharded state with no replica "
            "cannot be restored in place)"
        )


def _source(rows: list[Row], needed: str, version: int) -> Optional[int]:
    """The lowest rank that holds `needed` at `version`."""
    return next((s for s, r in enumerate(rows) if r.version == version and r.held == needed), None)


def plan(rows: list[Row]) -> Plan:
    """The newest step at which every rank's needed part is held by some rank; each rank that does not hold
    its own part at that step receives it from the lowest rank that does. All ranks at NONE: a first start,
    every rank keeps what it has."""
    versions = sorted({r.version for r in rows if r.version != NONE}, reverse=True)
    if not versions:
        return Plan(version=0)
    first_lost: Optional[tuple[int, int]] = None
    for version in versions:
        sources: dict[int, int] = {}
        lost = None
        for rank, row in enumerate(rows):
            if row.version == version and row.held == row.needed:
                continue
            source = _source(rows, row.needed, version)
            if source is None:
                lost = rank
                break
            sources[rank] = source
        if lost is None:
            return Plan(version=version, sources=sources, reformation=True)
        first_lost = first_lost or (lost, version)
    assert first_lost is not None
    rank, version = first_lost
    raise LostStateError(rank, rows[rank].place, version)
