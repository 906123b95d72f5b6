"""In-memory store (fsspec ``memory://``) for tests and dry runs.

No atomic directory rename, so it commits like an object store; creates and
swaps are atomic within the process under one lock.
"""

from __future__ import annotations

import threading
from typing import IO

import fsspec

from registry.errors import ObjectExistsError, ObjectNotFoundError, PointerConflictError
from registry.store.base import ObjectInfo, Store, content_token
from registry.store.translate import translated

_LOCK = threading.RLock()


class MemoryStore(Store):
    """A store in fsspec's process-wide memory filesystem."""

    def __init__(self, url: str, root: str) -> None:
        super().__init__(url, fsspec.filesystem("memory"), "/" + root.strip("/"))

    def open_read(self, key: str) -> IO[bytes]:
        with translated(key):
            return self.fs.open(self.path(key), "rb")  # type: ignore[no-any-return]

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        with translated(key):
            return self.fs.open(self.path(key), "xb" if exclusive else "wb")  # type: ignore[no-any-return]

    def create(self, key: str, data: bytes) -> None:
        with _LOCK, translated(key):
            try:
                with self.fs.open(self.path(key), "xb") as f:
                    f.write(data)
            except FileExistsError:
                raise ObjectExistsError(f"{key}: already exists", key=key) from None

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.read_bytes(key)
        return data, content_token(data)

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        with _LOCK:
            try:
                current: str | None = self.read_versioned(key)[1]
            except ObjectNotFoundError:
                current = None
            if current != expected:
                raise PointerConflictError(key, expected=expected, actual=current)
            self.write_bytes(key, data)

    def info(self, key: str) -> ObjectInfo:
        with translated(key):
            i = self.fs.info(self.path(key))
        if i["type"] != "file":
            raise ObjectNotFoundError(f"{key}: not found", key=key)
        created = i.get("created")
        return ObjectInfo(key, int(i["size"]), created.timestamp() if created else None)

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        try:
            entries = self.fs.ls(self.path(prefix), detail=True)
        except FileNotFoundError:
            return []
        base = self.path(prefix).rstrip("/")
        return sorted((e["name"].rstrip("/").rsplit("/", 1)[-1], e["type"] == "directory")
                      for e in entries if e["name"].rstrip("/") != base)

    def walk_files(self, prefix: str) -> dict[str, int]:
        base = self.path(prefix).rstrip("/") + "/"
        found = self.fs.find(base, detail=True)
        return dict(sorted((n[len(base):], int(e["size"])) for n, e in found.items()
                           if n.startswith(base)))

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        try:
            self.fs.rm(self.path(prefix), recursive=True)
        except FileNotFoundError:
            pass
