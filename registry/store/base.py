"""The abstract Store: a few primitives over one fsspec filesystem and a root.

Keys are relative POSIX paths under the store root (``runs/r1/ckpt/LATEST``).
Backends implement the primitives; everything derived (walking, reading a
pointer, copying a local file in) lives here once.

Capabilities, never the URL scheme, decide the commit protocol
(DESIGN section 3):

``atomic_rename``
    a directory can be renamed into place atomically, and a rename onto an
    existing directory fails (local disk).
``conditional_create``
    :meth:`Store.create` writes an object only if none exists, atomically
    (O_EXCL locally, ``If-None-Match: *`` on S3).
``compare_and_swap``
    :meth:`Store.swap` replaces an object only if it still holds what the
    caller read (a lock file locally, ``If-Match`` on the ETag on S3).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Self

from registry.rules import limits
from registry.errors import DocumentError, ObjectNotFoundError, StorageError, UnsafeEntryError
from registry.store.translate import translated

if TYPE_CHECKING:  # ~0.1 s to import: a local store makes its filesystem on use
    import fsspec

#: bytes read per call when streaming a file (large enough to amortize calls,
#: small enough to keep memory flat).
CHUNK = 8 * 1024 * 1024


class ForkSafeFs:
    """The ``fs`` of an object store whose client (sessions, connections, an
    event loop: s3fs, gcsfs, adlfs) cannot cross ``fork()``: a forked child
    (gunicorn ``--preload``, multiprocessing) gets a fresh one from
    :meth:`_new_fs` on first use. Put it before :class:`Store` in the bases."""

    _fs: Any
    _fs_pid: int

    def _new_fs(self) -> Any:
        raise NotImplementedError

    def _forked(self) -> None:
        """What else a forked child starts afresh, after its new ``fs``."""

    @property
    def fs(self) -> Any:
        if self._fs_pid != os.getpid():
            self._fs = self._new_fs()
            self._fs_pid = os.getpid()
            self._forked()
        return self._fs

    @fs.setter
    def fs(self, value: Any) -> None:
        self._fs = value
        self._fs_pid = os.getpid()


class ReadOnly:
    """A store that refuses every write with the error :meth:`_read_only` makes
    (a mirror, an OCI artifact, a source directory). Put it before the store's
    class in the bases."""

    def _read_only(self, key: str) -> StorageError:
        raise NotImplementedError

    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        raise self._read_only(key)

    def create(self, key: str, data: bytes) -> None:
        raise self._read_only(key)

    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        raise self._read_only(key)

    def delete(self, key: str) -> None:
        raise self._read_only(key)

    def delete_prefix(self, prefix: str) -> None:
        raise self._read_only(prefix)


class CommitsOnExit:
    """``with writer:`` for a writer of one object: ``close()`` (the object lands)
    when the block ends normally, ``discard()`` (nothing lands) on an error."""

    def close(self) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What the store knows of one object: its key, size in bytes, and a version
    token (ETag on S3; a digest of the content elsewhere) when cheap to get."""

    key: str
    size: int
    mtime: float | None = None


