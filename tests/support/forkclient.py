"""The client of :mod:`tests.support.forkserver`: a server per test worker and
flavour, started on first use, and :class:`ForkedProcess`, the part of
``subprocess.Popen`` the suite uses, for a child it forked."""
from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class ForkedProcess:
    """A child forked by a :class:`ForkServer`: ``pid``, ``args``,
    ``returncode``, ``stdin``/``stdout``/``stderr`` (with ``PIPE``),
    ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``,
    ``kill``, a context manager, as ``subprocess.Popen``'s."""

    def __init__(self, args: list[str], conn: socket.socket, pipes: dict[str, IO[Any]]) -> None:
        self.args = args
        self._conn = conn
        self._buf = b""
        self.returncode: int | None = None
        self.stdin = pipes.get("stdin")
        self.stdout = pipes.get("stdout")
        self.stderr = pipes.get("stderr")
        self.pid = int(self._line(None)["pid"])

    def _line(self, timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            if not chunk:
                raise RuntimeError(f"fork server lost the child {self.args}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = int(self._line(0)["status"])
            except subprocess.TimeoutExpired:
                return None
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout)["status"])
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | bytes | None = None,
                    timeout: float | None = None) -> tuple[Any, Any]:
        """Write ``input``, read stdout and stderr to their ends, wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {}
        sel = selectors.DefaultSelector()
        text = {}
        for name in ("stdout", "stderr"):
            f = getattr(self, name)
            if f is not None:
                chunks[f.fileno()] = []
                text[f.fileno()] = isinstance(f, io.TextIOBase)
                sel.register(f.fileno(), selectors.EVENT_READ, name)
        pending = b""
        if self.stdin is not None:
            if input:
                pending = input.encode() if isinstance(input, str) else input
                sel.register(self.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
            else:
                self.stdin.close()
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            for key, _ in sel.select(left):
                if key.data == "stdin":
                    try:
                        n = os.write(key.fd, pending[:65536])
                    except BrokenPipeError:
                        n = len(pending)
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(key.fd)
                        self.stdin.close()  # type: ignore[union-attr]
                    continue
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
        sel.close()
        out: dict[str, Any] = {"stdout": None, "stderr": None}
        for name in ("stdout", "stderr"):
            f = getattr(self, name)
            if f is not None:
                raw = b"".join(chunks[f.fileno()])
                out[name] = (raw.decode("utf-8", "replace").replace("\r\n", "\n")
                             if text[f.fileno()] else raw)
                f.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(left)
        return out["stdout"], out["stderr"]

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.stdout, self.stderr, self.stdin):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.wait()


def _fd(spec: Any, default: int, opened: list[int]) -> tuple[int, int | None]:
    """(the child's fd, our end of a pipe or None) for a Popen stdio argument."""
    if spec is None:
        return default, None
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        opened.append(r if default == 0 else w)
        return (r, w) if default == 0 else (w, r)
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd, None
    if isinstance(spec, int):
        return spec, None
    return spec.fileno(), None


class ForkServer:
    def __init__(self, env: dict[str, str], *, cwd: Path, flavour: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix="fork-")
        self.sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", self.sock, flavour],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log,
            env=env, cwd=cwd)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"fork server did not start: {self.tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def popen(self, mode: str, args: list[str], *, env: dict[str, str],
              cwd: str | Path | None = None, stdin: Any = None, stdout: Any = None,
              stderr: Any = None, text: bool = False) -> ForkedProcess:
        """Fork a child: ``registry ARGS`` (mode ``cli``) or ``python ARGS``
        (mode ``python``), with Popen's stdio arguments."""
        opened: list[int] = []
        try:
            in_fd, in_end = _fd(stdin, 0, opened)
            out_fd, out_end = _fd(stdout, 1, opened)
            if stderr == subprocess.STDOUT:
                err_fd, err_end = out_fd, None
            else:
                err_fd, err_end = _fd(stderr, 2, opened)
            umask = os.umask(0)
            os.umask(umask)
            req = {"mode": mode, "args": args, "env": env, "umask": umask,
                   "cwd": os.path.abspath(cwd or os.getcwd())}
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(self.sock)
            socket.send_fds(conn, [json.dumps(req).encode() + b"\n"], [in_fd, out_fd, err_fd])
        finally:
            for fd in opened:
                os.close(fd)
        pipes: dict[str, IO[Any]] = {}
        for name, end, mode_ in (("stdin", in_end, "wb"), ("stdout", out_end, "rb"),
                                 ("stderr", err_end, "rb")):
            if end is not None:
                f: IO[Any] = open(end, mode_, buffering=0 if name == "stdin" else -1)
                if text:
                    f = io.TextIOWrapper(f, encoding="utf-8",  # type: ignore[arg-type]
                                         write_through=True)
                pipes[name] = f
        argv = ["registry", *args] if mode == "cli" else [sys.executable, *args]
        return ForkedProcess(argv, conn, pipes)


