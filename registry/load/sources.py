"""Where the weights reader's bytes come from: a store (local disk or any
object store), or this host's pull cache.

A source answers ``blocks(key, start, end, segments)``: it fills each segment's
memoryview, in order, with the object's bytes ``[start, end)`` and yields each
part as it lands (the caller hashes it before asking for the next). It never
decides whether bytes are good: :class:`registry.load.pieces.PieceReader` does.

- :class:`StoreSource` on a local store reads with ``preadv`` straight into the
  segments (no copy) through the store's confined opener; on a remote store
  it sends one ranged GET per piece: on S3 through a synchronous client per
  reading thread that receives the body straight into the segments
  (:mod:`registry.store.s3direct`: no event loop, no copy); on other stores
  (a ``registry serve`` mirror, GCS, Azure) it copies each received block
  into place (one copy, no buffering).
- :class:`BlobSource` reads a file from the pull cache's blob of its sha256,
  opened without following links.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from registry.load.pages import can_populate, populate
from registry.load.pieces import CHUNK, pread_into
from registry.store import Store

Segments = list[tuple[int, int, memoryview]]

class _Mapped:
    """A local source's files mapped into memory, each opened once.

    Every mapping of one key comes from the same open file (the first one
    opened): a file renamed over in the store after a piece verified is not
    the one later tensors map. Mappings are private (copy-on-write): what a
    caller writes into a tensor never reaches the file. A private page not yet
    written still shows later in-place writes to the file, so a mapping that is
    handed out is first made the process's own (:func:`populate`) before its
    bytes are hashed (:class:`registry.load.pieces.PieceReader`).
    """

    def __init__(self) -> None:
        self._fds: dict[str, tuple[int, int]] = {}
        self._fd_lock = threading.Lock()

    def _open(self, key: str) -> int:
        raise NotImplementedError

    def _fd(self, key: str) -> tuple[int, int]:
        with self._fd_lock:
            got = self._fds.get(key)
            if got is None:
                fd = self._open(key)
                got = self._fds[key] = (fd, os.fstat(fd).st_size)
            return got

    def map_span(self, key: str, start: int, end: int) -> tuple[mmap.mmap, int, int] | None:
        """A private, writable mapping holding bytes ``[start, end)`` of ``key``:
        ``(mapping, offset of start in it, bytes there)``; None when the file
        has none of them (it is shorter). Its pages still show in-place writes
        to the file until :func:`populate` made them private."""
        fd, size = self._fd(key)
        end = min(end, size)
        if end <= start:
            return None
        base = start - start % mmap.ALLOCATIONGRANULARITY
        m = mmap.mmap(fd, end - base, access=mmap.ACCESS_COPY, offset=base)
        return m, start - base, end - start

    @contextmanager
    def mapped(self, key: str, start: int, end: int) -> Iterator[memoryview]:
        """Bytes ``[start, end)`` of ``key`` (fewer when the file is shorter)
        as a memoryview of a mapping, unmapped on exit; read ahead."""
        got = self.map_span(key, start, end)
        if got is None:
            yield memoryview(b"")
            return
        m, off, n = got
        view = memoryview(m)
        try:
            if hasattr(mmap, "MADV_WILLNEED"):
                m.madvise(mmap.MADV_WILLNEED)
            yield view[off:off + n]
        finally:
            view.release()
            try:
                m.close()
            except BufferError:
                pass  # a block still referenced (an error mid-piece): unmapped when freed

    def close(self) -> None:
        """Close the open files (mappings handed out stay valid)."""
        with self._fd_lock:
            fds, self._fds = self._fds, {}
        for fd, _ in fds.values():
            os.close(fd)


class StoreSource(_Mapped):
    """Bytes of objects in ``store``."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.local = store.local_path("") is not None
        self.can_map = self.local
        self.direct = None
        if not self.local and type(store).__name__ == "S3Store":
            from registry.store.s3direct import DirectReader

            self.direct = DirectReader(store)

    def blocks(self, key: str, start: int, end: int, segments: Segments) -> Iterator[memoryview]:
        if self.local:
            with self.store.open_read(key) as f:
                yield from _pread_segments(f.fileno(), segments)
            return
        if self.direct is not None:
            yield from self.direct.read_into(key, start, segments)
            return
        yield from _fill(self.store.iter_range(key, start, end, chunk=CHUNK), segments)


    def _open(self, key: str) -> int:
        with self.store.open_read(key) as f:  # the store's confined opener
            return os.dup(f.fileno())


class BlobSource(_Mapped):
    """Bytes of the pull cache's blob ``path`` (whatever key is asked)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.can_map = True

    def _open(self, key: str) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))

    def blocks(self, key: str, start: int, end: int, segments: Segments) -> Iterator[memoryview]:
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            yield from _pread_segments(fd, segments)
        finally:
            os.close(fd)


def _pread_segments(fd: int, segments: Segments) -> Iterator[memoryview]:
    for s, _e, view in segments:
        n = pread_into(fd, view, s)
        if n:
            yield view[:n]
        if n < len(view):
            return


def _fill(stream: Iterator[bytes], segments: Segments) -> Iterator[memoryview]:
    """Copy a byte stream into ``segments`` in order, yielding each filled part."""
    i, filled = 0, 0
    for block in stream:
        mv = memoryview(block)
        while len(mv) and i < len(segments):
            view = segments[i][2]
            take = min(len(mv), len(view) - filled)
            view[filled:filled + take] = mv[:take]
            yield view[filled:filled + take]
            filled += take
            mv = mv[take:]
            if filled == len(view):
                i, filled = i + 1, 0
        if i >= len(segments):
            return


__all__ = ["BlobSource", "StoreSource", "can_populate", "populate"]
