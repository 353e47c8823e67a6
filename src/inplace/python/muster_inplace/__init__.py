"""muster's in-place API: keep a worker's process, memory and step across a change of the job's membership.

A torchrun script adopts it with a few lines::

    import muster_inplace

    state = muster_inplace.State(model=model, optimizer=optimizer, step=0)

    @muster_inplace.run
    def train(state):
        ddp = DistributedDataParallel(state.model)   # built for each process group
        while state.step < steps:
            ...
            state.step += 1
            state.commit()

    train(state)

Under muster (with `--in-place on`, the default), a change of membership does not end this process: its
agent hands it the new ranks, `run` rolls back to the newest commit, joins the new process group, brings
every rank to the same state and calls the function again. Anywhere else (torchrun, a plain `python`), `run`
calls the function once and `commit` does nothing.
"""

from ._run import run
from ._state import State

__all__ = ["State", "run"]
