"""Warm starts: a server process that has imported MindSpore and the core once forks each trial's processes from
itself, so that a trial starts in a fraction of a second instead of paying the imports every time.

    with serving():                    # the agent, once per study (``python -m core.trial.fork_server <socket>``)
        proc = popen([sys.executable, "-m", "core.train", ...], stdout=f, stderr=f, start_new_session=True)
        proc.pid, proc.poll(), proc.wait(timeout), proc.returncode      # as subprocess.Popen's

``popen`` is ``subprocess.Popen`` wherever no server serves this process (``$MSAR_WARM_SOCKET`` unset) or the
command is not Python code of this interpreter (``-m module`` or ``-c code``, optionally after ``taskset -c
<cores>``, which becomes the child's CPU affinity); the supervisor of a multi-rank trial starts its scheduler and
workers through it too, so they are warm as well.

Why: ``import mindspore`` alone takes seconds on the 2-core machines here and Hydra's first compose a fraction of a
second more (benchmarks/RESULTS.md, "core/trial/fork_server.py"), and every trial of a study paid them again;
forked, a 1-rank trial with cached graphs reaches its first step several times sooner than cold
(benchmarks/RESULTS.md, "Fused optimizer kernels and warm starts"). A fork shares the imported pages copy-on-write
and takes milliseconds.

Why a fork server rather than a pool of processes started ahead: a spare process importing MindSpore while a
trial runs would take CPU from the trial it measures. Fork safety: the server is single-threaded apart from the
threads its imports start (NumPy's OpenBLAS pool, which OpenBLAS re-creates after a fork), and it never runs a
MindSpore op, so no runtime threads or device state exist to be copied. The child gets the client's environment,
working directory, standard streams (passed as file descriptors), ``sys.argv`` and ``PYTHONPATH`` entries, and
runs the module or code as ``python`` would.

The protocol, one connection per process: the client sends a length-prefixed JSON request with its three stdio
descriptors attached (SCM_RIGHTS); the server answers ``{"pid": N}`` once it has forked and ``{"returncode": rc}``
(``os.waitstatus_to_exitcode``, negative for a signal) when it has reaped the child.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence

from core.config import load_config
from core.runtime import native_env

SOCKET_ENV = "MSAR_WARM_SOCKET"
READY = "ready"
START_TIMEOUT_SEC = 180.0  # the server's own imports, on a loaded machine
# What a trial process imports (and what Hydra reads) before its first step: done once in the server.
PRELOAD = (
    "mindspore",
    "core.training.trainer",
    "core.trial.supervisor",
    "core.runtime.compile_cache",
    "mindspore.communication",
)
_HEADER = struct.Struct("!Q")


# ---- client ----------------------------------------------------------------------------------------------------
class WarmProcess:
    """A process the warm server forked: the part of ``subprocess.Popen``'s interface that trials use."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int):
        self.args, self.pid, self.returncode = args, pid, None
        self._conn, self._buffer = conn, b""

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(left if left is None else min(left, 1.0))
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        if self._conn is None:  # the server is gone: the child runs on as an orphan until it ends by itself
            self._orphan_poll(timeout)
            return
        self._conn.settimeout(timeout)
        try:
            data = self._conn.recv(4096)
        except (TimeoutError, BlockingIOError):
            return
        if not data:
            self._conn.close()
            self._conn = None
            return
        self._buffer += data
        for line in self._buffer.split(b"\n")[:-1]:
            self.returncode = int(json.loads(line)["returncode"])

    def _orphan_poll(self, timeout: float | None) -> None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = 1  # its code went to the server, which died: an error the trial's summary explains
            return
        time.sleep(min(timeout if timeout is not None else 0.2, 0.2))


