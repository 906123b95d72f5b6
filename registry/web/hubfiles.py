"""Bytes of released files for ``registry serve``'s Hub API, sent only once verified.

A Hugging Face client checks a file's size, never its sha256 (huggingface_hub
0.36 ``http_get``: "Consistency check failed: file should be of size ..."),
so the server must: every byte it sends has been checked against the
release's manifest first.

:class:`StoreSource` (serving straight from the store) cuts the asked range
into the entry's pieces (registry.protocol.pieces; a file without pieces is one piece):
each piece is streamed from the store into a private, unlinked spool file
while its SHA-256 state is checked, and only a piece that verified is sent,
from that private copy (a store writer changing the object afterwards
changes nothing already checked). The next piece is fetched and checked on a
helper thread while the current one is sent. The first piece is checked
before the response starts, so a tampered file whose first piece is wrong is
an HTTP error; a later bad piece ends the response early (the connection is
dropped before its bytes), so the client sees a short read, never a whole,
wrong file.

:class:`registry.web.mirror.MirrorSource` serves from a local cache of
verified blobs instead (``registry serve --mirror-cache``).

Memory: one block of ``CHUNK`` bytes per request; disk: at most two pieces
(128 MiB by default) of spool per request, unlinked from the start.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Protocol

from registry.protocol import pieces as pc
from registry.errors import IntegrityError
from registry.protocol.manifest import FileEntry, Manifest
from registry.store import Store, join
from registry.protocol.verify import piece_error

#: bytes per block sent and read.
CHUNK = 1024 * 1024


class Source(Protocol):
    """Where verified bytes of one release's files come from."""

    def open(self, prefix: str, entry: FileEntry, start: int, end: int, *,
             manifest: Manifest) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of ``entry``, each block verified before it is
        yielded. The first block's verification happens before this returns
        (an IntegrityError here is an HTTP error, not a cut stream).

        Raises:
            IntegrityError: the stored bytes differ from the manifest.
            ObjectNotFoundError, StorageError: the store read failed.
        """
        ...


def spans(entry: FileEntry, start: int, end: int) -> list[tuple[int, int, int]]:
    """``(k, piece_start, piece_end)`` of every piece of ``entry`` that
    ``[start, end)`` touches; a file without pieces (or where piece digests
    cannot be checked here) is the one piece ``[0, size)``."""
    if entry.pieces is None or not pc.AVAILABLE:
        return [(0, 0, entry.size)]
    return [(k, a, b) for k, (a, b) in enumerate(entry.pieces.bounds(entry.size))
            if b > start and a < end]


class _Spooled:
    """One verified piece in a private spool file."""

    def __init__(self, f: IO[bytes], start: int, end: int) -> None:
        self.f, self.start, self.end = f, start, end

    def read(self, a: int, b: int) -> Iterator[bytes]:
        fd = self.f.fileno()
        pos = a
        while pos < b:
            block = os.pread(fd, min(CHUNK, b - pos), pos - self.start)
            if not block:
                raise IntegrityError("<spool>", reason=f"bytes {pos}-{b}: short read")
            yield block
            pos += len(block)

    def close(self) -> None:
        self.f.close()


class StoreSource:
    """Verified bytes straight from ``store`` (see the module docstring).

    Args:
        spool_dir: where private spool files are made (unlinked at once);
            default the system's temp folder.
        on_store_bytes: called with the byte count of each block read from
            the store (for the server's statistics).
    """

    def __init__(self, store: Store, *, spool_dir: str | None = None,
                 on_store_bytes: object = None) -> None:
        self.store = store
        self.spool_dir = spool_dir
        self._count = on_store_bytes if callable(on_store_bytes) else (lambda n: None)

    def _spool(self, key: str, entry: FileEntry, k: int, a: int, b: int) -> _Spooled:
        whole = entry.pieces is None or not pc.AVAILABLE
        last = b == entry.size
        f = tempfile.TemporaryFile(dir=self.spool_dir, prefix="hub-spool-")
        try:
            got = 0
            longer = False
            h = hashlib.sha256()

            def blocks() -> Iterator[bytes]:
                nonlocal got, longer
                for block in self.store.iter_range(key, a, b + last, CHUNK):
                    self._count(len(block))
                    if got + len(block) > b - a:
                        block, longer = block[:b - a - got], True
                    f.write(block)
                    got += len(block)
                    if whole:
                        h.update(block)
                    yield block

            if whole:
                for _ in blocks():
                    pass
                actual = h.hexdigest()
                if longer or got != entry.size:
                    raise IntegrityError(entry.path, expected_size=entry.size,
                                         actual_size=got + longer,
                                         reason=f"size {got}{'+' if longer else ''} bytes, "
                                                f"expected {entry.size}")
                if actual != entry.sha256:
                    raise IntegrityError(entry.path, expected_size=entry.size, actual_size=got,
                                         expected_sha256=entry.sha256, actual_sha256=actual)
            else:
                assert entry.pieces is not None
                bad = pc.check_piece(entry.pieces, entry.sha256, entry.size, k, blocks())
                if longer or got != b - a:
                    raise IntegrityError(entry.path, expected_size=entry.size,
                                         actual_size=a + got + longer,
                                         reason=f"piece {k}: {got}{'+' if longer else ''} "
                                                f"bytes, expected {b - a}")
                if bad is not None:
                    raise piece_error(entry, k, bad)
            f.flush()
            return _Spooled(f, a, b)
        except BaseException:
            f.close()
            raise

    def open(self, prefix: str, entry: FileEntry, start: int, end: int, *,
             manifest: Manifest) -> Iterator[bytes]:
        key = join(prefix, entry.path)
        todo = spans(entry, start, end)
        if not todo or start >= end:
            return iter(())
        first = self._spool(key, entry, *todo[0])
        return self._stream(key, entry, todo, first, start, end)

    def _stream(self, key: str, entry: FileEntry, todo: list[tuple[int, int, int]],
                first: _Spooled, start: int, end: int) -> Iterator[bytes]:
        pool = ThreadPoolExecutor(1, thread_name_prefix="hub-spool")
        current = first
        pending: Future[_Spooled] | None = None
        try:
            for i in range(len(todo)):
                if i + 1 < len(todo):
                    pending = pool.submit(self._spool, key, entry, *todo[i + 1])
                yield from current.read(max(start, current.start), min(end, current.end))
                current.close()
                if pending is None:
                    break
                current, pending = pending.result(), None  # raises: the stream stops here
        finally:
            current.close()
            if pending is not None:
                pending.cancel()
                try:
                    pending.result().close()
                except BaseException:  # noqa: BLE001 - the response is over either way
                    pass
            pool.shutdown(wait=False)
