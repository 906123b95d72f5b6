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
from collections.abc import Iterator
from typing import IO, Any

from registry.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    StorageError,
)
from registry.store import confine
from registry.store.base import ObjectInfo, Store, content_token, key_parts
from registry.store.durable import (
    DIRECT_AFTER,
    DIRECT_BUFFER,
    _DurableFile,
    fsync_path,
    rename_noreplace,
)
from registry.store.translate import translated
from registry.store.writepath import write_path
#: what other modules import from here (the durable file helpers are
#: registry.store.durable's; tests patch fsync_path and _DurableFile here).
__all__ = ["DIRECT_AFTER", "DIRECT_BUFFER", "LocalStore", "_DurableFile", "fsync_path",
           "rename_noreplace"]


def _fsync_dir(path: str) -> None:
    """Fsync the folder ``path`` through :func:`fsync_path` (looked up here at
    each call: the fsync-before-manifest tests spy on this module's name)."""
    fsync_path(path)


@contextlib.contextmanager
def _named(root: str, key: str) -> Iterator[None]:
    """OSErrors of descriptor-relative calls carry the entry's name only: give
    them the full path under ``root``, so that every message names the file
    (``<store>/models/m/1/MANIFEST.json: read-only file system ...``)."""
    try:
        yield
    except OSError as e:
        if not isinstance(e.filename, str) or not os.path.isabs(e.filename):
            e.filename = os.path.join(root, *key.split("/")) if key else root
        raise


def _remove_dead_temps(folder_fd: int, name: str) -> None:
    """Remove ``<name>.tmp-*`` in the folder ``folder_fd`` left by a pointer swap
    killed between writing its temp file and renaming it (call with the
    pointer's lock held)."""
    stem = name + ".tmp-"
    with os.scandir(folder_fd) as entries:
        dead = [e.name for e in entries if e.name.startswith(stem)
                and e.is_file(follow_symlinks=False)]
    for n in dead:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(n, dir_fd=folder_fd)


