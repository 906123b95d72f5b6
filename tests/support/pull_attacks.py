"""The attack harness shared by tests/test_signing.py and tests/test_signing_certs.py.

An attacker with write access to the bucket rewrites a committed release
(:func:`rewrite`); a real ``registry pull`` process must then refuse each
attacked version (:func:`assert_pulls_refused`: exit 1, one line on stderr
saying why, nothing placed) and never download the attacker's bytes
(:func:`assert_never_downloaded`).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from pathlib import Path

from registry.protocol.manifest import MANIFEST, FileEntry, Manifest
from registry.store import Store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli


def rewrite(store: Store, model: str, version: str, files: Mapping[str, bytes | None]) -> None:
    """The attacker: replace/add (bytes) or delete (None) files of the committed
    release ``model@version`` and rewrite its MANIFEST.json to match, as anyone
    with bucket write access can."""
    prefix = f"models/{model}/{version}"
    m = read_manifest(store, prefix)
    entries = {e.path: e for e in m.files}
    for path, data in files.items():
        if data is None:
            store.delete(f"{prefix}/{path}")
            entries.pop(path, None)
        else:
            store.write_bytes(f"{prefix}/{path}", data)
            entries[path] = FileEntry(path, len(data), hashlib.sha256(data).hexdigest())
    forged = Manifest.build("release", entries.values(), **dict(m.meta))
    store.write_bytes(f"{prefix}/{MANIFEST}", forged.to_bytes())


def assert_pulls_refused(model: str, attacks: Mapping[str, tuple[str, str]], serving: Path,
                         *pull_args: str, env: dict[str, str] | None = None
                         ) -> dict[str, subprocess.CompletedProcess[str]]:
    """Pull each attacked version (``attacks``: attack -> (version, what the
    refusal says)) with a real ``registry pull ... --to serving/<model>-<version>
    PULL_ARGS`` process; each must exit 1 with one stderr line holding its
    reason, and nothing may appear under ``serving``. Returns the processes
    by attack."""
    out = {}
    for attack, (version, why) in attacks.items():
        r = run_cli("pull", f"{model}@{version}", "--to", str(serving / f"{model}-{version}"),
                    *pull_args, env=env)
        assert r.returncode == 1, (attack, r.stdout, r.stderr)
        assert why in r.stderr and len(r.stderr.strip().splitlines()) == 1, (attack, r.stderr)
        assert not serving.exists() or not any(serving.iterdir()), attack
        out[attack] = r
    return out


def assert_never_downloaded(cache: Path, data: bytes) -> None:
    """The pull cache at ``cache`` holds no blob of ``data`` (the attacker's bytes)."""
    blob = cache / "blobs" / "sha256" / hashlib.sha256(data).hexdigest()
    assert not blob.exists(), blob
