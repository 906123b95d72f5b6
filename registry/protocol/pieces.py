"""Piece digests: a large file's sha256, checkable one fixed-size piece at a time, on every core.

SHA-256 reads a file in order: it carries a 32-byte chaining value (its state,
``H0..H7``) from one 64-byte block to the next, and the file's sha256 is the
last state after the padding block. A large file's manifest entry records,
beside the whole-file ``sha256``, the state at every piece boundary::

    "pieces": {"size": 67108864, "states": [s1, s2, ..., s(n-1)]}

``states[k-1]`` is the SHA-256 state after the first ``k * size`` bytes
(eight big-endian 32-bit words, 64 hex digits, the shape of a digest). Piece
``k`` (bytes ``[k*size, min((k+1)*size, file size))``) verifies when SHA-256
started from ``s_k`` (``s_0`` is the standard initial value, never read from
the manifest) and run over the piece's bytes ends at ``s_(k+1)``, or, for the
last piece, finalizes (padding with the file's length) to the entry's
``sha256``. Every piece checks independently, so ``n`` pieces run on ``n``
cores, in any order, as their bytes land.

**Trust.** All pieces verified is exactly the whole-file sha256 verified: by
induction from the fixed initial value, the true state after piece ``k`` is
``s_(k+1)``, so the file hashes to ``sha256``. A forged ``states`` list cannot
make other bytes pass; at worst it makes good bytes fail. Piece states
therefore add no trust of their own: whatever vouches for the whole-file
sha256 (the manifest digest a release records, a ``model.sig`` that signs
per-file sha256) vouches for a piece-verified file, and a blob named by its
sha256 in the pull cache holds exactly those bytes.

**Cost.** Computing the states reads nothing more: the writer's sha256 pauses
at each boundary to copy 32 bytes. Python's ``hashlib`` does not expose its
state, so the digests run through OpenSSL's ``SHA256_*`` functions of the
same libcrypto that ``hashlib`` uses (SHA-NI where the CPU has it), called by
ctypes, which releases the GIL. Where that library is missing
(``AVAILABLE`` false) files get no pieces and verify the old way.

Files of at most one piece get no ``pieces``; a manifest without them (older
releases, foreign trees) verifies whole files, as before.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


from registry.errors import UsageError
from registry.protocol.fastdigest import Blake3Side
from registry.obs.metrics import piece_checked
from registry.obs.tracing import leaf

#: bytes per piece of new manifests (override: ``REGISTRY_PIECE_SIZE``, bytes,
#: a positive multiple of 4096; tests use small pieces).
PIECE_SIZE = 64 * 1024 * 1024
_WORDS = 8


def piece_size() -> int:
    """The piece size new manifests use: ``$REGISTRY_PIECE_SIZE`` or PIECE_SIZE.

    Raises:
        UsageError: the variable is not a positive multiple of 4096.
    """
    raw = os.environ.get("REGISTRY_PIECE_SIZE")
    if not raw:
        return PIECE_SIZE
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n <= 0 or n % 4096:
        raise UsageError(f"REGISTRY_PIECE_SIZE={raw!r}: must be a positive multiple of 4096 (bytes)")
    return n


class _Ctx(ctypes.Structure):
    # OpenSSL's SHA256_CTX (include/openssl/sha.h), stable since 0.9.8.
    _fields_ = [("h", ctypes.c_uint32 * 8), ("Nl", ctypes.c_uint32), ("Nh", ctypes.c_uint32),
                ("data", ctypes.c_uint32 * 16), ("num", ctypes.c_uint), ("md_len", ctypes.c_uint)]


def _load() -> Any:
    try:
        import _hashlib

        lib = ctypes.CDLL(_hashlib.__file__)  # its libcrypto's symbols resolve through it
        for name in ("SHA256_Init", "SHA256_Update", "SHA256_Final"):
            getattr(lib, name)
    except (ImportError, OSError, AttributeError):
        return None
    lib.SHA256_Init.argtypes = [ctypes.c_void_p]
    lib.SHA256_Update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.SHA256_Final.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return lib


_LIB = _load()
#: whether piece states can be computed and checked here.
AVAILABLE = _LIB is not None


@dataclass(frozen=True, slots=True)
class Pieces:
    """The piece states of one file (see the module docstring).

    Attributes:
        size: bytes per piece (the last piece may be shorter).
        states: SHA-256 states after pieces ``0 .. n-2``, 64 hex digits each.
    """

    size: int
    states: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "states": list(self.states)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Pieces:
        return cls(doc["size"], tuple(doc["states"]))

    def count(self) -> int:
        """Number of pieces: one more than the recorded states."""
        return len(self.states) + 1

    def fits(self, file_size: int) -> bool:
        """The states are as many as a file of ``file_size`` bytes needs."""
        return self.size > 0 and self.size % 64 == 0 and \
            -(-file_size // self.size) == self.count()

    def bounds(self, file_size: int) -> list[tuple[int, int]]:
        """``[start, end)`` of every piece, in bytes."""
        return [(k * self.size, min(file_size, (k + 1) * self.size))
                for k in range(self.count())]


def _addr(data: Any) -> tuple[int, int, Any]:
    import numpy as np  # here: a CLI call that hashes nothing does not load numpy

    arr = np.frombuffer(data, dtype=np.uint8)
    return arr.ctypes.data, arr.size, arr


def _state_hex(ctx: _Ctx) -> str:
    return struct.pack(">8I", *ctx.h).hex()


class ChainHasher:
    """sha256 of a byte stream that records its state at every piece boundary.

    A drop-in for ``hashlib.sha256()`` (``update``, ``hexdigest``) that also
    gives :attr:`pieces`. One thread at a time may call ``update`` (as with
    hashlib); the hashing itself releases the GIL.

    Args:
        size: piece size in bytes (default :func:`piece_size`).
        blake3: also compute the stream's BLAKE3 (registry.protocol.fastdigest), on a
            helper thread while the sha256 runs (releases; checkpoints do
            not need it: nothing pulls them).
    """

    def __init__(self, size: int | None = None, *, blake3: bool = False) -> None:
        self.piece = piece_size() if size is None else size
        self.size = 0
        self.states: list[str] = []
        self._fallback = hashlib.sha256() if _LIB is None else None
        self._ctx = _Ctx()
        if _LIB is not None:
            _LIB.SHA256_Init(ctypes.byref(self._ctx))
        self._digest: str | None = None
        self._b3 = Blake3Side() if blake3 else None

    def update(self, data: Any) -> None:
        """Hash the bytes-like ``data`` (contiguous), next in the stream; its
        BLAKE3 (registry.protocol.fastdigest) runs on a helper thread meanwhile."""
        if self._b3 is None:
            self._update(data)
            return
        self._b3.begin(data)
        try:
            self._update(data)
        finally:
            self._b3.end()

    @property
    def blake3(self) -> str | None:
        """The stream's BLAKE3 digest, or None (under fastdigest.MIN_SIZE
        bytes, or without the blake3 package). Call after the last update."""
        return self._b3.hexdigest() if self._b3 is not None else None

    def _update(self, data: Any) -> None:
        if self._fallback is not None:
            self._fallback.update(data)
            self.size += memoryview(data).nbytes
            return
        ptr, n, keep = _addr(data)
        while n:
            room = self.piece - self.size % self.piece
            take = min(n, room)
            _LIB.SHA256_Update(ctypes.byref(self._ctx), ptr, take)
            self.size += take
            ptr += take
            n -= take
            if take == room:
                self.states.append(_state_hex(self._ctx))
        del keep

    def hexdigest(self) -> str:
        """The whole stream's sha256 (the stream ends here)."""
        if self._digest is None:
            if self._fallback is not None:
                self._digest = self._fallback.hexdigest()
            else:
                out = (ctypes.c_ubyte * 32)()
                _LIB.SHA256_Final(out, ctypes.byref(self._ctx))
                self._digest = bytes(out).hex()
        return self._digest

    @property
    def pieces(self) -> Pieces | None:
        """The piece states, or None for a stream of at most one piece (or
        without libcrypto). Call after the last ``update``."""
        if self._fallback is not None or self.size <= self.piece:
            return None
        full = self.size // self.piece - (self.size % self.piece == 0)
        return Pieces(self.piece, tuple(self.states[:full]))


