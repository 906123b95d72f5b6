"""A real OCI registry for the tests: Debian's ``docker-registry`` (CNCF distribution 2.8).

:class:`Distribution` runs ``docker-registry serve CONFIG`` with filesystem
storage in a scratch folder on a free loopback port. Distribution 2.8 has no
referrers API: signatures go through the ``sha256-<hex>`` tag fallback there.
``skopeo`` (Debian) is the second OCI client the tests drive.
"""

from __future__ import annotations

import shutil
import urllib.request

from tests.support.servers import ServerProcess, free_port


def registry_binary() -> str | None:
    """``docker-registry`` on PATH (Debian package docker-registry), or None."""
    return shutil.which("docker-registry")


class Distribution(ServerProcess):
    """``start()`` blocks until ``GET /v2/`` answers; ``host`` is ``127.0.0.1:PORT``."""

    name, log = "docker-registry", "registry.log"

    def __init__(self) -> None:
        super().__init__("distribution-", registry_binary(),
                         "docker-registry is missing: apt-get install docker-registry")
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> Distribution:
        config = self._dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self._dir / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n")
        self.spawn([self._binary, "serve", str(config)])

        def answers() -> bool:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                return r.status == 200

        self.wait_until(answers, timeout, 0.2)
        return self