class LocalStore(Store):
    """A store in a local folder. Writes are fsynced; ``rename_dir`` is atomic.

    Every key is resolved under the root by registry.store.confine: no
    symbolic link below the root is followed and no special file is opened,
    by any reader, writer or deleter (UnsafeEntryError); listings skip them
    with a warning.
    """

    atomic_rename = True
    #: one file per core, up to 4: each file's sha256 runs on one core, and
    #: direct writes leave the cores to hashing (32 MiB of buffers per file).
    files_in_flight = max(1, min(4, os.cpu_count() or 1))

    def __init__(self, url: str, root: str) -> None:
        super().__init__(url, None, os.path.abspath(root))  # type: ignore[arg-type]

    @property
    def fs(self) -> Any:
        """fsspec's local filesystem, made on first use: the primitives here use
        ``os`` directly, and importing fsspec costs a command ~0.1 s."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("file")
        return self._fs

    @fs.setter
    def fs(self, value: Any) -> None:
        self._fs = value

    def path(self, key: str) -> str:
        return os.path.join(self.root, *key_parts(key, where=self.url)) if key else self.root

    def local_path(self, key: str) -> str:
        """The path of ``key``, checked: no link or special file on the way
        (UnsafeEntryError). Prefer the store's own primitives, which hold the
        check for the whole operation."""
        with translated(key), _named(self.root, key):
            return confine.checked_path(self.root, key, where=self.url)

    def open_read(self, key: str) -> IO[bytes]:
        try:
            with translated(key), _named(self.root, key):
                return open(self.path(key), "rb",
                            opener=confine.opener(self.root, key, where=self.url))
        except ObjectNotFoundError:
            self._require_root()
            raise

    def _writer(self, key: str, mode: str, **kw: object) -> _DurableFile:
        return _DurableFile(self.path(key), mode,
                            opener=confine.opener(self.root, key, where=self.url,
                                                  create_parents=True, fsync_dir=_fsync_dir),
                            unlink=lambda: confine.unlink(self.root, key, where=self.url),
                            **kw)  # type: ignore[arg-type]

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        with translated(key), _named(self.root, key):
            return self._writer(key, "wb",  # type: ignore[return-value]
                                write_path=lambda: write_path(self.root))

    def _parent_fd(self, key: str, *, create: bool = True) -> tuple[int, str]:
        segs = confine.parts(key, where=self.url)
        return confine.open_dir(self.root, segs[:-1], where=self.url, create=create,
                                fsync_dir=_fsync_dir), segs[-1]

    def create(self, key: str, data: bytes) -> None:
        # O_EXCL is the atomic check-and-create; fsspec's local
        # pipe_file(mode="create") checks then writes, which races.
        with translated(key), _named(self.root, key):
            try:
                f = self._writer(key, "xb")
            except FileExistsError:
                raise ObjectExistsError(f"{key}: already exists", key=key) from None
            with f:
                f.write(data)
            fsync_path(os.path.dirname(self.path(key)))  # its parent, opened just above

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
        with translated(key), _named(self.root, key):
            fd, name = self._parent_fd(key)
            try:
                from registry.store.leaselock import LeaseLock  # writes only: uuid, socket

                with LeaseLock(path + ".lock"):  # in the folder just checked
                    _remove_dead_temps(fd, name)
                    try:
                        current: str | None = content_token(self.read_bytes(key))
                    except ObjectNotFoundError:
                        current = None
                    if current != expected:
                        raise PointerConflictError(key, expected=expected, actual=current)
                    import uuid

                    tmp_key = f"{key}.tmp-{uuid.uuid4().hex[:12]}"
                    tmp = tmp_key.rsplit("/", 1)[-1]
                    try:
                        with self._writer(tmp_key, "wb") as f:
                            f.write(data)
                        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                    except BaseException:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(tmp, dir_fd=fd)
                        raise
                    fsync_path(os.path.dirname(path))  # the folder of fd
            finally:
                os.close(fd)

    def info(self, key: str) -> ObjectInfo:
        try:
            with translated(key), _named(self.root, key):
                st = confine.entry_stat(self.root, key, where=self.url)
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
        with translated(""), _named(self.root, ""):
            confine.make_root(self.root, fsync_dir=_fsync_dir)

    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        try:
            with translated(prefix), _named(self.root, prefix):
                entries = [(n, d) for n, d, _ in confine.scan(self.root, prefix, where=self.url,
                                                               skipped=self.skip)]
        except ObjectNotFoundError:
            self._require_root()
            return []
        return sorted(entries)

    def walk_files(self, prefix: str) -> dict[str, int]:
        try:
            with translated(prefix), _named(self.root, prefix):
                found = confine.walk(self.root, prefix, where=self.url, skipped=self.skip)
        except ObjectNotFoundError:
            self._require_root()
            return {}
        return {k: st.st_size for k, st in sorted(found.items())}

    def delete(self, key: str) -> None:
        with translated(key), _named(self.root, key):
            confine.unlink(self.root, key, where=self.url)

    def delete_prefix(self, prefix: str) -> None:
        with translated(prefix), _named(self.root, prefix):
            confine.remove_tree(self.root, prefix, where=self.url)

    def rename_dir(self, src: str, dst: str) -> None:
        with translated(dst), _named(self.root, dst):
            sfd, sname = self._parent_fd(src, create=False)
            try:
                dfd, dname = self._parent_fd(dst)
                try:
                    confine.entry_stat(self.root, src, where=self.url)
                    rename_noreplace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                except OSError as e:
                    if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        raise ObjectExistsError(f"{dst}: already exists", key=dst) from None
                    raise
                finally:
                    os.close(dfd)
            finally:
                os.close(sfd)

    def fsync_dir(self, prefix: str) -> None:
        with translated(prefix), _named(self.root, prefix):
            # checked (no link on the way, a directory), then synced by path
            fd = confine.open_dir(self.root, confine.parts(prefix, where=self.url),
                                  where=self.url)
            os.close(fd)
            fsync_path(self.path(prefix))
