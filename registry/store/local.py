"""Local-disk store: atomic rename, O_EXCL creates, lock-file compare-and-swap.

Layout on disk is the store layout itself; nothing is hidden except the
``*.lock`` files that serialize pointer updates beside each pointer (present
only while an update runs) and their ``*.tmp-<random>`` temp files. Files are
written through :mod:`registry.store.durable`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import uuid
from typing import IO

import fsspec

from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    StorageError,
)
from registry.store.base import ObjectInfo, Store, content_token, key_parts
from registry.store.durable import (
    DIRECT_AFTER,
    DIRECT_BUFFER,
    _DurableFile,
    fsync_path,
    rename_noreplace,
)
from registry.store.leaselock import LeaseLock
from registry.store.translate import translated
from registry.store.writepath import write_path
#: what other modules import from here (the durable file helpers are
#: registry.store.durable's; tests patch fsync_path and _DurableFile here).
__all__ = ["DIRECT_AFTER", "DIRECT_BUFFER", "LocalStore", "_DurableFile", "fsync_path",
           "rename_noreplace"]


def _rmtree(path: str) -> None:
    """``shutil.rmtree`` for which an entry that vanished meanwhile (another
    process deleting the same tree) is not an error; any other error is."""
    def vanished_ok(_func: object, _path: str, exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=vanished_ok)
    else:
        shutil.rmtree(path, onerror=lambda f, p, info: vanished_ok(f, p, info[1]))


def _remove_dead_temps(path: str) -> None:
    """Remove ``<path>.tmp-*`` left by a pointer swap killed between writing its
    temp file and renaming it (call with the pointer's lock held)."""
    folder, name = os.path.split(path)
    stem = name + ".tmp-"
    with os.scandir(folder) as entries:
        dead = [e.path for e in entries if e.name.startswith(stem) and e.is_file()]
    for p in dead:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


class LocalStore(Store):
    """A store in a local folder. Writes are fsynced; ``rename_dir`` is atomic."""

    atomic_rename = True
    #: one file per core, up to 4: each file's sha256 runs on one core, and
    #: direct writes leave the cores to hashing (32 MiB of buffers per file).
    files_in_flight = max(1, min(4, os.cpu_count() or 1))

    def __init__(self, url: str, root: str) -> None:
        super().__init__(url, fsspec.filesystem("file"), os.path.abspath(root))

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key_parts(key, where=self.url)) if key else self.root

    def local_path(self, key: str) -> str:
        return self.path(key)

    def open_read(self, key: str) -> IO[bytes]:
        try:
            with translated(key):
                return open(self.path(key), "rb")
        except ObjectNotFoundError:
            self._require_root()
            raise

    def _make_parents(self, path: str) -> None:
        """Create the missing folders above ``path``, fsyncing the parent of
        each one created, so that its entry survives a power loss (the files
        inside are made durable by their own fsync and the commit's
        :meth:`fsync_dir` of every folder, issue 13 item 6)."""
        missing = []
        folder = os.path.dirname(path)
        while not os.path.isdir(folder):
            missing.append(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                continue  # another writer made it (and fsyncs its parent)
            fsync_path(os.path.dirname(folder))

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        path = self.path(key)
        with translated(key):
            self._make_parents(path)
            return _DurableFile(path, "wb",  # type: ignore[return-value]
                                write_path=lambda: write_path(self.root))

    def create(self, key: str, data: bytes) -> None:
        # O_EXCL is the atomic check-and-create; fsspec's local
        # pipe_file(mode="create") checks then writes, which races.
        path = self.path(key)
        with translated(key):
            self._make_parents(path)
            try:
                f = _DurableFile(path, "xb")
            except FileExistsError:
                raise ObjectExistsError(f"{key}: already exists", key=key) from None
            with f:
                f.write(data)
        fsync_path(os.path.dirname(path))

    def read_versioned(self, key: str) -> tuple[bytes, str]:
        data = self.read_bytes(key)
        return data, content_token(data)

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        """Compare-and-swap under a :class:`LeaseLock` (``<name>.lock``,
        exclusive creation: correct where ``flock`` locks nothing), then the
        seed's step 4 with a temp name of its own (``<name>.tmp-<random>``):
        write, fsync, rename over ``<name>``, fsync the folder. Temp files of
        swaps killed between their write and their rename are removed first:
        under the lock no other swap of ``<name>`` is between the two."""
        path = self.path(key)
        with translated(key):
            self._make_parents(path)
            with LeaseLock(path + ".lock"):
                _remove_dead_temps(path)
                try:
                    current: str | None = content_token(self.read_bytes(key))
                except ObjectNotFoundError:
                    current = None
                if current != expected:
                    raise PointerConflictError(key, expected=expected, actual=current)
                tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
                try:
                    with _DurableFile(tmp, "wb") as f:
                        f.write(data)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                    raise
                fsync_path(os.path.dirname(path))

    def info(self, key: str) -> ObjectInfo:
        try:
            with translated(key):
                st = os.stat(self.path(key))
        except ObjectNotFoundError:
            self._require_root()
            raise
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def _require_root(self) -> None:
        """A read or a listing in a store folder that does not exist is an
        error, never "not found" or an empty answer (a mistyped ``--store``);
        writers call :meth:`ensure_root` first."""
        if not os.path.isdir(self.root):
            raise StorageError(f"{self.url}: the store does not exist (no folder {self.root}); "
                               "check the store path", key="")

    def ensure_root(self) -> None:
        with translated(""):
            self._make_parents(os.path.join(self.root, "x"))

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        try:
            with translated(prefix):
                entries = list(os.scandir(self.path(prefix)))
        except ObjectNotFoundError:
            self._require_root()
            return []
        return sorted((e.name, e.is_dir()) for e in entries)

    def walk_files(self, prefix: str) -> dict[str, int]:
        base = self.path(prefix)
        if not os.path.isdir(base):
            self._require_root()
        out: dict[str, int] = {}

        def fail(err: OSError) -> None:  # os.walk swallows errors unless told
            if not isinstance(err, (FileNotFoundError, NotADirectoryError)) or \
                    err.filename != base:
                raise err

        with translated(prefix):
            for dirpath, _dirs, files in os.walk(base, onerror=fail):
                rel = os.path.relpath(dirpath, base)
                for name in files:
                    relpath = name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}"
                    with translated(relpath):
                        out[relpath] = os.stat(os.path.join(dirpath, name)).st_size
        return dict(sorted(out.items()))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass

    def delete_prefix(self, prefix: str) -> None:
        path = self.path(prefix)
        if os.path.isdir(path):
            with translated(prefix):
                _rmtree(path)
        else:
            self.delete(prefix)

    def rename_dir(self, src: str, dst: str) -> None:
        with translated(dst):
            try:
                rename_noreplace(self.path(src), self.path(dst))
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise ObjectExistsError(f"{dst}: already exists", key=dst) from None
                raise

    def fsync_dir(self, prefix: str) -> None:
        with translated(prefix):
            fsync_path(self.path(prefix))