#: The environment the session started with: the fork servers' own, so that
#: no test's variables are frozen into what they import.
_SESSION_ENV = dict(os.environ)
_REPO = Path(__file__).resolve().parents[2]
_SERVERS: dict[str, ForkServer] = {}


def enabled(env: dict[str, str] | None = None) -> bool:
    """Whether a child with ``env`` is forked (``REGISTRY_TEST_FORK=0``: each
    is a new interpreter, as ``subprocess`` starts it). Not when ``env`` sets
    a variable read at import or at interpreter start (the BLAS/OpenMP thread
    counts numpy and torch fix when they load, which decide a float sum's
    order; the hash seed) to
    other than the server's value: the server loaded them with its own."""
    if os.environ.get("REGISTRY_TEST_FORK", "1") == "0":
        return False
    names = {k for k in (env or {}) if k.startswith(_IMPORT_TIME_PREFIXES)}
    names |= {k for k in _SESSION_ENV if k.startswith(_IMPORT_TIME_PREFIXES)}
    return all((env or os.environ).get(k) == _SESSION_ENV.get(k) for k in names)


#: Variables read when a module is imported (or the interpreter starts), not
#: when they are used. A forked trainer with OPENBLAS_NUM_THREADS=1 kept the
#: server's two BLAS threads: its final loss differed in the last bit from the
#: same run in a new interpreter (test_trainer_kill, 2026-12-02).
_IMPORT_TIME_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "GOTO_", "BLIS_",
                         "VECLIB_", "NUMEXPR_", "PYTHONHASHSEED")


def server(flavour: str = "") -> ForkServer:
    """This process's fork server of ``flavour`` (``""``, or ``"torch"``:
    torch imported too), started on first use."""
    s = _SERVERS.get(flavour)
    if s is None or not s.alive():
        s = _SERVERS[flavour] = ForkServer(_SESSION_ENV, cwd=_REPO, flavour=flavour)
        import atexit

        atexit.register(s.stop)
    return s


def python_popen(argv: list[str], *, torch: bool = False, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None, stdin: Any = None, stdout: Any = None,
                 stderr: Any = None, text: bool = False) -> ForkedProcess | subprocess.Popen:
    """``subprocess.Popen(argv, ...)`` for ``argv = [sys.executable, ...]``,
    forked from the warm server (with ``torch``, one that imported torch)."""
    assert argv[0] == sys.executable, argv
    flavour = _fork_flavour(argv, env, torch)
    if flavour is None:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=stdout,
                                stderr=stderr, text=text)
    return server(flavour).popen(
        "python", [str(a) for a in argv[1:]], env=dict(os.environ) if env is None else env,
        cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text)


@contextlib.contextmanager
def python_popens(argvs: list[list[str]], **kw: Any) -> Iterator[list[Any]]:
    """One :func:`python_popen` per argv (the same keywords for each); on the
    way out, any child still running is killed and reaped."""
    procs = [python_popen(argv, **kw) for argv in argvs]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


