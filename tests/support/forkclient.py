"""The client of :mod:`tests.support.forkserver`: one server per test worker,
started on its first call; each call's output goes through two files of its
own (no pipe to drain while it runs)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


class ForkServer:
    def __init__(self, env: dict[str, str], *, cwd: Path) -> None:
        self.dir = tempfile.mkdtemp(prefix="fork-")
        self.sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", self.sock],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log,
            env=env, cwd=cwd)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"fork server did not start: {self.tail()}")
        self.calls = 0

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

    def run(self, argv: list[str], *, env: dict[str, str], cwd: str | Path | None,
            timeout: float) -> subprocess.CompletedProcess[str]:
        """``registry ARGV`` in a process forked for it: as ``subprocess.run(...,
        capture_output=True, text=True, timeout=timeout)`` would return, and
        raising ``TimeoutExpired`` (after killing the call) as it would."""
        self.calls += 1
        out = os.path.join(self.dir, f"{os.getpid()}-{self.calls}.out")
        err = out[:-4] + ".err"
        for p in (out, err):
            open(p, "wb").close()
        umask = os.umask(0)
        os.umask(umask)
        req = {"argv": argv, "env": env, "cwd": os.path.abspath(cwd or os.getcwd()),
               "umask": umask, "stdout": out, "stderr": err}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(self.sock)
            conn.sendall(json.dumps(req).encode() + b"\n")
            conn.settimeout(timeout)
            rf = conn.makefile("rb")
            pid = json.loads(rf.readline())["pid"]
            try:
                line = rf.readline()
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["registry", *argv], timeout) from None
            finally:
                rf.close()
        if not line:
            raise RuntimeError(f"fork server lost call {argv}: {self.tail()}")
        status = json.loads(line)["status"]
        try:
            stdout = Path(out).read_text(encoding="utf-8", errors="replace")
            stderr = Path(err).read_text(encoding="utf-8", errors="replace")
        finally:
            os.unlink(out)
            os.unlink(err)
        return subprocess.CompletedProcess(["registry", *argv], status, stdout, stderr)