def popen(
    args: Sequence[str],
    *,
    stdin=None,
    stdout=None,
    stderr=None,
    env: dict | None = None,
    cwd=None,
    start_new_session: bool = False,
):
    """``subprocess.Popen(args, ...)``, from the warm server when one serves this process and ``args`` runs
    Python code of this interpreter (module docstring); otherwise, or when the server cannot be reached (it
    forked nothing then: the process is started cold, with a warning on stderr), ``subprocess.Popen`` itself.
    The server is the one ``env`` names (``$MSAR_WARM_SOCKET``), else this process's: a caller may keep a server
    out of its own environment and give it to the processes it chooses (the integration tests' ``warm``)."""
    args = [str(a) for a in args]
    address = (env or {}).get(SOCKET_ENV) or os.environ.get(SOCKET_ENV)
    affinity, python = _split_taskset(args)
    if address and _warm_command(python) and subprocess.PIPE not in (stdin, stdout, stderr):
        try:
            return _fork_remote(address, args, python[1:], affinity, stdin, stdout, stderr, env, cwd, start_new_session)
        except OSError as exc:
            print(f"core.trial.fork_server: {exc}; starting {args[:4]} cold", file=sys.stderr, flush=True)
    return subprocess.Popen(
        args, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, start_new_session=start_new_session
    )


def _fork_remote(
    address: str, args: list[str], argv: list[str], affinity, stdin, stdout, stderr, env, cwd, start_new_session: bool
) -> WarmProcess:
    """Ask the server at ``address`` to fork ``python *argv``; OSError if it forked nothing."""
    request = {
        "argv": argv,
        "env": dict(os.environ if env is None else env),
        "cwd": os.path.abspath(cwd or os.getcwd()),
        "new_session": start_new_session,
        "affinity": affinity,
    }
    body = json.dumps(request).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # stays open: the server reports the exit on it
    try:
        try:
            conn.connect(address)
        except OSError as exc:
            raise OSError(f"no warm server at {address} ({exc.strerror or exc})") from exc
        with contextlib.ExitStack() as opened:  # the descriptors travel with the request (the server dups them)
            fds = [_fd(s, i, opened) for i, s in enumerate((stdin, stdout, stderr))]
            if stderr == subprocess.STDOUT:
                fds[2] = fds[1]
            socket.send_fds(conn, [_HEADER.pack(len(body)) + body], fds)
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise OSError(f"the warm server at {address} closed the connection before forking")
            reply += chunk
    except BaseException:
        conn.close()
        raise
    first, _, rest = reply.partition(b"\n")
    proc = WarmProcess(args, conn, int(json.loads(first)["pid"]))
    proc._buffer = rest
    return proc


def _split_taskset(args: list[str]) -> tuple[list[int] | None, list[str]]:
    """``taskset -c 0-1,3 python ...`` -> ([0, 1, 3], ["python", ...]); other commands are left as they are."""
    if len(args) > 3 and os.path.basename(args[0]) == "taskset" and args[1] == "-c":
        cores = []
        for part in args[2].split(","):
            lo, _, hi = part.partition("-")
            cores.extend(range(int(lo), int(hi or lo) + 1))
        return cores, args[3:]
    return None, args


def _warm_command(args: list[str]) -> bool:
    return len(args) >= 3 and os.path.realpath(args[0]) == os.path.realpath(sys.executable) and args[1] in ("-m", "-c")


def _fd(stream, index: int, opened: contextlib.ExitStack) -> int:
    if stream is None or stream == subprocess.STDOUT:
        return index  # inherit this process's own (STDOUT: replaced by stdout's by the caller)
    if stream == subprocess.DEVNULL:
        return opened.enter_context(open(os.devnull, "rb" if index == 0 else "wb")).fileno()
    return stream if isinstance(stream, int) else stream.fileno()