_TORCH_WORDS = ("torch", "loongsage", "dcp")
#: CLI arguments after which the command may import torch.
_CLI_TORCH_WORDS = ("loongsage", "dist_ckpt", "dcp")
#: Programs that set import-time state for themselves before numpy loads (the
#: example trainer pins BLAS to one thread for a bitwise-reproducible run): a
#: fork would run them with the server's, so they start as new interpreters.
_FRESH_WORDS = ("tinytrainer",)


def _code_text(args: list[str]) -> str:
    """The code the child runs (``-c`` text, ``-m`` module or script), "" if
    it cannot be read."""
    args = [a for a in args if a != "-u"]
    if not args:
        return ""
    try:
        if args[0] == "-c":
            return args[1]
        if args[0] == "-m":
            import importlib.util

            spec = importlib.util.find_spec(args[1])
            return Path(spec.origin).read_text() if spec and spec.origin else ""
        return Path(args[0]).read_text()
    except (OSError, ImportError, ValueError, IndexError):
        return ""


def _fork_flavour(argv: list[str], env: dict[str, str] | None, torch: bool) -> str | None:
    """The server ``argv`` with ``env`` is forked from: None when it is not
    forked (:func:`enabled`, or its code sets import-time state of its own,
    _FRESH_WORDS); ``"torch"`` when asked, or when its code names torch or
    what imports it (only a matter of speed: a child that imports torch
    elsewhere does it itself); else ``""``. Reads the child's code once."""
    if not enabled(env):
        return None
    text = _code_text([str(a) for a in argv[1:]])
    if any(w in text for w in _FRESH_WORDS):
        return None
    return "torch" if torch or any(w in text for w in _TORCH_WORDS) else ""


def forkable(argv: list[str], env: dict[str, str] | None) -> bool:
    """Whether ``argv`` with ``env`` is forked (see :func:`_fork_flavour`)."""
    return _fork_flavour(argv, env, False) is not None


def python_run(argv: list[str], *, input: str | bytes | None = None,
               capture_output: bool = False, text: bool = False,
               timeout: float | None = None, check: bool = False, torch: bool = False,
               env: dict[str, str] | None = None, cwd: str | Path | None = None,
               stdout: Any = None, stderr: Any = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, ...)`` for ``argv = [sys.executable, ...]``,
    forked from the warm server: the same result, ``TimeoutExpired`` (the
    child killed) and ``CalledProcessError``."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    flavour = _fork_flavour(argv, env, torch)
    if flavour is None:
        return subprocess.run(argv, input=input, stdout=stdout, stderr=stderr, text=text,
                              timeout=timeout, check=check, env=env, cwd=cwd)
    p = server(flavour).popen(
        "python", [str(a) for a in argv[1:]], env=dict(os.environ) if env is None else env,
        cwd=cwd, stdin=subprocess.PIPE if input is not None else None, stdout=stdout,
        stderr=stderr, text=text)
    return _finish(p, input, timeout, check)


def _finish(p: ForkedProcess | subprocess.Popen, input: Any, timeout: float | None,
            check: bool) -> subprocess.CompletedProcess:
    try:
        out, err = p.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    if check:
        r.check_returncode()
    return r


def cli_run(args: list[str], *, env: dict[str, str], cwd: str | Path | None,
            timeout: float) -> subprocess.CompletedProcess[str]:
    """``registry ARGS`` forked, as ``subprocess.run(..., capture_output=True,
    text=True)`` would give it; from the torch server when an argument names
    the LoongSage layout or a DCP part (``release create --layout loongsage
    --from dist_ckpt`` reads the step with torch: 2-3 s of imports a call)."""
    wants_torch = any(w in a.lower() for a in args for w in _CLI_TORCH_WORDS)
    p = server("torch" if wants_torch else "").popen("cli", args, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return _finish(p, None, timeout, False)
