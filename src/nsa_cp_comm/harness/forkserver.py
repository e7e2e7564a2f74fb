"""CPU ranks forked from a server that has already imported torch.

A rank started by exec spends about 1.5 s of CPU starting the interpreter and
importing torch before it can join its group. A sweep over worlds of 1, 2, 4
and 8 ranks starts 15 of them: about 12 s of a 2-core machine's wall time,
more than any check of a point costs. A fork server pays it once per starter:
a process started exactly as a rank is (``_worker.py fork-server``, run by
path, whose first statements tie its life to its starter's) imports torch and
then forks each rank on request. The forked rank arms its own death signal
against the server, and checks that the server is still its parent, before
anything else: the chain starter -> server -> rank holds as the direct one
does, so no rank outlives its starter. The server reaps its ranks and sends
each exit status to the starter, where :class:`ForkedRank` answers for it as
``subprocess.Popen`` does for an exec'd rank.

What a forked rank sees is what an exec'd one would: the server is started
with the environment the pool gives its ranks and is kept per environment
(what is read at import, a ``sitecustomize``, is the server's), per
interpreter and per starting thread (the death signal follows the thread that
started the server); the rank gets the pool's environment and the starter's
working directory as it starts (a variable that :data:`VOLATILE` leaves out
of the key differs there). Each rank leads its own process group, as an
exec'd one does.

CPU ranks only: CUDA state does not survive a fork, so CUDA ranks start by
exec, as does every rank with ``NSA_CP_COMM_FORK_RANKS=0`` (the orphan drills
of the exec path use it) or where the server cannot run (not Linux).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .reap import kill_descendants
from .switches import env_switch


# Set to 0 (false, no, off) to start every rank by exec.
FORK_ENV = "NSA_CP_COMM_FORK_RANKS"
# _worker.py's first argument that makes it a server (its SERVE_ARG; not
# imported from it: _worker imports this module).
SERVE_ARG = "fork-server"
# Servers kept at once (one per environment and thread a pool was started
# with); beyond it, an idle one is closed, and with none idle ranks start by exec.
MAX_SERVERS = 3
# The largest message either side sends (a spawn request carries the environment).
_MESSAGE_BYTES = 1 << 20


def usable(device: str) -> bool:
    """Whether ranks of ``device`` start from a fork server here."""
    return device == "cpu" and sys.platform.startswith("linux") and env_switch(FORK_ENV, True)


# --- the server's side: runs in the process _worker.py starts -------------------------


def serve(fd: int, guard: Callable[[int], None], body: Callable[..., None]) -> None:
    """The server's loop, in a process whose first statements already tied it
    to its starter (``_worker.py``, which has imported torch and the rank's
    ``body``, ``ranks.worker_main``): say ready, then fork a rank for every
    request and report every rank's exit. Each forked rank first calls
    ``guard(server_pid)``: the worker file's own ``die_with_starter``, so a
    rank forked here is guarded as the server was. Leaves when the starter
    closes its end (its ranks then get their death signal). It sleeps until
    a request or a rank's end (SIGCHLD) wakes it: nothing polls while the
    ranks are timed."""
    sock = socket.socket(fileno=fd)
    me = os.getpid()
    children: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def send(*msg: Any) -> None:
        try:
            sock.sendall(pickle.dumps(msg))
        except OSError:
            os._exit(0)  # the starter is gone

    send("ready")
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
        while True:  # ranks, and what dead ranks left to this subreaper
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in children:
                children.discard(pid)
                # What the rank started is handed to this server (a subreaper)
                # when the rank dies: it dies too.
                kill_descendants(me, keep=children)
                send("exit", pid, os.waitstatus_to_exitcode(status))
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE_BYTES, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            kill_descendants(me)
            os._exit(0)
        _, token, args, env, cwd = pickle.loads(data)
        try:
            pid = os.fork()
        except OSError as exc:  # a process limit: the pool says so, as an exec'd start would
            for f in fds:
                os.close(f)
            send("error", token, f"{type(exc).__name__}: {exc}")
            continue
        if pid == 0:
            _become_rank(sock, (wake_r, wake_w), fds[0], me, args, env, cwd, guard, body)
        for f in fds:
            os.close(f)
        children.add(pid)
        send("pid", token, pid)


def _become_rank(server: socket.socket, wake: tuple[int, int], fd: int, server_pid: int, args: tuple,
                 env: dict[str, str], cwd: str | None, guard: Callable[[int], None],
                 body: Callable[..., None]) -> None:
    """In the forked child: the rank's first statements (its death signal
    against the server, the parent check), the default SIGCHLD and no
    wake-up pipe (``wake``, the server's: unset before it is closed, so no
    signal writes into a reused descriptor), its own process group, the
    pool's environment and the starter's directory, then the rank's body.
    Never returns."""
    code = 0
    try:
        server.close()  # the starter sees the server's end close only when the server's own closes
        guard(server_pid)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for end in wake:
            os.close(end)
        os.setpgid(0, 0)
        if dict(os.environ) != env:  # a variable the server's key leaves out (VOLATILE)
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        body(*args[:5], fd, args[5])
    except BaseException:  # noqa: BLE001 - a rank's failure is its exit status
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# --- the starter's side ----------------------------------------------------------------


class ForkServer:
    """One server process and its channel; see the module's docstring."""

    def __init__(self, env: dict[str, str], worker: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _MESSAGE_BYTES)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(worker), SERVE_ARG, str(os.getpid()), str(theirs.fileno())],
                env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, process_group=0)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.ready = False  # torch imported: it forks from now on
        self.codes: dict[int, int] = {}  # exit status of each ended rank
        self.children: set[int] = set()  # ranks started and not yet reported ended
        # each rank's rendezvous file (what an exec'd rank's command line names)
        self.stores: dict[int, str] = {}
        self._pids: dict[int, int] = {}  # request token -> rank pid
        self._errors: dict[int, str] = {}  # request token -> why the server could not fork it
        self._next = 0
        self.dead = False

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def busy(self) -> bool:
        self.drain(0)
        return bool(self.children)

    def drain(self, timeout_s: float) -> None:
        """Read what the server said, waiting at most ``timeout_s`` for the first message."""
        while not self.dead:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout_s))
            if not ready:
                return
            timeout_s = 0.0
            try:
                data = self.sock.recv(_MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            msg = pickle.loads(data)
            if msg[0] == "ready":
                self.ready = True
            elif msg[0] == "pid":
                self._pids[msg[1]] = msg[2]
                self.children.add(msg[2])
            elif msg[0] == "error":
                self._errors[msg[1]] = msg[2]
            elif msg[0] == "exit":
                self.children.discard(msg[1])
                self.codes[msg[1]] = msg[2]

    def _lost(self) -> None:
        """The server ended: every rank it had not reported ended got its death
        signal (SIGKILL) as it did; another process reaps them."""
        self.dead = True
        for pid in self.children:
            self.codes.setdefault(pid, -signal.SIGKILL)
        self.children.clear()

    def wait_ready(self, deadline: float) -> bool:
        """Whether the server is ready (torch imported) by ``deadline`` (monotonic)."""
        while not self.ready and not self.dead:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.drain(min(left, 0.05))
            if not self.ready and self.proc.poll() is not None:
                self._lost()
        return self.ready and not self.dead

    def spawn(self, args: tuple, fd: int, env: dict[str, str], deadline: float) -> ForkedRank:
        """Fork a rank: ``args`` = (rank, world, backend, device, store, threads);
        ``fd`` its end of the starter's pipe (the server gets a copy); ``env``
        its environment. Raises :class:`TimeoutError` when the server has not
        answered by ``deadline`` (a stopped server)."""
        token = self._next
        self._next += 1
        try:
            cwd: str | None = os.getcwd()
        except OSError:  # a removed directory: the rank keeps the server's
            cwd = None
        try:
            socket.send_fds(self.sock, [pickle.dumps(("spawn", token, args, env, cwd))], [fd])
        except OSError as exc:
            self._lost()
            raise RuntimeError(f"the rank fork server is gone ({exc})") from None
        while token not in self._pids:
            if token in self._errors:
                raise RuntimeError(f"the rank fork server could not fork a rank: {self._errors.pop(token)}")
            if self.dead:
                raise RuntimeError("the rank fork server ended while forking a rank")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the rank fork server did not answer")
            self.drain(min(left, 0.05))
        pid = self._pids.pop(token)
        self.stores[pid] = args[4]
        return ForkedRank(self, pid)

    def close(self) -> None:
        """End the server (its live ranks get their death signal) and reap it."""
        self.dead = True
        self.sock.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedRank:
    """A forked rank, answering as ``subprocess.Popen`` does for an exec'd one
    (``pid``, ``poll``, ``wait``, ``kill``, ``returncode``: negative for a
    signal). Its status comes from the server, which reaps it; a rank that
    ended while the server cannot answer (stopped) is read from the kernel,
    which keeps an unreaped rank's status (``/proc/PID/stat``)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server = server
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self.server.codes.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.drain(0)
        if self.returncode is None:
            status = _unreaped_status(self.pid)
            if status is not None:
                return os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0.0)
            left = 0.05 if deadline is None else min(0.05, max(0.0, deadline - time.monotonic()))
            self.server.drain(left)
        return code

    def kill(self) -> None:
        # Directly: the server may be the one that is stuck. Until the server
        # reports the rank reaped, its pid is the rank's (a zombie's at worst).
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _unreaped_status(pid: int) -> int | None:
    """The wait status of ``pid`` if it is a zombie (ended, not yet reaped),
    from ``/proc/PID/stat``'s exit_code field (Linux 3.5+); else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    return int(fields[-1])


_SERVERS: dict[tuple[Any, ...], ForkServer] = {}


# Variables a server's key leaves out: pytest sets this one anew for every
# test, and no rank reads it at start-up; a forked rank still gets its value.
VOLATILE = ("PYTEST_CURRENT_TEST",)


def _key(env: dict[str, str], worker: Path) -> tuple[Any, ...]:
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE)
    return sys.executable, str(worker), threading.get_ident(), tuple(kept)