# ---- the server ------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def serving(preload: Sequence[str] = PRELOAD):
    """Run a warm server for this process and its children (``$MSAR_WARM_SOCKET``) while the block runs."""
    folder = tempfile.mkdtemp(prefix="msar-warm-")  # AF_UNIX paths are short (108 bytes): not under the study
    address = os.path.join(folder, "socket")
    # MindSpore's C++ logging takes its level from GLOG_v when it loads, in the server: the level trial processes
    # log at (3: errors only, what the supervisor gives its workers) unless this process's environment sets one.
    env = {"GLOG_v": "3", **os.environ}
    server = subprocess.Popen(
        [sys.executable, "-m", "core.trial.fork_server", address, *preload],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        with selectors.DefaultSelector() as started:  # the server's imports: seconds, once; a hang must not hang us
            started.register(server.stdout, selectors.EVENT_READ)
            line = server.stdout.readline().strip() if started.select(START_TIMEOUT_SEC) else "nothing"
        if line != READY:
            raise RuntimeError(
                f"the warm server did not start within {START_TIMEOUT_SEC:.0f} s (said {line!r}, exit {server.poll()})"
            )
        before = os.environ.get(SOCKET_ENV)
        os.environ[SOCKET_ENV] = address
        try:
            yield address
        finally:
            if before is None:
                os.environ.pop(SOCKET_ENV, None)
            else:
                os.environ[SOCKET_ENV] = before
    finally:
        server.stdin.close()  # its cue to exit
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


def serve(address: str, preload: Sequence[str]) -> None:
    """The server's loop: fork a child per request, report its pid and then its exit; end when stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the agent's terminal: the agent ends us (stdin)
    native_env.apply()  # MindSpore's libraries read it as they load, here, once for every child
    for module in preload:
        importlib.import_module(module)
    _warm_hydra()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(sys.stdin, selectors.EVENT_READ)
    print(READY, flush=True)
    while True:
        for key, _ in sel.select(timeout=0.05):
            if key.fileobj is sys.stdin:
                if not os.read(sys.stdin.fileno(), 4096):
                    return  # the agent closed our stdin (or died): children run on in their own sessions
                continue
            conn, _ = listener.accept()
            pid = _fork_child(conn, listener)
            if pid is not None:
                waiting[pid] = conn
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                conn.close()


def _warm_hydra() -> None:
    """Compose the config once, so that the children's first compose finds Hydra's config search path built."""
    load_config([])


def _fork_child(conn: socket.socket, listener: socket.socket) -> int | None:
    try:
        head, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        size = _HEADER.unpack(head[: _HEADER.size])[0]
        body = head[_HEADER.size :]
        while len(body) < size:
            body += conn.recv(size - len(body))
        request = json.loads(body)
    except (OSError, ValueError, struct.error) as e:
        print(f"warm server: bad request ({e})", file=sys.stderr, flush=True)
        conn.close()
        return None
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        _run_child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    return pid


def _run_child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the process the client asked for, run it as ``python`` would, exit."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if request["affinity"]:
            os.sched_setaffinity(0, request["affinity"])
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        code = _run_python(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 — reported as python would, then the exit code says it
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_python(argv: list[str]) -> int:
    """``python -m module args`` or ``python -c code args`` in this process."""
    flag, target, rest = argv[0], argv[1], argv[2:]
    # sys.path as a fresh interpreter would have it: the working directory first, then $PYTHONPATH.
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[0:1] = ["" if flag == "-c" else os.getcwd(), *extra]
    if flag == "-m":
        sys.argv = [target, *rest]
        _as_entry_script(importlib.util.find_spec(target).origin)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *rest]
        _as_entry_script("-c")
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    return 0


def _as_entry_script(argv0: str) -> None:
    """MindSpore workaround: ``mindspore.graph.api`` reads the entry script (``sys.argv[0]``) and ``sys.path`` once,
    when it is imported, and its compile cache hashes the files that script imports; imported by the server, it would
    name ``core/trial/fork_server.py``, and no graph a cold process saved would load (nor the other way round). So the
    child sets them as its import in a fresh ``python -m``/``-c`` would have."""
    api = sys.modules.get("mindspore.graph.api")
    if api is None:
        return
    api.sys_path = list(sys.path)
    api.entry_script_path = os.path.realpath(argv0)
    folder = os.path.dirname(api.entry_script_path)
    if folder in api.sys_path:
        api.sys_path.remove(folder)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
