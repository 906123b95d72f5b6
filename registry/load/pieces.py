"""Verified reads of one file's pieces into caller-owned memory (DESIGN section 9).

A file of a manifest is read piece by piece (its piece states, registry.protocol.pieces;
a file without them is one piece checked against its sha256). Each piece is
read once, in order, into the *targets* that ask for its bytes (the memory of
tensors being built, a header buffer) and, where no target asks, into one
small scratch buffer of the reading thread; the bytes are hashed as they land
and the piece is accepted only when its SHA-256 state (or, for the last piece,
the file's sha256) matches the manifest. Until then the caller must not expose
any target memory: :class:`PieceReader` only returns once the piece verified,
and raises otherwise, so nothing unverified ever leaves it.

Nothing is staged on disk. Memory used here: one ``2 * CHUNK``-byte scratch
buffer per reading thread (touched only where no target asks for bytes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from registry.protocol import pieces as pc
from registry.errors import (
    IntegrityError,
    ObjectNotFoundError,
    PieceMismatchError,
    StorageError,
    StoragePermissionError,
    UnsafeEntryError,
)
from registry.protocol.manifest import FileEntry
from registry.load.direct import chunks, usable

#: bytes hashed and copied per step; also the scratch buffer's size.
CHUNK = 4 * 1024 * 1024
#: reads of one piece before its StorageError is raised
ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Target:
    """Bytes ``[start, end)`` of a file (absolute offsets) wanted in ``view``
    (a writable uint8 memoryview of exactly ``end - start`` bytes).

    ``whole``: None, or the page-aligned memory ``view`` lies in, whose first
    byte stands for the file's byte ``base`` (registry.load.direct.aligned):
    a local read lands whole pages of the file there directly."""

    start: int
    end: int
    view: memoryview
    whole: memoryview | None = None
    base: int = 0


def geometry(entry: FileEntry) -> pc.Pieces:
    """The entry's pieces, or one piece covering the whole file when it has none."""
    if entry.pieces is not None:
        return entry.pieces
    return pc.Pieces(max(64, -(-entry.size // 64) * 64), ())


def covering(entry: FileEntry, start: int, end: int) -> range:
    """Indices of the pieces holding bytes ``[start, end)`` (none for an empty span)."""
    if end <= start:
        return range(0)
    size = geometry(entry).size
    return range(start // size, (end - 1) // size + 1)


def piece_bounds(entry: FileEntry, k: int) -> tuple[int, int]:
    size = geometry(entry).size
    return k * size, min(entry.size, (k + 1) * size)


def _segments(start: int, end: int,
              targets: list[Target]) -> Iterator[tuple[int, int, memoryview | None, Target | None]]:
    """``(s, e, view, target)`` covering ``[start, end)`` in order: a view into
    a target where one asks for the bytes, else None (scratch), at most CHUNK
    long."""
    pos = start
    for t in targets:
        if t.end <= pos or t.start >= end:
            continue
        if t.start > pos:
            gap_end = min(t.start, end)
            while pos < gap_end:
                n = min(CHUNK, gap_end - pos)
                yield pos, pos + n, None, None
                pos += n
        s, e = max(pos, t.start), min(end, t.end)
        while s < e:
            n = min(CHUNK, e - s)
            yield s, s + n, t.view[s - t.start:s - t.start + n], t
            s += n
        pos = e
    while pos < end:
        n = min(CHUNK, end - pos)
        yield pos, pos + n, None, None
        pos += n


class PieceReader:
    """Reads and verifies pieces of files from one byte source.

    Args:
        source: where bytes come from (:mod:`registry.load.sources`).
    """

    def __init__(self, source: object, *, mapped: bool = False) -> None:
        self.source = source
        #: a local file, read with registry.load.direct: see :meth:`read`
        self.mapped = mapped and bool(getattr(source, "can_map", False))
        self._local = threading.local()
        self.bytes_read = 0
        self._lock = threading.Lock()

    def _scratch(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(2 * CHUNK))
        return buf

    def read(self, key: str, entry: FileEntry, k: int, targets: list[Target]) -> None:
        """Read piece ``k`` of ``entry`` (stored at ``key``) into ``targets``
        (sorted by start, non-overlapping) and verify it. A :attr:`mapped`
        reader reads a block-aligned piece with registry.load.direct (the
        page cache, else O_DIRECT into the targets' pages).

        Raises:
            PieceMismatchError: the piece's bytes do not hash to the manifest's
                state (names the file, the piece and the expected digest).
            IntegrityError: the object ended before the manifest's size.
            StorageError: the source failed ATTEMPTS times (a piece whose read
                fails midway is read again from its start).
        """
        for attempt in range(1, ATTEMPTS + 1):
            try:
                start, end = piece_bounds(entry, k)
                if self.mapped and usable(start, end, entry.size):
                    return self._read_direct(key, entry, k, targets)
                return self._read_once(key, entry, k, targets)
            except (ObjectNotFoundError, StoragePermissionError, UnsafeEntryError):
                raise
            except StorageError:
                # a connection lost mid-piece: read the piece again from its
                # start (its hash restarts; nothing of it was handed out)
                if attempt == ATTEMPTS:
                    raise
                time.sleep(0.2 * attempt)

    def _read_once(self, key: str, entry: FileEntry, k: int, targets: list[Target]) -> None:
        start, end = piece_bounds(entry, k)
        segs = list(_segments(start, end, targets))
        # bytes no target asks for land in the thread's scratch, its two
        # halves in turn: a source may receive one segment ahead of the hash
        scratch = self._scratch()
        gaps = 0
        filled = []
        for s, e, v, _t in segs:
            if v is None:
                half = (gaps % 2) * CHUNK
                v, gaps = scratch[half:half + e - s], gaps + 1
            filled.append((s, e, v))
        blocks = self.source.blocks(key, start, end, filled)  # type: ignore[attr-defined]
        counted = _Counted(blocks)
        actual = pc.check_piece(geometry(entry), entry.sha256, entry.size, k, counted)
        self._judge(entry, k, start, end, counted.n, actual)

    def _read_direct(self, key: str, entry: FileEntry, k: int, targets: list[Target]) -> None:
        start, end = piece_bounds(entry, k)
        d = self.source.descriptors(key)  # type: ignore[attr-defined]
        counted = _Counted(chunks(d, start, end, entry.size, targets))
        try:
            actual = pc.check_piece(geometry(entry), entry.sha256, entry.size, k, counted)
        except OSError as e:
            if isinstance(e, StorageError):
                raise
            raise StorageError(f"{entry.path}: reading piece {k} failed: "
                               f"{e.strerror or e}", key=key) from None
        self._judge(entry, k, start, end, counted.n, actual)

    def _judge(self, entry: FileEntry, k: int, start: int, end: int, n: int,
               actual: str | None) -> None:
        """Raise unless piece ``k`` was ``end - start`` bytes hashing right."""
        with self._lock:
            self.bytes_read += n
        if n != end - start:
            raise IntegrityError(entry.path, expected_size=entry.size,
                                 actual_size=start + n,
                                 reason=f"the object ended at byte {start + n} "
                                        f"inside piece {k} (the manifest says "
                                        f"{entry.size} bytes): truncated")
        if actual is not None:
            geo = geometry(entry)
            raise PieceMismatchError(entry.path, size=entry.size, piece=k, start=start, end=end,
                                     expected_state=pc.expected_state(geo, entry.sha256, k),
                                     actual_state=actual, last=k == geo.count() - 1)


class _Counted:
    def __init__(self, blocks: Iterator[memoryview]) -> None:
        self.blocks, self.n = blocks, 0

    def __iter__(self) -> Iterator[memoryview]:
        for b in self.blocks:
            self.n += len(b)
            yield b


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``fd`` at ``offset``; returns bytes read (fewer at EOF)."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return got


__all__ = ["CHUNK", "PieceReader", "Target", "covering", "geometry", "piece_bounds",
           "pread_into"]
