"""A source directory read as a store: publish's view of a local model directory.

Unlike a :class:`LocalStore` (where no link below the root is followed,
registry.store.confine), a source directory may hold links that stay inside
it -- a Hugging Face cache snapshot is nothing but links into its
repository's ``blobs/`` -- and those are read as the files they name, under
the rule of :mod:`registry.host.sourcedir` (links leaving it refused unless
``follow_symlinks``). Read-only: publish never writes into its source.
"""

from __future__ import annotations

import os
from typing import IO

from registry.errors import StorageError
from registry.protocol.manifest import list_local_files
from registry.host.sourcedir import SourceRule, open_source_file
from registry.store.base import ObjectInfo, ReadOnly
from registry.store.local import LocalStore
from registry.store.translate import translated


class SourceDirStore(ReadOnly, LocalStore):
    """The local directory ``root`` for reading, under ``rule``.

    Raises (from every read): UnsafeEntryError for a link leading out of the
    directory (without ``follow_symlinks``), a FIFO, socket or device;
    ObjectNotFoundError for a missing file or a link to nowhere.
    """

    def __init__(self, url: str, root: str, rule: SourceRule) -> None:
        super().__init__(url, root)
        self.rule = rule

    def _resolved(self, key: str) -> str:
        return self.rule.check(self.path(key))

    def local_path(self, key: str) -> str:
        """The resolved path of ``key`` (no link left on it when checked)."""
        with translated(key):
            return self._resolved(key)

    def open_read(self, key: str) -> IO[bytes]:
        with translated(key):
            fd = open_source_file(self.rule, self.path(key))
            return os.fdopen(fd, "rb")

    def info(self, key: str) -> ObjectInfo:
        with translated(key):
            st = os.stat(self._resolved(key))
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def walk_files(self, prefix: str) -> dict[str, int]:
        base = self.path(prefix)
        with translated(prefix):
            if not os.path.isdir(base):
                return {}
            rule = self.rule  # one boundary: the source directory's
            names = list_local_files(base, rule=rule)
            out = {}
            for rel in names:
                with translated(rel):
                    out[rel] = os.stat(rule.check(os.path.join(base, *rel.split("/")))).st_size
        return out

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        base = self.path(prefix)
        out = []
        with translated(prefix):
            if not os.path.isdir(base):
                return []
            for name in sorted(os.listdir(base)):
                real = self.rule.check(os.path.join(base, name))
                out.append((name, os.path.isdir(real)))
        return out

    def _read_only(self, key: str) -> StorageError:
        return StorageError(f"{self.url_of(key)}: a source directory is only read", key=key)


__all__ = ["SourceDirStore"]
