"""What every real server the tests start shares: free loopback ports, a child that
dies with the test process, a scratch folder with the server's log, waiting until
it answers, and stopping it (its whole process group) and removing the folder.

:class:`ServerProcess` is the base of Azurite, fake-gcs-server, the OCI
distribution registry and SeaweedFS (tests/support/{azurite,fakegcs,ociregistry,seaweed}.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, however
    it dies (a killed pytest never runs the session's teardown)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def reap(proc: subprocess.Popen[Any], timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``proc`` to exit (killed after that),
    then close its stdout pipe."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class ThreadedServer:
    """An HTTP server object served on a daemon thread of this process, set up
    by :meth:`_serve`: ``endpoint`` (``http://127.0.0.1:<port>``), :meth:`start`
    and :meth:`stop`."""

    def _serve(self, server: Any) -> None:
        self._server = server
        self.endpoint = f"http://127.0.0.1:{server.server_port}"
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ServerProcess:
    """One server child process: ``spawn`` it, ``wait_until`` it answers, ``stop`` it.

    ``name`` names it in errors; ``log`` is the file name of its output in the
    scratch folder (None: output discarded)."""

    name = "server"
    log: str | None = "server.log"

    def __init__(self, prefix: str, binary: str | None, missing: str) -> None:
        """``binary``: the program it runs; None (not installed): a RuntimeError
        saying ``missing``, before any scratch folder is made."""
        if binary is None:
            raise RuntimeError(missing)
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file = None

    def spawn(self, args: list[str], *, cwd: Path | None = None) -> None:
        if self.log is not None:
            self._log_file = open(self._dir / self.log, "wb")  # noqa: SIM115 - closed in stop()
        out = self._log_file if self._log_file is not None else subprocess.DEVNULL
        self._proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=die_with_parent)

    def wait_until(self, answers: Callable[[], bool], timeout: float, interval: float,
                   errors: tuple[type[BaseException], ...] = (OSError,)) -> None:
        """Poll ``answers()`` until it is true; an error of ``errors`` means "not up
        yet" until ``timeout`` seconds have passed (then the server is stopped and
        the error raised). RuntimeError when the server exits first."""
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                tail = (": " + (self._dir / self.log).read_text()[-2000:]) if self.log else ""
                raise RuntimeError(f"{self.name} exited {self._proc.returncode}{tail}")
            try:
                if answers():
                    return
            except errors:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
            time.sleep(interval)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        if self._log_file is not None:
            self._log_file.close()
        shutil.rmtree(self._dir, ignore_errors=True)
