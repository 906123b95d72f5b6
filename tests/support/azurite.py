"""A real Azure Blob server for the test matrix: Azurite (issue 49).

Azurite comes from npm (``azurite``, the version pinned in ``.ci/run``,
installed into ``.azurite/`` of the checkout); ``REGISTRY_AZURITE`` may name
another ``azurite-blob`` executable. :class:`Azurite` runs
``azurite-blob --inMemoryPersistence --loose --skipApiVersionCheck`` on a
free loopback port in a scratch folder; the well-known development account
(``devstoreaccount1``) reaches it through ``AZURE_STORAGE_CONNECTION_STRING``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.seaweed import _die_with_parent

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "devstoreaccount1"
#: Azurite's published development key (not a secret: every Azurite has it).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> str | None:
    """``$REGISTRY_AZURITE``, the checkout's ``.azurite`` install, or PATH's ``azurite-blob``."""
    named = os.environ.get("REGISTRY_AZURITE")
    if named:
        return named if Path(named).is_file() else None
    local = REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.is_file():
        return str(local)
    return shutil.which("azurite-blob")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Azurite:
    """``start()`` blocks until the blob service answers."""

    def __init__(self) -> None:
        binary = azurite_binary()
        if binary is None:
            raise RuntimeError("azurite-blob is missing: .ci/run installs it from npm")
        self._binary = binary
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self._dir = Path(tempfile.mkdtemp(prefix="azurite-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint};")

    def start(self, timeout: float = 90.0) -> Azurite:
        self._log = open(self._dir / "azurite.log", "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [self._binary, "--inMemoryPersistence", "--loose", "--skipApiVersionCheck",
             "--disableTelemetry", "--blobHost", "127.0.0.1", "--blobPort", str(self.port)],
            cwd=self._dir, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"azurite exited {self._proc.returncode}: "
                                   f"{(self._dir / 'azurite.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.endpoint}?comp=list", timeout=2)
            except urllib.error.HTTPError:
                return self  # it answers (403: the request is unsigned)
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.3)
            else:
                return self

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as client:
            client.create_container(name)

    def env(self) -> dict[str, str]:
        """What points adlfs (and child processes) here."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

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
