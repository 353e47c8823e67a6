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

import os as _os

from ._channel import SOCKET_VAR as _SOCKET_VAR

if _os.environ.get(_SOCKET_VAR) and _os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") in (None, "1"):
    # NCCL's watchdog then aborts a failed communicator instead of the process, which re-forms in place.
    _os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"

from ._run import run  # noqa: E402
from ._state import State  # noqa: E402

__all__ = ["State", "run"]
