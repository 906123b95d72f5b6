"""A mirror's fill in progress, streamed piece by piece as each piece verifies.

A cold large file used to be sent only once the whole file was in the
mirror's cache, so its first byte waited for the last one. A
:class:`LiveFill` lets every request for a file being filled (the first and
each one arriving meanwhile) send each piece of it (registry.protocol.pieces: 64 MiB
by default) as soon as that piece has landed in the fill's temp file and
verified against the manifest's piece states:

* **Only verified pieces are sent.** The fill's piece checker
  (registry.pull.download) reports piece ``k`` once its bytes on disk hashed
  to the manifest's chained state; nothing else marks a piece sendable. The
  temp file is opened at the first such report, before the fill can unlink
  it, and each response reads a duplicate of that descriptor, so a response
  outlives the fill's rename and unlink. No byte of the temp file is written
  twice by the fill (each byte range is fetched once), so verified bytes do
  not change under a reader of this process; the cache folder is private to
  its user (registry.pull.privacy).
* **A later bad piece cuts the response.** When the fill fails (a piece
  that does not verify, a wrong size, the store failing), a response that
  reaches a piece not verified raises, and the server drops the connection
  before any byte of that piece: a client reading ``Content-Length`` bytes
  sees a short read, never a whole, wrong file. A fill already failed when a
  request asks is answered with its error (409, 503...) before any byte.
* **Waiting holds no thread.** A response waiting for its next piece awaits
  an asyncio future that the checking thread resolves
  (``loop.call_soon_threadsafe``); each verified span is then sent from
  the temp file by registry.web.sending (zero-copy ``sendfile`` under
  ``registry serve``: no byte goes through Python), so the JSON API and
  warm files keep the event loop during a stampede.

A ranged request waits only for the pieces its range touches.

Files without piece states (or where piece digests cannot be checked here)
are not streamed: their requests wait for the whole fill, as before.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from registry.protocol import pieces as pc
from registry.errors import IntegrityError
from registry.protocol.manifest import FileEntry
from registry.web.hubfiles import spans

#: bytes at the end of a file held back until its fill has ended (see :meth:`LiveFill.spans`)
TAIL = 256 * 1024


def streamable(entry: FileEntry) -> bool:
    """``entry`` can be sent piece by piece while it fills (it has piece
    states, more than one piece, and piece digests can be checked here)."""
    return entry.pieces is not None and pc.AVAILABLE and \
        len(entry.pieces.bounds(entry.size)) > 1


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class LiveFill:
    """The verified pieces of one running fill (see the module docstring).

    The fill's threads call :meth:`verified` and then :meth:`end`; requests
    (on the event loop) call :meth:`first` and send :meth:`spans`.
    Thread-safe.
    """

    def __init__(self, entry: FileEntry) -> None:
        self.entry = entry
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._have: set[int] = set()
        self._ended = False
        self._error: BaseException | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # -- the fill's side -------------------------------------------------------------

    def verified(self, tmp: Path, k: int) -> None:
        """Piece ``k`` of the temp file ``tmp`` verified (a checking thread).
        The first call opens ``tmp`` (read-only) for the readers; a file that
        cannot be opened leaves the pieces unsendable (requests wait for the
        whole fill instead)."""
        with self._lock:
            if self._ended:
                return
            if self._fd is None:
                try:
                    self._fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return
            self._have.add(k)
            self._wake_all()

    def end(self, error: BaseException | None) -> None:
        """The fill ended: with ``error`` None every piece is verified (the
        blob is in the cache), else the pieces not reported are never sent."""
        with self._lock:
            self._ended = True
            self._error = error
            if error is None:
                self._have.update(range(len(spans(self.entry, 0, self.entry.size))))
            if self._fd is not None:
                os.close(self._fd)  # readers hold their own duplicates
                self._fd = None
            self._wake_all()

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:
                pass  # that loop is closed: its request is gone

    # -- the requests' side ----------------------------------------------------------

    @property
    def failed(self) -> BaseException | None:
        """The fill's error once it failed, else None."""
        with self._lock:
            return self._error

    async def ready(self, k: int) -> None:
        """Return once piece ``k`` is verified, without holding a thread.

        Raises:
            the fill's error (IntegrityError, StorageError...): the fill
                ended before piece ``k`` verified.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if k in self._have:
                    return
                if self._ended:
                    raise self._error or IntegrityError(
                        self.entry.path, reason=f"piece {k} was never verified")
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    async def settled(self) -> None:
        """Return once the fill has ended, well or not (without holding a thread)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._ended:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, fut))
            await fut

    async def first(self, start: int, end: int) -> int | None:
        """Wait until the first piece of ``[start, end)`` is verified; then a
        descriptor of the temp file for :meth:`spans` (the caller's to
        close), or None when the fill already ended well (send from the
        blob).

        Raises:
            the fill's error: it failed (before or after that piece): the
                request is answered with it, no byte sent.
        """
        todo = spans(self.entry, start, end)
        await self.ready(todo[0][0])
        with self._lock:
            if self._error is not None:
                raise self._error
            return None if self._fd is None else os.dup(self._fd)

    async def spans(self, start: int, end: int) -> AsyncIterator[tuple[int, int]]:
        """The spans of ``[start, end)`` that may be sent, in order, each once
        its piece verified (for registry.web.sending.FileSpans over
        :meth:`first`'s descriptor); raises the fill's error at the first
        piece that never verifies (the server then drops the connection).

        The last :data:`TAIL` bytes of a response that reaches the file's
        end wait for the fill to end (its fsync and link into ``blobs/``): a
        client that has a whole file finds it in the mirror's cache, never a
        fill still finishing."""
        for k, a, b in spans(self.entry, start, end):
            await self.ready(k)
            lo, hi = max(a, start), min(b, end)
            if hi == self.entry.size:
                tail = max(lo, hi - TAIL)
                if tail > lo:
                    yield lo, tail
                await self.settled()  # verified bytes: sent however the fill ended
                lo = tail
            yield lo, hi
