"""CPU ranks forked from a server that has already imported torch.

Why (an exec'd rank's seconds of torch import, per rank), and how the chain
starter -> server -> rank ends as the direct one does: docs/design.md,
"Starting ranks". The server is ``_worker.py fork-server``, started exactly
as a rank is; it reaps its ranks and sends each exit status to the starter,
where :class:`ForkedRank` answers for it as ``subprocess.Popen`` does for an
exec'd rank.

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
import contextlib
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

from .hangs import is_stopped
from .reap import kill_descendants, proc_stat
from .switches import env_switch


# Set to 0 (false, no, off) to start every rank by exec.
FORK_ENV = "NSA_CP_COMM_FORK_RANKS"
# _worker.py's first argument that makes it a server (its SERVE_ARG; not
# imported from it: _worker imports this module).
SERVE_ARG = "fork-server"
# Servers kept at once (one per environment and thread a pool was started
# with); beyond it, an idle one is closed, and with none idle ranks start by exec.
MAX_SERVERS = 3
# The largest message either side sends. A spawn request names a file with
# the rank's environment (write_env), so it stays small whatever the
# environment holds; a larger one is refused before it is sent.
_MESSAGE_BYTES = 1 << 20
# How long a server gets to answer a health check, or a spawn request, before
# it is named, replaced and the ranks start by exec.
ANSWER_S = 10.0


def write_env(env: dict[str, str], near: str) -> str:
    """``env`` in a private JSON file next to ``near`` (the rendezvous file);
    its path. The server reads it and removes it (:func:`read_env`)."""
    import json
    import tempfile

    fd, path = tempfile.mkstemp(prefix=".rank-env-", dir=os.path.dirname(near) or ".")
    with os.fdopen(fd, "w") as f:
        json.dump(env, f)
    return path


def read_env(path: str) -> dict[str, str]:
    import json

    try:
        with open(path) as f:
            env = json.load(f)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the environment file does not hold a str -> str mapping")
    return env


def usable(device: str) -> bool:
    """Whether ranks of ``device`` start from a fork server here."""
    return device == "cpu" and sys.platform.startswith("linux") and env_switch(FORK_ENV, True)


# --- the server's side: runs in the process _worker.py starts -------------------------


def serve(fd: int, guard: Callable[[int], None], body: Callable[..., None]) -> None:
    """The server's loop, in a process whose first statements already tied it
    to its starter (``_worker.py``, which has imported torch and the rank's
    ``body``, ``rank_body.worker_main``): say ready, then fork a rank for every
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
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
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
        try:
            kind, token, *rest = pickle.loads(data)
            if kind == "ping":
                send("pong", token)
                continue
            args, env_path, cwd = rest
            env = read_env(env_path)
        except Exception as exc:  # noqa: BLE001 - a bad request is its error, not the server's end
            for f in fds:
                os.close(f)
            send("error", locals().get("token"), f"a bad request: {type(exc).__name__}: {exc}")
            continue
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

    def start() -> None:
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

    run_then_exit(start)


