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
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.servers import ServerProcess, free_port

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


class Azurite(ServerProcess):
    """``start()`` blocks until the blob service answers."""

    name, log = "azurite", "azurite.log"

    def __init__(self) -> None:
        super().__init__("azurite-", azurite_binary(),
                         "azurite-blob is missing: .ci/run installs it from npm")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                f"BlobEndpoint={self.endpoint};")

    def start(self, timeout: float = 90.0) -> Azurite:
        self.spawn([self._binary, "--inMemoryPersistence", "--loose", "--skipApiVersionCheck",
                    "--disableTelemetry", "--blobHost", "127.0.0.1", "--blobPort",
                    str(self.port)], cwd=self._dir)

        def answers() -> bool:
            try:
                urllib.request.urlopen(f"{self.endpoint}?comp=list", timeout=2)
            except urllib.error.HTTPError:
                pass  # it answers (403: the request is unsigned)
            return True

        self.wait_until(answers, timeout, 0.3)
        return self

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as client:
            client.create_container(name)

    def env(self) -> dict[str, str]:
        """What points adlfs (and child processes) here."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}