def join(*parts: str) -> str:
    """Join key segments with ``/``, ignoring empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def content_token(data: bytes) -> str:
    """The version token of a small object whose backend has no ETag."""
    return hashlib.sha256(data).hexdigest()


def key_parts(key: str, *, where: str) -> list[str]:
    """The segments of the store key ``key``: the one key rule of every backend
    (issue 29 item 3). A key names one entry under its root, one way only.

    Raises:
        UnsafeEntryError: an empty, ``.`` or ``..`` segment (so also a leading
            or trailing ``/`` and ``//``), or a NUL; ``where`` (the store URL)
            starts the message.
    """
    if not key:
        return []
    segs = key.split("/")
    if any(s in ("", ".", "..") or "\0" in s for s in segs):
        raise UnsafeEntryError(f"{where}/{key}: not a key under the root (an empty, '.' or "
                               "'..' segment, or a leading '/')", key=key)
    return segs


class Store(ABC):
    """A store rooted at ``url``: local folder, ``s3://bucket/prefix`` or ``memory://``.

    Subclasses set the three capability flags and implement the primitives.

    Notes:
        Instances are safe to share between threads. Nothing here caches
        listings: every call observes the backend as it is now.
    """

    atomic_rename: bool = False
    conditional_create: bool = True
    compare_and_swap: bool = True
    #: how many files a bulk copy into this store writes at once (a tuning
    #: knob, never a capability: it never changes what is committed).
    files_in_flight: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        from registry.obs.tracing import trace_store_methods

        trace_store_methods(cls)  # each store call a span while tracing is on

    def __init__(self, url: str, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/")
        #: what listings skipped (a link or special file on local disk), one
        #: message each, in order, without repeats: commands show them.
        self.skipped: list[str] = []

    def skip(self, message: str) -> None:
        """Note an entry a listing skipped (see :attr:`skipped`)."""
        if message not in self.skipped:
            self.skipped.append(message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def path(self, key: str) -> str:
        """The backend path of ``key`` (:func:`key_parts`: UnsafeEntryError for
        a leading slash, an empty, ``.`` or ``..`` segment)."""
        return "/".join([self.root, *key_parts(key, where=self.url)]) if key else self.root

    def url_of(self, key: str) -> str:
        """A URL a user can paste back into the CLI for ``key``."""
        return f"{self.url.rstrip('/')}/{key}" if key else self.url

    # -- primitives ------------------------------------------------------------

    @abstractmethod
    def open_read(self, key: str) -> IO[bytes]:
        """Open ``key`` for streaming reads. Raises ObjectNotFoundError."""

    @abstractmethod
    def open_write(self, key: str, *, exclusive: bool = False,
                   size: int | None = None) -> IO[bytes]:
        """Open ``key`` for a streaming write that replaces any object there.

        With ``exclusive``, the write is a conditional create: ``close()``
        raises ObjectExistsError if an object appeared at ``key`` meanwhile
        (``If-None-Match: *`` on the PUT or CompleteMultipartUpload on S3).
        On local disk writes go to a staging directory private to its writer,
        so the flag changes nothing there. ``size``: the number of bytes that
        will be written, or an upper bound on it, when known (object stores
        size their parts from it: one size for every part but the last).

        The object is durable once ``close()`` returns (fsync locally, the
        completed PUT on object stores). On an exception inside a ``with`` block
        the partial object is discarded where the backend allows it.
        """

    @abstractmethod
    def create(self, key: str, data: bytes) -> None:
        """Write ``data`` to ``key`` only if no object exists there (atomic).

        Raises:
            ObjectExistsError: an object is already at ``key`` (and it does not
                hold exactly ``data`` after a retried request).
        """

    @abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes, str]:
        """Return ``(content, token)`` for a later :meth:`swap`.

        Raises:
            ObjectNotFoundError: nothing at ``key``.
        """

    @abstractmethod
    def swap(self, key: str, data: bytes, expected: str | None) -> None:
        """Replace ``key`` with ``data`` only if its token is still ``expected``
        (``None``: only if ``key`` does not exist). Atomic against other writers.

        Raises:
            PointerConflictError: the object changed (or appeared) meanwhile.
        """

    @abstractmethod
    def info(self, key: str) -> ObjectInfo:
        """Size and mtime of the object at ``key``. Raises ObjectNotFoundError."""

    @abstractmethod
    def list_dir(self, prefix: str) -> list[tuple[str, bool]]:
        """Immediate children of ``prefix`` as ``(name, is_dir)``, sorted by name.

        An absent prefix lists as empty -- only when the backend said so (S3
        answered the listing; the folder is missing under an existing local
        root). Zero-byte folder markers (``incoming/``) are not listed.

        Raises:
            StorageError: any other failure (permissions, a missing bucket or
                store root, an unreachable endpoint): never an empty answer.
        """

    @abstractmethod
    def walk_files(self, prefix: str) -> dict[str, int]:
        """Every file under ``prefix``: relative path -> size in bytes; folder
        markers are skipped. Raises StorageError as :meth:`list_dir` does."""

    def walk_versions(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        """Like :meth:`walk_files`, with each object's version token as the
        listing gives it (an object store's ETag, quotes stripped; None where
        the store has none): relative path -> (size, token). One listing."""
        return {path: (size, None) for path, size in self.walk_files(prefix).items()}

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; a missing object is not an error."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Delete everything under ``prefix``; an absent prefix is not an error."""

    # -- capability-specific (overridden where supported) -------------------------

    def rename_dir(self, src: str, dst: str) -> None:
        """Atomically rename directory ``src`` to ``dst``; fail if ``dst`` exists.

        Only where ``atomic_rename`` is true. Raises ObjectExistsError.
        """
        raise NotImplementedError(f"{self!r} has no atomic rename")

    def abort_stale_uploads(self, older_than: float, *, dry_run: bool = False,
                            keep: Any = None, doomed: Any = None,
                            warn: Any = None, orphan: Any = None,
                            orphan_after: float = 0.0) -> list[str]:
        """Abort unfinished uploads older than ``older_than`` seconds (object
        stores' multipart uploads); returns their keys. Nothing elsewhere."""
        return []

    def ensure_root(self) -> None:
        """Create the store's root where that is a thing (a local folder), for
        a writer about to list a store it may be the first to use; listing
        a missing root is otherwise a StorageError."""

    def fsync_dir(self, prefix: str) -> None:
        """Make a directory's entries durable (local disk); a no-op elsewhere."""

    def local_path(self, key: str) -> str | None:
        """The local filesystem path of ``key``, or None on a remote store."""
        return None

    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``key``. Raises ObjectNotFoundError."""
        with self.open_read(key) as f:
            f.seek(start)
            return f.read(end - start)

    # -- derived ---------------------------------------------------------------

    def read_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        """The whole content of a small object, at most ``limit`` bytes
        (default :data:`registry.rules.limits.MAX_READ_BYTES`): a store writer
        cannot make a reader hold more than that in memory.

        Raises:
            ObjectNotFoundError: no such object.
            DocumentError: the object is longer than ``limit`` (nothing more is read).
        """
        cap = limits.MAX_READ_BYTES if limit is None else limit
        with self.open_read(key) as f:
            data = limits.read_at_most(f, cap)
        if len(data) > cap:
            raise self._too_long(key, cap)
        return data

    def read_streamed(self, key: str, *, limit: int | None = None) -> bytes:
        """:meth:`read_bytes` by one streamed read (:meth:`iter_read`: one GET
        on an object store), stopped once past ``limit``; raises as it."""
        cap = limits.MAX_READ_BYTES if limit is None else limit
        buf = bytearray()
        with closing(self.iter_read(key)) as blocks:
            for block in blocks:
                buf += block
                if len(buf) > cap:
                    raise self._too_long(key, cap)
        return bytes(buf)

    def _too_long(self, key: str, cap: int) -> DocumentError:
        return DocumentError(self.url_of(key), f"larger than the {cap}-byte limit for "
                                               "a document read whole (registry.rules.limits)")

    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace ``key`` with ``data`` (durable on return).

        Raises:
            InsufficientSpaceError: the disk filled up (ENOSPC, EDQUOT at the
                write, the flush or the fsync); the message names the object's
                URL, and no partial object is left.
            StorageError: any other failure of the backend.
        """
        # Local writes fail at write/flush/fsync time, after open_write
        # returned: translate here, naming the object (the manifest, a claim).
        with translated(self.url_of(key)), self.open_write(key) as f:
            f.write(data)

    def exists(self, key: str) -> bool:
        """Whether an object is at ``key``."""
        try:
            self.info(key)
        except ObjectNotFoundError:
            return False
        return True

    def iter_read(self, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """Stream ``key`` in chunks of at most ``chunk`` bytes."""
        with self.open_read(key) as f:
            while block := f.read(chunk):
                yield block

    def iter_range(self, key: str, start: int, end: int,
                   chunk: int = CHUNK) -> Iterator[bytes]:
        """Stream bytes ``[start, end)`` of ``key`` (fewer if the object is
        shorter) in chunks of at most ``chunk`` bytes: one ranged request on
        an object store. Raises ObjectNotFoundError."""
        with self.open_read(key) as f:
            f.seek(start)
            left = end - start
            while left > 0 and (block := f.read(min(chunk, left))):
                left -= len(block)
                yield block

    def subdirs(self, prefix: str) -> list[str]:
        """Names of the immediate sub-directories of ``prefix``, sorted."""
        return [name for name, is_dir in self.list_dir(prefix) if is_dir]

    def subdirs_confirmed(self, prefix: str) -> list[str]:
        """:meth:`subdirs`, cross-checked where folders are only a listing's
        view (object stores: a delimited listing's CommonPrefixes) against a
        full listing of the same prefix, before anything destructive acts on
        it (``index rebuild``, ``gc``). A server whose delimited listing
        leaves out folders that hold objects (s3rver answers ``Delimiter=/``
        without CommonPrefixes two levels deep) would otherwise make a
        populated store look empty. Checked twice before it is an error (a
        write landing between the two listings is not a disagreement).

        Raises:
            StorageError: the two listings disagree; the message names the
                server and what the delimited listing left out.
        """
        if self.atomic_rename:
            return self.subdirs(prefix)  # a real directory tree: one answer
        for attempt in range(2):
            delimited = self.subdirs(prefix)
            full = {path.split("/", 1)[0] for path in self.walk_files(prefix) if "/" in path}
            missing = sorted(full - set(delimited))
            if not missing:
                return delimited
        where = getattr(self, "where", self.url)
        raise StorageError(
            f"{self.url_of(prefix)}: the server's listings disagree ({where}): a delimited "
            f"listing names {len(delimited)} folder(s), a full listing finds objects under "
            f"{len(full)} (left out: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); "
            "refusing to act on it. The server does not implement ListObjectsV2's "
            "Delimiter correctly (see docs/s3-servers.md)", key=prefix)

    @staticmethod
    def parent(key: str) -> str:
        return posixpath.dirname(key)

    def close(self) -> None:
        """Release connections (nothing to do for most backends)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _trace_base() -> None:
    from registry.obs.tracing import trace_store_methods

    trace_store_methods(Store)


_trace_base()