def run_then_exit(body: Callable[[], None]) -> None:
    """A rank's end, forked or exec'd: ``body``, its traceback on failure
    (exit 1, else 0), the streams flushed, then ``os._exit``: no exit handler
    runs in a rank, since one a plug-in registered could block forever."""
    code = 0
    try:
        body()
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
        self._pongs: set[int] = set()
        self.dead = False

    def stopped(self) -> str:
        """``": it is stopped (SIGSTOP?)"`` when the server's process is, else ''."""
        return ": it is stopped (SIGSTOP?)" if is_stopped(self.proc.pid) else ""

    def healthy(self, timeout_s: float = ANSWER_S) -> str:
        """'' when the server answers a ping within ``timeout_s``; else why not."""
        if not self.alive:
            return f"the rank fork server (pid {self.proc.pid}) has ended ({self.proc.poll()})"
        why = self.stopped()
        if why:
            return f"the rank fork server (pid {self.proc.pid}) does not answer{why}"
        token = self._next
        self._next += 1
        try:
            self.sock.send(pickle.dumps(("ping", token)))
        except OSError as exc:
            self._lost()
            return f"the rank fork server (pid {self.proc.pid}) is gone ({exc})"
        deadline = time.monotonic() + timeout_s
        while token not in self._pongs and not self.dead and time.monotonic() < deadline:
            self.drain(min(0.05, max(0.0, deadline - time.monotonic())))
        if token in self._pongs:
            self._pongs.discard(token)
            return ""
        if self.dead:
            return f"the rank fork server (pid {self.proc.pid}) has ended"
        return f"the rank fork server (pid {self.proc.pid}) did not answer a health check within {timeout_s:g}s{self.stopped()}"

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
            elif msg[0] == "pong":
                self._pongs.add(msg[1])
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
            if not self.ready and self.stopped():
                return False
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
        env_path = write_env(env, args[4])
        request = pickle.dumps(("spawn", token, args, env_path, cwd))
        if len(request) > _MESSAGE_BYTES // 2:
            os.unlink(env_path)
            raise RuntimeError(f"a spawn request of {len(request)} bytes is over the fork server's bound")
        try:
            socket.send_fds(self.sock, [request], [fd])
        except OSError as exc:
            os.unlink(env_path)
            self._lost()
            raise RuntimeError(f"the rank fork server is gone ({exc})") from None
        answer_by = min(deadline, time.monotonic() + ANSWER_S)
        while token not in self._pids:
            if token in self._errors:
                raise RuntimeError(f"the rank fork server could not fork a rank: {self._errors.pop(token)}")
            if self.dead:
                raise RuntimeError("the rank fork server ended while forking a rank")
            left = answer_by - time.monotonic()
            if left <= 0:
                if time.monotonic() >= deadline:
                    raise TimeoutError("the rank fork server did not answer")
                raise RuntimeError(f"the rank fork server (pid {self.proc.pid}) did not answer a spawn request "
                                   f"within {ANSWER_S:g}s{self.stopped()}")
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
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _unreaped_status(pid: int) -> int | None:
    """The wait status of ``pid`` if it is a zombie (ended, not yet reaped),
    from ``/proc/PID/stat``'s exit_code field (Linux 3.5+); else None."""
    fields = proc_stat(pid)
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return int(fields[-1])


_SERVERS: dict[tuple[Any, ...], ForkServer] = {}


# Variables a server's key leaves out, none read by a rank at start-up (a
# forked rank still gets its value): pytest sets PYTEST_CURRENT_TEST anew for
# every test; the app sets HYDRA_FULL_ERROR for Hydra in its own process
# (matrix.app.sweep), so a sweep run in a process that had pools before it
# would otherwise start a second server; torch sets TORCHINDUCTOR_CACHE_DIR in
# the starter to the default a rank derives alike, when its inductor loads.
VOLATILE = ("PYTEST_CURRENT_TEST", "HYDRA_FULL_ERROR", "TORCHINDUCTOR_CACHE_DIR")


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
        print(f"warning: the rank fork server (pid {server.proc.pid}) has ended ({server.proc.poll()}); "
              "it is replaced", file=sys.stderr, flush=True)
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
    if server.ready:
        why = server.healthy(min(ANSWER_S, max(0.1, deadline - time.monotonic())))
        if why:
            replace(key, why)
            return None
    if not server.wait_ready(deadline):
        if not server.dead and server.stopped():
            replace(key, f"the rank fork server (pid {server.proc.pid}) does not answer{server.stopped()}")
            return None
        if server.dead:
            del _SERVERS[key]
            server.close()
            raise RuntimeError(f"the rank fork server exited ({server.proc.poll()}) before it was ready")
        raise TimeoutError("the rank fork server was still importing torch")
    return server


def replace(key: tuple[Any, ...], why: str) -> None:
    """Name a failed server on stderr, end it and start its replacement (not
    waited for): the ranks at hand start by exec, later pools fork again."""
    server = _SERVERS.pop(key, None)
    if server is None:
        return
    print(f"warning: {why}; it is replaced, and these ranks start by exec", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        os.kill(server.proc.pid, signal.SIGKILL)
    server.close()
    server._lost()  # its ranks died with it: their status is known
    with contextlib.suppress(OSError):
        _SERVERS[key] = ForkServer(dict(key[3]), Path(key[1]))


def replace_server_of(server: ForkServer, why: str) -> None:
    """:func:`replace` for ``server``, wherever it is kept."""
    for key, kept in list(_SERVERS.items()):
        if kept is server:
            replace(key, why)


def servers() -> list[ForkServer]:
    """The servers this process keeps."""
    return list(_SERVERS.values())


def close_servers() -> None:
    while _SERVERS:
        _, server = _SERVERS.popitem()
        server.close()


atexit.register(close_servers)
