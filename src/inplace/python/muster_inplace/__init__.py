"""muster's in-place API: keep a worker's process, memory and step across a change of the job's membership.

A torchrun script adopts it with a few lines::

    import muster_inplace

    state = muster_inplace.State(model=model, optimizer=optimizer, step=0)

    @muster_inplace.run
    def train(state):
        ddp = DistributedDataParallel(state.model)   # built for each process group
        while state.step < steps:
            ...
            optimizer.step()
            state.step += 1

    train(state)

Under muster (with `--in-place on`, the default), a change of membership does not end this process: its
agent hands it the new ranks, `run` ends every process group, joins the new one, brings every rank to the
newest optimizer step every part of the state is held at (a rank that holds its part keeps it, the others
receive exactly their part from a rank that holds the same part) and calls the function again. A sharded
model (FSDP2, HSDP, tensor parallel) is made for each group by a builder (`State.builder`). Anywhere else
(torchrun, a plain `python`), `run` calls the function once.
"""

import os as _os

from ._channel import SOCKET_VAR as _SOCKET_VAR

if _os.environ.get(_SOCKET_VAR):
    if _os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") in (None, "1"):
        # NCCL's watchdog then aborts a failed communicator instead of the process, which re-forms in place.
        _os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    from ._groups import install as _install

    # Every process group made from here on is ended by a re-formation, not only the default one.
    _install()

from ._plan import LostStateError  # noqa: E402
from ._run import run  # noqa: E402
from ._state import State  # noqa: E402
from ._transfer import Restore  # noqa: E402

__all__ = ["LostStateError", "Restore", "State", "run"]