def find(env: dict[str, str], worker: Path) -> ForkServer | None:
    """The live server for ranks of ``env`` started from this thread, if any."""
    server = _SERVERS.get(_key(env, worker))
    return server if server is not None and server.alive else None


def start(env: dict[str, str], worker: Path) -> ForkServer | None:
    """The server for ranks of ``env`` started from this thread, started now
    (not waited for) if there is none; None when :data:`MAX_SERVERS` are busy."""
    key = _key(env, worker)
    server = _SERVERS.get(key)
    if server is not None and not server.alive:
        server.close()
        del _SERVERS[key]
        server = None
    if server is None:
        for other_key, other in list(_SERVERS.items()):
            if len(_SERVERS) < MAX_SERVERS:
                break
            if not other.busy():
                other.close()
                del _SERVERS[other_key]
        if len(_SERVERS) >= MAX_SERVERS:
            return None
        server = _SERVERS[key] = ForkServer(env, worker)
    return server


def server_for(env: dict[str, str], worker: Path, deadline: float) -> ForkServer | None:
    """The ready server for ranks of ``env`` started from this thread
    (:func:`start`); None when :data:`MAX_SERVERS` are busy (start by exec).
    Raises :class:`TimeoutError` when it is not ready by ``deadline`` (it is
    kept: the next pool's start waits on)."""
    server = start(env, worker)
    if server is None:
        return None
    key = _key(env, worker)
    if not server.wait_ready(deadline):
        if server.dead:
            del _SERVERS[key]
            server.close()
            raise RuntimeError(f"the rank fork server exited ({server.proc.poll()}) before it was ready")
        raise TimeoutError("the rank fork server was still importing torch")
    return server


def servers() -> list[ForkServer]:
    """The servers this process keeps."""
    return list(_SERVERS.values())


def close_servers() -> None:
    while _SERVERS:
        _, server = _SERVERS.popitem()
        server.close()


atexit.register(close_servers)
