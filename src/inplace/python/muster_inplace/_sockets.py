"""The process group's TCP sockets, found in /proc: gloo has no abort, so a collective blocked on a peer
that vanished without closing its connections (a host cut off, powered off) ends only when its sockets do.
Shutting a socket down (not closing it) wakes whoever waits on it with an error and leaves its descriptor
valid for the library that owns it."""

from __future__ import annotations

import os
import socket
from typing import Iterable


# /proc/net/tcp's state of a listening socket: left alone (gloo's listener thread aborts the process when
# its accept fails), as it waits on no peer.
_LISTEN = "0A"


def _inodes_of(table: str) -> dict[int, str]:
    """inode -> the remote address, for each connected socket of /proc/net/`table`."""
    out: dict[int, str] = {}
    try:
        with open(f"/proc/net/{table}") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[3] != _LISTEN:
                    out[int(fields[9])] = _address(fields[2].split(":")[0])
    except OSError:
        pass
    return out


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    v6 = socket.inet_ntop(socket.AF_INET6, words)
    return v6[7:] if v6.startswith("::ffff:") and "." in v6 else v6


def tcp_sockets() -> dict[int, tuple[int, str]]:
    """This process's TCP sockets: descriptor -> (inode, remote address)."""
    remote = {**_inodes_of("tcp"), **_inodes_of("tcp6")}
    out: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inode = int(link[8:-1])
            if inode in remote:
                out[int(name)] = (inode, remote[inode])
    return out


def inodes() -> set[int]:
    return {inode for inode, _ in tcp_sockets().values()}


def shut_down(group: Iterable[int], evicted: Iterable[str]) -> int:
    """Shuts down every socket whose inode is in `group` or whose remote address is in `evicted`; how many."""
    group, evicted = set(group), set(evicted)
    done = 0
    for fd, (inode, remote) in tcp_sockets().items():
        if inode not in group and remote not in evicted:
            continue
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass
    return done
