"""Responses that send verified bytes of a local file, zero-copy where the server can.

The mirror's bytes (a verified blob of its cache, or the verified pieces of
a fill still running: registry.web.filling) are on the local disk, mostly
in the page cache. :class:`FileSpans` sends them:

* **Zero-copy under ``registry serve``.** Its server (registry.web.server)
  offers the ASGI ``http.response.zerocopysend`` extension: each span goes
  from the file to the socket with the kernel's ``sendfile``, never read
  into Python, without the GIL and without a worker thread. Under 48
  concurrent downloads the event loop makes one short call per socket
  wake-up instead of copying every block, so the JSON API and the pages
  keep their latency (bench/mirror_bench.py).
* **Elsewhere** (another ASGI server, the in-process test client): the same
  spans read in blocks of :data:`BLOCK` on a worker thread and sent as
  ordinary body messages.

What is sent is decided by the caller: ``spans`` yields ``(start, end)``
byte ranges in order, each only once its bytes may be sent (verified);
nothing else of the file is sent. When ``spans`` raises, the response stops
before the bytes it had not yet yielded (the server drops the connection: a
client reading ``Content-Length`` bytes sees a short read).

The file routes' own work that must block (opening a blob and checking its
stamp, reading a release's facts) runs on worker threads bounded by
:func:`file_threads`, a limiter of its own, so the JSON API's handlers
(anyio's default limiter) never queue behind a stampede's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from registry.errors import IntegrityError

#: the ASGI extension registry.web.server offers
ZERO_COPY = "http.response.zerocopysend"
#: bytes per block where the server cannot send zero-copy
BLOCK = 256 * 1024
#: worker threads the file routes' blocking work may hold at once (per event loop)
FILE_THREADS = 8


class FileSpans(Response):
    """The bytes of ``fd`` (this response's to close) in the spans ``spans``
    yields (see the module docstring); ``sent`` is called with each span's
    length once it was handed to the server."""

    def __init__(self, fd: int, spans: AsyncIterator[tuple[int, int]], *, status_code: int,
                 headers: dict[str, str], sent: Callable[[int], None]) -> None:
        self.fd = fd
        self.spans = spans
        self.sent = sent
        self.status_code = status_code
        self.media_type = None
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        zero = ZERO_COPY in scope.get("extensions", {})
        with open(self.fd, "rb", buffering=0, closefd=True) as f:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async with contextlib.aclosing(self.spans) as spans:  # type: ignore[type-var]
                async for a, b in spans:
                    if zero:
                        await send({"type": ZERO_COPY, "file": f, "offset": a,
                                    "count": b - a, "more_body": True})
                        self.sent(b - a)
                        continue
                    pos = a
                    while pos < b:
                        n = min(BLOCK, b - pos)
                        block = await anyio.to_thread.run_sync(os.pread, self.fd, n, pos)
                        if len(block) != n:
                            raise IntegrityError(str(scope.get("path")),
                                                 reason=f"bytes {pos}-{b}: short read")
                        await send({"type": "http.response.body", "body": block,
                                    "more_body": True})
                        self.sent(n)
                        pos += n
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def whole(start: int, end: int) -> AsyncIterator[tuple[int, int]]:
    """The one span ``[start, end)`` (a file verified before the response)."""
    if end > start:
        yield start, end


_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = \
    weakref.WeakKeyDictionary()


def file_threads() -> anyio.CapacityLimiter:
    """The running loop's limiter of :data:`FILE_THREADS` for the file routes' work."""
    loop = asyncio.get_running_loop()
    limiter = _LIMITERS.get(loop)
    if limiter is None:
        limiter = _LIMITERS[loop] = anyio.CapacityLimiter(FILE_THREADS)
    return limiter


async def on_file_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a worker thread of :func:`file_threads`."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=file_threads())
