"""Derived writes check the bytes they read against their source (issue 13 item 11).

A release converted to another dtype is computed from reads of the source
file; a server or proxy that returns other bytes than asked (a 200 with the
whole object for a ranged GET, a stale replica) would otherwise be committed
as garbage weights that then verify, since the new manifest describes the
converted bytes. :class:`HashedSource` wraps the source file the conversion
reads from and hashes every byte in file order -- the bytes the conversion
used, plus any gap it skipped, read through the same file -- so that
:meth:`HashedSource.check` can compare the whole file's sha256 with the
source manifest (or with a separate streamed read) before the commit.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

from registry.errors import IntegrityError, SourceChangedError
from registry.host.sourcecheck import ObjectState, SourceHashes, check_object
from registry.store.base import CHUNK
from registry.store.ranges import SeekableRaw


class HashedSource(SeekableRaw):
    """A seekable reader over ``f`` (``size`` bytes) that hashes what it serves.

    Reads past the hashed prefix first hash the gap (read from ``f``), so the
    digest always covers ``[0, hashed)`` exactly as read; reads before it
    (re-reads) are served but not hashed again. Memory: one chunk.
    """

    def __init__(self, f: IO[bytes], size: int, *, path: str,
                 also: SourceHashes | None = None) -> None:
        super().__init__(size)
        self._f, self.path = f, path
        self._hash = hashlib.sha256()
        #: further hashes fed the same bytes in file order (the server's checksums)
        self.also = also
        #: the source object's state before the read (S3), for verify_object
        self.before: ObjectState | None = None
        self._hashed = 0

    def _fill(self, upto: int) -> None:
        self._f.seek(self._hashed)
        while self._hashed < upto:
            block = self._f.read(min(CHUNK, upto - self._hashed))
            if not block:
                break
            self._hash.update(block)
            if self.also is not None:
                self.also.update(block)
            self._hashed += len(block)

    def readinto(self, buffer: Any) -> int:
        if self._pos > self._hashed:
            self._fill(self._pos)
        self._f.seek(self._pos)
        view = memoryview(buffer).cast("B")
        data = self._f.read(len(view))
        view[:len(data)] = data
        end = self._pos + len(data)
        if self._pos <= self._hashed < end:
            fresh = memoryview(data)[self._hashed - self._pos:]
            self._hash.update(fresh)
            if self.also is not None:
                self.also.update(fresh)
            self._hashed = end
        self._pos = end
        return len(data)

    def sha256(self) -> str:
        """Hash the rest of the file; the sha256 of every byte as read (hex)."""
        self._fill(self._size)
        return self._hash.hexdigest()

    def check(self, expected_sha256: str) -> None:
        """Hash the rest of the file, then compare the whole digest.

        Raises:
            IntegrityError: the bytes read differ from the source's sha256
                (names the file and both digests); nothing may be committed.
        """
        actual = self.sha256()
        if self._hashed != self._size or actual != expected_sha256:
            raise IntegrityError(self.path, expected_size=self._size, actual_size=self._hashed,
                                 expected_sha256=expected_sha256, actual_sha256=actual,
                                 reason=f"the bytes read for conversion differ from the "
                                        f"source (sha256 {actual}, expected "
                                        f"{expected_sha256}); nothing was committed")


def stream_sha256(store: Any, key: str) -> str:
    """sha256 of ``key`` read with one streamed GET (the reference for a
    source that has no manifest)."""
    h = hashlib.sha256()
    for block in store.iter_read(key, CHUNK):
        h.update(block)
    return h.hexdigest()


#: How a source without a manifest was checked (``ReleaseResult.source_checks``):
#: the server's values compared (``"sha256"``, ``"crc32"``, ``"md5"`` ...,
#: joined by ``+``), or :data:`READ_TWICE`.
READ_TWICE = "read twice"


def object_before(store: Any, key: str) -> ObjectState | None:
    """The state of ``key`` before it is read, on a store that has one (S3);
    None elsewhere (a local source is checked by registry.host.sourcecheck.check_local)."""
    state = getattr(store, "object_state", None)
    return state(key) if state is not None else None


def verify_object(store: Any, key: str, before: ObjectState, hashes: SourceHashes,
                  sha256: str) -> str:
    """Check the bytes just read from ``key`` (``hashes``, ``sha256``) against
    every value the server keeps of it; where it keeps none this host can
    recompute, read the object once more and compare sha256.

    Returns:
        The means used: algorithms joined by ``+``, or :data:`READ_TWICE`.

    Raises:
        SourceChangedError: the object changed while it was read, the bytes
            read are not what the server holds, or two reads differ.

    Notes:
        Cost: one HEAD after the read; with no usable checksum, a second full
        GET of the object.
    """
    where = store.url_of(key)
    compared = check_object(where, before, store.object_state(key), hashes)
    if compared:
        return "+".join(compared)
    again = stream_sha256(store, key)
    if again != sha256:
        raise SourceChangedError(
            f"{where}: two reads of the object differ (sha256 {sha256}, then {again}) and the "
            f"server keeps no checksum to tell which is right (offered: "
            f"{', '.join(before.offered) or 'none'}); nothing was committed", key=where)
    return READ_TWICE


def read_checked(store: Any, key: str, *, limit: int, checks: dict[str, str] | None = None,
                 relpath: str = "") -> bytes:
    """``store.read_bytes(key, limit=limit)`` checked as :func:`verify_object`
    checks a copy when the store is S3 (``checks[relpath]`` gets the means).

    Raises:
        SourceChangedError: as :func:`verify_object`; DocumentError: over ``limit``.
    """
    before = object_before(store, key)
    data = store.read_bytes(key, limit=limit)
    if before is not None:
        hashes = SourceHashes(before)
        hashes.update(data)
        means = verify_object(store, key, before, hashes, hashlib.sha256(data).hexdigest())
        if checks is not None:
            checks[relpath or key] = means
    return data
