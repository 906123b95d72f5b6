"""A real OCI registry for the tests: Debian's ``docker-registry`` (CNCF distribution 2.8).

:class:`Distribution` runs ``docker-registry serve CONFIG`` with filesystem
storage in a scratch folder on a free loopback port. Distribution 2.8 has no
referrers API: signatures go through the ``sha256-<hex>`` tag fallback there.
``skopeo`` (Debian) is the second OCI client the tests drive.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.seaweed import _die_with_parent


def registry_binary() -> str | None:
    """``docker-registry`` on PATH (Debian package docker-registry), or None."""
    return shutil.which("docker-registry")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Distribution:
    """``start()`` blocks until ``GET /v2/`` answers; ``host`` is ``127.0.0.1:PORT``."""

    def __init__(self) -> None:
        binary = registry_binary()
        if binary is None:
            raise RuntimeError("docker-registry is missing: apt-get install docker-registry")
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="distribution-"))
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> Distribution:
        config = self._dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self._dir / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n")
        self._log = open(self._dir / "registry.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen([self._binary, "serve", str(config)], stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True,
                                      preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self._proc.returncode}: "
                                   f"{(self._dir / 'registry.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        if getattr(self, "_log", None) is not None:
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)
