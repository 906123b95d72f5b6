"""Credentials for an OCI registry: given, or from the Docker config.

Order: ``--username`` with ``--password-stdin``; else the Docker config
(``$DOCKER_CONFIG/config.json``, default ``~/.docker/config.json``; then
``$REGISTRY_AUTH_FILE``, the containers ``auth.json`` skopeo and podman
write): a ``credHelpers`` entry for the host or a ``credsStore``, run as the
Docker credential-helper protocol (``docker-credential-<name> get``, the host
on stdin), else the ``auths`` entry's ``auth`` (base64 ``user:password``).
Nothing is read until a registry asks (a 401).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import StoragePermissionError, UsageError

_HELPER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: seconds a credential helper may take
HELPER_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Credentials:
    """``username``/``password`` given on the command line, else looked up."""

    username: str | None = None
    password: str | None = None

    def __post_init__(self) -> None:
        if (self.username is None) != (self.password is None):
            raise UsageError("--username and --password-stdin: give both or neither")

    def basic(self, host: str) -> str | None:
        """``base64(user:password)`` for ``host``, None when none is known.

        Raises:
            StoragePermissionError: a credential helper failed or answered
                something that is not its JSON.
        """
        if self.username is not None and self.password is not None:
            return _b64(self.username, self.password)
        for path in _config_files():
            found = _from_config(path, host)
            if found is not None:
                return found
        return None


def _b64(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def _config_files() -> list[Path]:
    docker = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    files = [docker]
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    return [p for p in files if p.is_file()]


def _from_config(path: Path, host: str) -> str | None:
    try:
        doc = json.loads(path.read_bytes()[:1 << 20])
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    helpers = _dict(doc.get("credHelpers"))
    helper = helpers.get(host) or doc.get("credsStore")
    if isinstance(helper, str) and helper:
        found = _helper(helper, host)
        if found is not None:
            return found
    auths = _dict(doc.get("auths"))
    for key in (host, f"https://{host}", f"http://{host}"):
        entry = auths.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("auth"), str) and entry["auth"]:
            return str(entry["auth"])
    return None


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _helper(name: str, host: str) -> str | None:
    """Ask ``docker-credential-<name>`` for ``host`` (argv, no shell)."""
    if not _HELPER.fullmatch(name):
        raise StoragePermissionError(f"credential helper {name!r}: not a helper name")
    try:
        out = subprocess.run([f"docker-credential-{name}", "get"], input=host.encode(),
                             capture_output=True, timeout=HELPER_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StoragePermissionError(f"credential helper docker-credential-{name}: {e}") \
            from None
    if out.returncode != 0:
        return None  # "credentials not found in native keychain"
    try:
        doc = json.loads(out.stdout[:1 << 20])
        return _b64(str(doc["Username"]), str(doc["Secret"]))
    except (ValueError, KeyError, TypeError):
        raise StoragePermissionError(f"credential helper docker-credential-{name}: answered "
                                     "something that is not its JSON") from None
