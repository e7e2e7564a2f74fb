"""Writing the files a command produces: checked before the work, whole or not at all.

:func:`check_dir` finds out, before a command spends its time computing, that
its output directory can be created and written (a file in the way, a path
below a file, a read-only mount, ``/proc/sys``): it creates and removes a
probe file in the nearest directory that exists, the one test that holds for
root too (``os.access`` calls every directory writable for root).
:func:`write_atomic` writes a file under a temporary name beside it and
renames it into place, so a full disk or a kill leaves the old file or none,
never a truncated one. :func:`append_whole` appends lines to an open file in
one ``write(2)``, all of them or none.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

# Errors worth naming in a refusal (/proc/sys says "no such file", which misleads).
_TELLING = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


# The least free space a folder written into must have: a full filesystem is refused before any
# work (each command's rows, samples, reports and Hydra's job folders are kilobytes to megabytes),
# not met as a bare [Errno 28] after it.
MIN_FREE_BYTES = 1 << 20


def check_dir(path: str | os.PathLike[str], label: str, error: type[Exception]) -> None:
    """Raise ``error`` (one line, ``label: why``) unless ``path`` is a directory,
    or can be made one, that this process can write into, on a filesystem with
    at least :data:`MIN_FREE_BYTES` free."""
    path = Path(path)
    if os.path.exists(path) and not path.is_dir():  # os.path's: no OSError for a name too long
        raise error(f"{label}: {path} exists and is not a directory")
    probe = path
    while not os.path.exists(probe) and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise error(f"{label}: {probe} is not a directory")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".write-probe-")
    except OSError as exc:
        why = f" ({exc.strerror})" if exc.errno in _TELLING else ""
        raise error(f"{label}: {probe} is not a writable directory{why}") from None
    os.close(fd)
    os.unlink(name)
    st = os.statvfs(probe)
    free = st.f_bavail * st.f_frsize
    if free < MIN_FREE_BYTES:
        raise error(f"{label}: {probe}'s filesystem has {free} bytes free, under the {MIN_FREE_BYTES >> 20} MiB "
                    "this command needs to write into it")


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory
    and a rename. On any error the temporary file is removed, ``path`` is as it
    was, and the OSError (naming ``path``) is raised."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return path


def append_whole(fd: int, data: bytes, sync: bool = True) -> int:
    """Append ``data`` to the open file ``fd`` in one ``write(2)`` (after a newline
    when a kill left its last line unterminated) and return its former size. A
    failed or short write cuts the file back to that size and raises OSError."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        data = b"\n" + data
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes; is the disk full?)")
        if sync:
            os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)  # no part of a line left behind
        raise
    return size
