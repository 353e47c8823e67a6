"""The worker's side of its agent's channel: a Unix socket named by MUSTER_INPLACE_SOCKET, one JSON object
per line. The worker says hello once, the agent sends each new assignment (a re-formation), the worker says
when it re-formed. A reader thread takes the assignments as they come, so a main thread blocked in a
collective learns of one while it waits."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Optional

SOCKET_VAR = "MUSTER_INPLACE_SOCKET"
# How long a worker whose collective failed waits for its agent's assignment before it fails as before.
BOUND_VAR = "MUSTER_INPLACE_TIMEOUT"
DEFAULT_BOUND_S = 30.0
# Set (to 1) for a worker its agent started before its node joined the job: it waits for its ranks first.
JOINING_VAR = "MUSTER_INPLACE_JOINING"


@dataclass(frozen=True)
class Assignment:
    """A re-formation: the round, every torchrun variable that changes, and the addresses of the nodes that
    left (this worker's sockets to them are shut down: a collective blocked on a vanished host ends)."""

    round: int
    env: dict[str, str]
    evicted: tuple[str, ...]


class ChannelError(RuntimeError):
    """The agent's channel failed: the worker goes on as a script without the API would."""


class Channel:
    def __init__(self, path: str, on_assignment: Callable[[Assignment], None]) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # "@name": the abstract namespace (an environment variable cannot hold its leading NUL).
        address = "\0" + path[1:] if path.startswith("@") else path
        try:
            self._sock.connect(address)
        except OSError as e:
            self._sock.close()
            raise ChannelError(f"cannot reach the agent at {path} ({SOCKET_VAR}): {e}") from e
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: Optional[Assignment] = None
        self._closed = False
        self._noted = threading.Event()
        self._on_assignment = on_assignment
        self.bound_s = _bound()
        self._send({"hello": {"pid": os.getpid(), "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}})
        threading.Thread(target=self._read, name="muster-inplace", daemon=True).start()

    def _send(self, message: dict[str, object]) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self._sock.sendall(line)
            except OSError as e:
                raise ChannelError(f"cannot write to the agent: {e}") from e

    def _read(self) -> None:
        for line in self._sock.makefile("rb"):
            try:
                message = json.loads(line)
                if "noted" in message:
                    self._noted.set()
                    continue
                reform = message["reform"]
                got = Assignment(int(reform["round"]), {str(k): str(v) for k, v in reform["env"].items()}, tuple(reform.get("evicted", ())))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            with self._cond:
                self._pending = got
                self._cond.notify_all()
            self._on_assignment(got)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, timeout: Optional[float]) -> Optional[Assignment]:
        """The next assignment, waiting up to `timeout` seconds (None: until one comes); None if none came
        (or the agent is gone)."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is not None or self._closed, timeout)
            got, self._pending = self._pending, None
            return got

    def pending(self) -> bool:
        with self._cond:
            return self._pending is not None

    def taken(self, round: int) -> None:
        """The main thread took up the re-formation of `round` (the agent waits longer for one that did)."""
        self._send({"taken": {"round": round}})

    def reformed(self, round: int, step: int) -> None:
        self._send({"reformed": {"round": round, "commit": step}})

    def lost(self, place: str) -> bool:
        """Says the state cannot be restored in place, and waits (bounded) until the agent noted it: then no
        worker of this group is kept when this one exits. Whether it did."""
        self._send({"lost": {"place": place}})
        return self._noted.wait(self.bound_s)


def _bound() -> float:
    raw = os.environ.get(BOUND_VAR)
    if raw is None:
        return DEFAULT_BOUND_S
    try:
        value = float(raw)
    except ValueError as e:
        raise ChannelError(f"{BOUND_VAR}={raw!r} is not a number of seconds") from e
    if value <= 0:
        raise ChannelError(f"{BOUND_VAR}={raw!r} must be above 0")
    return value


def connect(on_assignment: Callable[[Assignment], None]) -> Optional[Channel]:
    """The agent's channel when this worker was started by a muster agent with in-place re-formation on."""
    path = os.environ.get(SOCKET_VAR)
    return Channel(path, on_assignment) if path else None
