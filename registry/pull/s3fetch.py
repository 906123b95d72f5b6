"""A pull's S3 downloads through direct ranged GETs (issue 43, item 9).

The S3 store's own reads (:class:`registry.store.s3.S3Store`, s3fs) pass every
body byte through one asyncio event-loop thread, in blocks of 64-256 KiB that
are joined into new ``bytes`` and copied again into the file; a piece was then
read back from the page cache to be hashed. Here a file is fetched as the
weights reader fetches it (:class:`registry.store.s3direct.DirectReader`: a
synchronous botocore client, the body received with ``readinto`` straight into
a reused buffer, the GIL released while the socket is read):

* a file with piece states (registry.protocol.pieces): each piece is one
  ranged GET on the pull's range threads (all of a pull's pieces share them:
  ``RANGE_FACTOR * workers`` requests in flight), received in ``SEGMENT``-byte
  segments into the thread's two scratch halves; each segment is written at its offset
  (``os.pwrite``) into the caller's temp file, then hashed from the same
  memory (OpenSSL through ctypes: off the GIL) while the next one arrives.
  One kernel-to-user copy, one user-to-kernel copy, one hash pass, no read-back.
* a file without pieces (at most one piece): one ranged GET, hashed in file
  order on the file's thread as it lands.

The temp file is the caller's (registry.pull.download.fetch: a cache temp or
a staging path, never a final name); it is renamed into place only after every
piece verified. Each piece's GET is retried from its start (its hash restarts)
on a failure that is not an answer (not found, forbidden), up to the store's
``retry_attempts``, with its backoff (registry.store.s3retry). The last piece
asks for one byte past the manifest's size: an object that is longer than the
manifest says fails the size check. Nothing here fsyncs: the caller does, once
per file; each segment's writeback is started as it lands
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, registry.store.durable), so that
fsync finds little left and the disk writes while the network reads.

``REGISTRY_PULL_S3_DIRECT=0`` turns this off (the s3fs stream of
registry.pull.download); any other value, or none, keeps it on.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from registry.errors import (IntegrityError, ObjectNotFoundError, StorageError,
                             StoragePermissionError, UnsafeEntryError)
from registry.protocol import pieces as pc
from registry.protocol.manifest import FileEntry
from registry.protocol.verify import piece_error
from registry.pull import resume
from registry.store import Store
from registry.store.durable import start_writeback

ENV = "REGISTRY_PULL_S3_DIRECT"
#: bytes received per segment (two per range thread: one received while the
#: other is written and hashed).
SEGMENT = 4 * 1024 * 1024
#: range threads per pull worker (registry.pull._fetch_all): pieces in flight.
RANGE_FACTOR = 2
#: a file without pieces larger than this takes the s3fs stream (it can split
#: into parallel ranges there; here it would be one GET hashed in order).
WHOLE_MAX = 256 * 1024 * 1024

_readers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_readers_lock = threading.Lock()
_local = threading.local()


def reader_for(store: Store) -> Any | None:
    """The store's direct reader (one per store: a client costs ~0.3 s), or
    None when ``store`` is not an S3 store or :data:`ENV` is ``0``."""
    if type(store).__name__ != "S3Store" or os.environ.get(ENV, "").strip() == "0":
        return None
    from registry.store.s3direct import DirectReader

    with _readers_lock:
        reader = _readers.get(store)
        if reader is None:
            reader = _readers[store] = DirectReader(store)
        return reader


def usable(entry: FileEntry) -> bool:
    """Whether :func:`download` takes ``entry`` (else the s3fs stream does)."""
    if entry.pieces is not None and pc.AVAILABLE:
        return True
    return entry.size <= WHOLE_MAX


def _scratch() -> memoryview:
    buf = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(2 * SEGMENT + 1))
    return buf


def _segments(start: int, end: int, extra: bool) -> list[tuple[int, int, memoryview]]:
    """``[start, end)`` in ``SEGMENT`` parts over the scratch halves in turn;
    ``extra``: one more byte past ``end`` (its own slot of the scratch)."""
    buf = _scratch()
    out = []
    for i, s in enumerate(range(start, end, SEGMENT)):
        e = min(end, s + SEGMENT)
        half = (i % 2) * SEGMENT
        out.append((s, e, buf[half:half + e - s]))
    if extra:
        out.append((end, end + 1, buf[2 * SEGMENT:]))
    return out


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


class _Span:
    """One ranged GET of ``[start, end)`` written at its offsets into ``fd``."""

    def __init__(self, reader: Any, key: str, fd: int, start: int, end: int, last: bool,
                 progress: Callable[[int], None], writeback: bool) -> None:
        self.reader, self.key, self.fd = reader, key, fd
        self.start, self.end, self.last, self.progress = start, end, last, progress
        self.got = 0
        self.longer = False
        #: start each segment's writeback as it lands (the caller fsyncs)
        self.writeback = writeback

    def blocks(self) -> Iterator[memoryview]:
        """Each landed segment, after it was written (valid until the next)."""
        self.got, self.longer = 0, False
        pos = self.start
        for view in self.reader.read_into(self.key, self.start,
                                          _segments(self.start, self.end, self.last)):
            if pos >= self.end:  # the byte past the manifest's size: the object is longer
                self.longer = True
                break
            _pwrite_all(self.fd, view, pos)
            if self.writeback:
                start_writeback(self.fd, pos, len(view))
            pos += len(view)
            self.got = pos - self.start
            self.progress(len(view))
            yield view


def _retried(store: Store, what: Callable[[], Any]) -> Any:
    policy = getattr(store, "retry", None)
    attempts = getattr(policy, "attempts", 5)
    for n in range(1, attempts + 1):
        try:
            return what()
        except (ObjectNotFoundError, StoragePermissionError, UnsafeEntryError):
            raise
        except StorageError as exc:
            # a refused, throttled or failed request, or a body cut short: the
            # span is fetched again from its start (its hash restarts)
            if n >= attempts:
                try:
                    exc.registry_attempts = n  # type: ignore[attr-defined]
                except AttributeError:
                    pass
                raise
            time.sleep(policy.backoff(n) if policy is not None else 0.2 * n)
    raise AssertionError("unreachable")  # pragma: no cover


def download(reader: Any, store: Store, key: str, entry: FileEntry, fd: int, *,
             pool: ThreadPoolExecutor, progress: Callable[[int], None],
             log: resume.PieceLog | None = None, writeback: bool = True,
             ) -> tuple[int, IntegrityError | None, str]:
    """Fetch ``key`` into ``fd`` (an empty temp file), checking every byte.

    Args:
        writeback: start each segment's writeback as it lands (the caller
            fsyncs the file: the fsync then finds little left to write, and
            the disk writes while the network reads).

    Returns:
        ``(got, bad, actual)``: the bytes received (``entry.size + 1`` when the
        object is longer), the lowest bad piece's error (None when every
        piece verified, or for a file without pieces), and the file's sha256
        as received (``entry.sha256`` for a file with pieces that verified).

    Raises:
        StorageError: a span failed on every try (ObjectNotFoundError,
            StoragePermissionError at once).
    """
    size = entry.size
    if entry.pieces is None or not pc.AVAILABLE:
        span = _Span(reader, key, fd, 0, size, True, progress, writeback)

        def whole() -> str:
            h = hashlib.sha256()
            for view in span.blocks():
                h.update(view)
            return h.hexdigest()

        actual = _retried(store, whole)
        return span.got + span.longer, None, actual
    pieces = entry.pieces
    bounds = pieces.bounds(size)
    spans = [_Span(reader, key, fd, a, b, k == len(bounds) - 1, progress, writeback)
             for k, (a, b) in enumerate(bounds)]

    def piece(k: int) -> str | None:
        def once() -> str | None:
            return pc.check_piece(pieces, entry.sha256, size, k, spans[k].blocks())

        bad = _retried(store, once)
        if bad is None and log is not None and spans[k].got == bounds[k][1] - bounds[k][0]:
            log.add(k)  # verified and written: a resumed pull may keep it
        return bad

    futures = [pool.submit(piece, k) for k in range(len(bounds))]
    try:
        results = [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()  # wait: nothing writes to fd after this returns
    got = 0
    for (a, b), span in zip(bounds, spans, strict=True):
        got += span.got
        if span.got < b - a:
            break  # the object is shorter: the size check fails
    got += spans[-1].longer
    if got != size:
        return got, None, entry.sha256
    for k, actual in enumerate(results):
        if actual is not None:
            return got, piece_error(entry, k, actual), entry.sha256
    return got, None, entry.sha256


__all__ = ["ENV", "RANGE_FACTOR", "SEGMENT", "WHOLE_MAX", "download", "reader_for", "usable"]
