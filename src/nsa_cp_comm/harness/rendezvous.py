"""The rendezvous files a pool's ranks meet through (a ``FileStore`` in a
directory the caller owns): each named for its starter, host and pid, so
that the files a killed starter left are found and removed by the next pool
in the same directory."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

STORE_PREFIX = ".rendezvous-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def store_name() -> str:
    """A fresh rendezvous file name naming its starter: host and pid."""
    return f"{STORE_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"


def remove_stale_stores(workdir: Path) -> list[Path]:
    """Remove the rendezvous files in ``workdir`` whose starter (a process of
    this host) is gone: a starter killed with SIGKILL cannot remove its own.
    Files of other hosts, or of an unknown form, are left alone. Returns the
    removed paths."""
    host = socket.gethostname()
    removed = []
    for path in workdir.glob(f"{STORE_PREFIX}*"):
        parts = path.name[len(STORE_PREFIX):].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit() or _pid_alive(int(parts[1])):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
