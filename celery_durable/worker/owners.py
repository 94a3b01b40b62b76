"""Who holds a durable run's claim, and whether that holder is still alive (W8).

A claim names its owner ``host:pid:random``. A worker killed mid-run leaves a live-looking claim
until its lease passes; a delivery on the same host sees at once that the owner's process is
gone and takes the run over without waiting for the lease.
"""

from __future__ import annotations

import os
import socket
import uuid

__all__ = ["new_owner", "owner_alive"]


def new_owner() -> str:
    """A claim owner unique to this delivery: host, PID and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def owner_alive(owner: str) -> bool:
    """False only when ``owner`` ran on this host in a process that no longer exists.

    A worker killed mid-run leaves a live-looking claim until its lease passes. When the
    broker redelivers its message to a worker on the same host, the dead process is seen at
    once and the run is taken over without waiting for the lease. Claims from other hosts
    are trusted until their lease passes.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
