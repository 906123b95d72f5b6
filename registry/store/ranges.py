"""Ranged reads shared by the object stores: whether an answer is the range asked
for, and a file object that reads an object by checked ranged GETs through its
store's ``read_range`` (S3, GCS and Azure; split from :mod:`registry.store.s3`)."""

from __future__ import annotations

import io
from typing import Any

from registry.store.base import Store


def range_answer_ok(status: int | None, content_range: str, start: int, end: int) -> bool:
    """Whether an answer to a GET of bytes ``[start, end)`` is that range:
    206 with ``Content-Range: bytes start-last/total``, ``last`` being
    ``end - 1`` or the object's last byte (also the GCS store's check)."""
    if status != 206 or not content_range.startswith("bytes "):
        return False
    span, _, total = content_range[6:].partition("/")
    first, _, last = span.partition("-")
    try:
        size = int(total) if total != "*" else end
        return int(first) == start and int(last) == min(end, size) - 1
    except ValueError:
        return False


class SeekableRaw(io.RawIOBase):
    """A raw, seekable file of ``_size`` bytes at position ``_pos``: what every
    reader over a known length shares (a subclass gives ``readinto``).
    ``clamp``: a seek past the end stops at the end."""

    clamp = False

    def __init__(self, size: int) -> None:
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        if self.clamp:
            self._pos = min(self._pos, self._size)
        return self._pos


class RangeReader(SeekableRaw):
    """Raw reads of one object by checked ranged GETs (see ``S3Store.open_read``;
    the GCS and Azure stores read the same way)."""

    def __init__(self, store: Store, key: str, size: int) -> None:
        super().__init__(size)
        self._store, self._key = store, key

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self._size - self._pos)
        if n <= 0:
            return 0
        data = self._store.read_range(self._key, self._pos, self._pos + n)
        view[:len(data)] = data
        self._pos += len(data)
        return len(data)