@leaf("registry.piece_check")
def check_piece(pieces: Pieces, sha256: str, file_size: int, k: int,
                blocks: Iterable[Any]) -> str | None:
    """Check piece ``k`` of a file from its bytes.

    Args:
        pieces, sha256, file_size: the file's manifest entry.
        k: the piece index, ``0 <= k < pieces.count()``.
        blocks: the piece's bytes in order (bytes-like blocks).

    Returns:
        None when the piece verifies, else the state (or, for the last
        piece, the sha256) its bytes actually give, 64 hex digits.

    Raises:
        RuntimeError: libcrypto is unavailable (check :data:`AVAILABLE`).
    """
    if _LIB is None:
        raise RuntimeError("piece digests need OpenSSL's libcrypto")
    start, end = k * pieces.size, min(file_size, (k + 1) * pieces.size)
    ctx = _Ctx()
    _LIB.SHA256_Init(ctypes.byref(ctx))
    if k:
        ctx.h[:] = struct.unpack(">8I", bytes.fromhex(pieces.states[k - 1]))
        bits = start * 8
        ctx.Nl, ctx.Nh = bits & 0xFFFFFFFF, bits >> 32
    got = 0
    for block in blocks:
        ptr, n, keep = _addr(block)
        _LIB.SHA256_Update(ctypes.byref(ctx), ptr, n)
        got += n
        del keep
    last = k == pieces.count() - 1
    if last:
        out = (ctypes.c_ubyte * 32)()
        _LIB.SHA256_Final(out, ctypes.byref(ctx))
        actual, want = bytes(out).hex(), sha256
    else:
        actual, want = _state_hex(ctx), pieces.states[k]
    ok = actual == want and got == end - start
    piece_checked(ok)
    return None if ok else actual


def expected_state(pieces: Pieces, sha256: str, k: int) -> str:
    """What piece ``k`` must end at: ``states[k]``, or ``sha256`` for the last."""
    return sha256 if k == pieces.count() - 1 else pieces.states[k]


def read_fd(fd: int, start: int, end: int, chunk: int = 4 * 1024 * 1024,
            ) -> Iterable[memoryview]:
    """The bytes ``[start, end)`` of an open file, in blocks of ``chunk``
    (one reused buffer: each block is valid until the next is asked for)."""
    buf = bytearray(min(chunk, max(1, end - start)))
    view = memoryview(buf)
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[:min(len(buf), end - pos)]], pos)
        if not n:
            return
        yield view[:n]
        pos += n


def check_fd(fd: int, pieces: Pieces, sha256: str, file_size: int, k: int) -> str | None:
    """:func:`check_piece` reading piece ``k`` from the open file ``fd``."""
    start, end = pieces.bounds(file_size)[k]
    return check_piece(pieces, sha256, file_size, k, read_fd(fd, start, end))


__all__ = ["AVAILABLE", "PIECE_SIZE", "ChainHasher", "Pieces", "check_fd", "check_piece",
           "expected_state", "piece_size", "read_fd"]
