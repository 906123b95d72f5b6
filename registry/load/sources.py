"""Where the weights reader's bytes come from: a store (local disk or any
object store), or this host's pull cache.

A source answers ``blocks(key, start, end, segments)``: it fills each segment's
memoryview, in order, with the object's bytes ``[start, end)`` and yields each
part as it lands (the caller hashes it before asking for the next). It never
decides whether bytes are good: :class:`registry.load.pieces.PieceReader` does.

- :class:`StoreSource` on a local store opens each file once through the
  store's confined opener; its pieces are read by registry.load.direct (the
  page cache when it holds them, else O_DIRECT into the tensors), or, for a
  piece not block-aligned, with ``preadv`` straight into the segments; on a remote store
  it sends one ranged GET per piece: on S3 through a synchronous client per
  reading thread that receives the body straight into the segments
  (:mod:`registry.store.s3direct`: no event loop, no copy); on other stores
  (a ``registry serve`` mirror, GCS, Azure) it copies each received block
  into place (one copy, no buffering).
- :class:`BlobSource` reads a file from the pull cache's blob of its sha256,
  opened without following links.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from registry.load.direct import Descriptors
from registry.load.pieces import CHUNK, pread_into
from registry.store import Store

Segments = list[tuple[int, int, memoryview]]

class _Mapped:
    """A local source's files, each opened once (registry.load.direct reads
    them): every read of one key goes to the same open file, so a file
    renamed over in the store after a piece verified is not the one later
    pieces come from."""

    def __init__(self) -> None:
        self._files: dict[str, Descriptors] = {}
        self._fd_lock = threading.Lock()

    def _open(self, key: str) -> int:
        raise NotImplementedError

    def descriptors(self, key: str) -> Descriptors:
        """The open file of ``key`` (and its O_DIRECT twin where allowed)."""
        with self._fd_lock:
            got = self._files.get(key)
            if got is None:
                got = self._files[key] = Descriptors(self._open(key))
            return got

    def close(self) -> None:
        """Close the open files."""
        with self._fd_lock:
            files, self._files = self._files, {}
        for d in files.values():
            d.close()


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


__all__ = ["BlobSource", "StoreSource"]
