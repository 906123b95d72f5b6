"""BLAKE3 beside sha256: the digest a local pull checks, several times cheaper per core.

Why (issue 19, item 3). A pull from a local store copies each file with
``copy_file_range`` and must check every byte it placed. SHA-256 runs at
about 1.6 GB/s on one core here (SHA-NI); the kernel copies page cache at
about 3 GB/s. On a 2-core host the copy and a SHA-256 of the same bytes
cannot both fit in the time ``cp -r`` takes, however the pieces are spread
(registry.protocol.pieces: the piece checks alone, on both cores, took 1.26x ``cp -r``).
BLAKE3 (the ``blake3`` package, the reference Rust implementation with SIMD)
hashes at about 3.5 GB/s per core, so one core hashes what the other copies.

What. Every file of at least :data:`MIN_SIZE` bytes gets, at commit, a
``blake3`` field in its manifest entry beside ``size``, ``sha256`` and
``pieces``. It is computed from the same buffers the sha256 reads, on a
helper thread while the sha256 runs (:class:`Blake3Side`), so the commit
reads nothing more. The sha256 stays the file's digest everywhere: the seed's
MANIFEST.json field, blob names in the pull cache, ``registry verify``,
resume verification, signatures.

Trust. A pull checks the ``blake3`` only where the manifest is what it
trusts: a digest from the same document as the sha256 vouches for the bytes
as much as the sha256 does (both are 256-bit cryptographic hashes). A pull
that verifies a signature (``--trusted-key`` / ``--trusted-ca``) trusts the
signed per-file sha256, which the signature covers and the ``blake3`` field
does not: such a pull checks the sha256 (by pieces, on every core). A
manifest without ``blake3`` (older releases, trees adopted or written by
DCP) is checked by sha256 as before.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from registry.host.pools import HelperPool

try:
    import blake3 as _blake3
except ImportError:  # pragma: no cover - a core dependency; kept optional for vendored installs
    _blake3 = None

#: whether BLAKE3 digests can be computed and checked here.
AVAILABLE = _blake3 is not None
#: files of at least this many bytes get a ``blake3`` digest at commit.
MIN_SIZE = 1024 * 1024
#: blocks at least this large are hashed on a helper thread (smaller: inline).
_SIDE_MIN = 256 * 1024
_POOL = HelperPool(4, "blake3")


def hasher() -> Any:
    """A new single-threaded BLAKE3 hasher (``update``, ``hexdigest``).

    Raises:
        RuntimeError: the ``blake3`` package is not installed.
    """
    if _blake3 is None:
        raise RuntimeError("BLAKE3 digests need the blake3 package")
    return _blake3.blake3()


class Blake3Side:
    """The BLAKE3 of a stream hashed alongside another digest.

    ``begin(block)`` starts hashing ``block`` (on a helper thread when it is
    large: the GIL is released) and ``end()`` waits for it; the caller hashes
    the same block with its own digest in between and keeps the block
    unchanged until ``end`` returns. Blocks must come in stream order.
    """

    def __init__(self) -> None:
        self._h = hasher() if AVAILABLE else None
        self._pending: Future[Any] | None = None
        self.size = 0

    def begin(self, block: Any) -> None:
        if self._h is None:
            return
        n = memoryview(block).nbytes
        self.size += n
        if n >= _SIDE_MIN:
            self._pending = _POOL.submit(self._h.update, block)
        else:
            self._h.update(block)

    def end(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def hexdigest(self) -> str | None:
        """The digest, or None when the stream is under MIN_SIZE bytes or
        BLAKE3 is unavailable. Call after the last ``end``."""
        self.end()
        if self._h is None or self.size < MIN_SIZE:
            return None
        return str(self._h.hexdigest())


__all__ = ["AVAILABLE", "MIN_SIZE", "Blake3Side", "hasher"]
