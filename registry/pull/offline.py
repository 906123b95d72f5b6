"""Offline pulls: ``registry pull --offline`` (``REGISTRY_OFFLINE=1``) from the cache alone.

Every pull remembers, in its cache, what it resolved and what it placed::

    <cache>/
    ├── manifests/<manifest_sha256>.json     the release's canonical MANIFEST.json
    └── refs/<model_id>/<name>               "<version> <manifest_sha256>\\n" for the
                                             name pulled (an alias or a version)
                                             and for the version itself

An offline pull resolves ``model_id@name`` from ``refs/`` (an alias is what it
pointed to at the last online pull of it), reads the manifest back and checks
its sha256 against the digest the ref names, and then runs the ordinary pull
over :class:`CacheStore`, a store that holds exactly that manifest and the
cache's blobs: files already placed in the target are re-checked by their
stat stamps (re-hashed when changed), files with a blob are copied from it
(the blob re-checked as on every pull), and a file with neither (pulled with
``--no-blobs``, or pruned since) is a clear error naming it. Nothing touches
the network or the store. Gates are not re-evaluated (the live ledger is in
the store); a signature is checked when trusted keys are given, from the
cached ``model.sig``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path
from typing import IO

from registry.rules import limits
from registry.errors import IntegrityError, NotCommittedError, ObjectNotFoundError, StorageError
from registry.protocol.layout import release_prefix
from registry.protocol.manifest import MANIFEST, Manifest, parse_manifest
from registry.rules.names import check_model_id, check_name, model_key
from registry.pull import privacy
from registry.pull.cache import Cache, temp_tag
from registry.store.base import ObjectInfo, Store

#: ``$REGISTRY_OFFLINE``: ``1`` makes every ``registry pull`` an offline one
OFFLINE_ENV = "REGISTRY_OFFLINE"


def offline_from_env() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _write(path: Path, data: bytes, group: int | None = None) -> None:
    privacy.make_private_dir(path.parent, group)
    tmp = path.with_name(f".{path.name}.{temp_tag()}.tmp")
    privacy.write_private(tmp, data, group)
    os.replace(tmp, path)


def remember(cache: Cache, model_id: str, names: tuple[str, ...], version: str,
             manifest: Manifest) -> None:
    """Record that ``names`` of ``model_id`` resolved to ``version`` (whose
    manifest is ``manifest``) at this pull (atomic renames; the last pull wins)."""
    _write(cache.root / "manifests" / f"{manifest.digest}.json", manifest.to_bytes(),
           cache.group)
    for name in dict.fromkeys((*names, version)):
        _write(cache.root / "refs" / model_key(model_id) / name,
               f"{version} {manifest.digest}\n".encode(), cache.group)


def recall(cache: Cache, model_id: str, name: str) -> tuple[str, Manifest]:
    """The version and manifest ``model_id@name`` resolved to at its last pull
    into ``cache``.

    Raises:
        NotCommittedError: ``model_id@name`` was never pulled into this cache.
        IntegrityError: the cached manifest's bytes differ from the digest
            the ref names.
    """
    check_model_id(model_id)
    check_name(name, "version or alias")
    ref = cache.root / "refs" / model_key(model_id) / name
    try:
        if not privacy.usable(ref, cache.group):  # another user's ref: untrusted
            raise PermissionError(str(ref))
        version, digest = limits.read_local(ref, limits.MAX_POINTER_BYTES).decode().split()
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(digest)
    except (OSError, ValueError, UnicodeDecodeError):
        raise NotCommittedError(f"{model_id}@{name}: never pulled into {cache.root} (an "
                                "offline pull places only what an earlier pull of the same "
                                "ref recorded)", path=str(ref)) from None
    path = cache.root / "manifests" / f"{digest}.json"
    try:
        data = limits.read_local(path, limits.MAX_MANIFEST_BYTES)
    except OSError:
        raise NotCommittedError(f"{path}: the manifest of {model_id}@{version} is gone from "
                                "the cache", path=str(path)) from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise IntegrityError(str(path), expected_sha256=digest, actual_sha256=actual)
    return check_name(version, "version"), parse_manifest(data, source=str(path))


class CacheStore(Store):
    """A read-only store holding one release: its manifest and whichever of
    its files the cache has a blob of (the pull verifies what it reads)."""

    def __init__(self, cache: Cache, model_id: str, version: str, manifest: Manifest) -> None:
        super().__init__(f"offline:{cache.root}", None, "")  # type: ignore[arg-type]
        self.cache = cache
        self.prefix = release_prefix(model_id, version)
        self.manifest = manifest

    def _blob(self, key: str) -> Path:
        path = key[len(self.prefix) + 1:] if key.startswith(self.prefix + "/") else None
        entry = self.manifest.entry(path) if path else None
        if entry is None or not self.cache.has(entry.sha256, entry.size):
            raise ObjectNotFoundError(
                f"offline: {key} is not in the cache {self.cache.root} (pulled with "
                "--no-blobs into another target, or pruned since): pull it online once",
                key=key)
        return self.cache.blob(entry.sha256)

    def open_read(self, key: str) -> IO[bytes]:
        if key == f"{self.prefix}/{MANIFEST}":
            return io.BytesIO(self.manifest.to_bytes())
        return open(self._blob(key), "rb")

    def info(self, key: str) -> ObjectInfo:
        if key == f"{self.prefix}/{MANIFEST}":
            return ObjectInfo(key, len(self.manifest.to_bytes()))
        return ObjectInfo(key, self._blob(key).stat().st_size)

    def _offline(self, what: str) -> StorageError:
        return StorageError(f"offline: cannot {what} (only the cache is read)")

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        raise self._offline(f"write {key}")

    def create(self, key: str, data: bytes) -> None:
        raise self._offline(f"write {key}")

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        with self.open_read(key) as f:
            return f.read(), ""

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        raise self._offline(f"write {key}")

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        raise self._offline(f"list {prefix}")

    def walk_files(self, prefix: str) -> dict[str, int]:
        raise self._offline(f"list {prefix}")

    def delete(self, key: str) -> None:
        raise self._offline(f"delete {key}")

    def delete_prefix(self, prefix: str) -> None:
        raise self._offline(f"delete {prefix}")


__all__ = ["OFFLINE_ENV", "CacheStore", "offline_from_env", "recall", "remember"]
