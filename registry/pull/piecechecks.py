"""The hashes of one file being fetched into the pull cache: its sha256 fed in file
order on a helper thread (:class:`Hasher`), and its piece checks started as soon as
each piece has landed (:class:`PieceChecks`; registry.protocol.pieces). Split from
:mod:`registry.pull.download`, which uses both."""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait

from registry.protocol import pieces as pc
from registry.errors import IntegrityError
from registry.protocol.manifest import FileEntry
from registry.pull import resume
from registry.protocol.verify import piece_error

#: blocks a file's hash may lag behind its download.
HASH_DEPTH = 3


class Hasher:
    """sha256 of blocks fed in order, on a helper thread for large files."""

    def __init__(self, pipelined: bool) -> None:
        self.h = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pull-sha256") if pipelined else None
        self._pending: deque[Future[None]] = deque()

    def update(self, block: bytes | memoryview) -> None:
        """``block`` must not change afterwards (bytes, or a view of bytes)."""
        if self._pool is None:
            self.h.update(block)
            return
        self._pending.append(self._pool.submit(self.h.update, block))
        while len(self._pending) > HASH_DEPTH:
            self._pending.popleft().result()

    def close(self) -> None:
        try:
            while self._pending:
                self._pending.popleft().result()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def hexdigest(self) -> str:
        self.close()
        return self.h.hexdigest()


class PieceChecks:
    """Piece checks of one file (registry.protocol.pieces), each started on ``pool`` as
    soon as every byte of its piece has landed in ``fd``: the piece is hashed
    back from the page cache, on any free core, while the download goes on.
    Nothing is hashed in file order, so ranges that land out of order cost no
    wait and no second pass."""

    def __init__(self, entry: FileEntry, fd: int, pool: ThreadPoolExecutor,
                 log: resume.PieceLog | None = None) -> None:
        assert entry.pieces is not None
        self.entry, self.fd, self.pool, self.log = entry, fd, pool, log
        self.bounds = entry.pieces.bounds(entry.size)
        self.futures: dict[int, Future[str | None]] = {}

    def landed(self, spans: list[tuple[int, int]]) -> None:
        """``spans``: ``[start, end)`` ranges fully written so far."""
        merged: list[list[int]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            elif b > a:
                merged.append([a, b])
        for k, (a, b) in enumerate(self.bounds):
            if k not in self.futures and any(s <= a and b <= e for s, e in merged):
                self.futures[k] = self.pool.submit(self._check, k)

    def _check(self, k: int) -> str | None:
        bad = pc.check_fd(self.fd, self.entry.pieces, self.entry.sha256,  # type: ignore[arg-type]
                          self.entry.size, k)
        if bad is None and self.log is not None:
            self.log.add(k)  # a resumed pull re-checks it all the same (registry.pull.resume)
        return bad

    def first_error(self) -> IntegrityError | None:
        """Wait for every started check; the lowest bad piece's error."""
        bad = None
        for k in sorted(self.futures):
            actual = self.futures[k].result()
            if actual is not None and bad is None:
                bad = piece_error(self.entry, k, actual)
        return bad

    def close(self) -> None:
        for fut in self.futures.values():
            fut.cancel()
        wait(list(self.futures.values()))
