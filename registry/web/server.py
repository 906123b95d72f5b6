"""The HTTP server of ``registry serve``: bounded idle connections and a clean stop.

Built on uvicorn (h11), with what a long-running service needs and uvicorn
does not do by itself:

* **Header-read timeout** (``header_timeout`` seconds): a connection must
  deliver a complete request head within this time of being opened or of its
  previous response ending, else it is closed. A client trickling one header
  byte at a time (slowloris) holds a socket at most this long; uvicorn alone
  restarts its keep-alive timer on every byte received.
* **Idle keep-alive** (``keep_alive`` seconds): a connection idle after a
  response is closed (uvicorn's ``timeout_keep_alive``).
* **Drain on SIGTERM** (``drain`` seconds): the listening socket is closed at
  once (nothing new is accepted), idle connections are closed, responses in
  flight may finish until the deadline, then every one still running is
  cancelled and its connection closed.
* **Zero-copy file bodies**: the ASGI ``http.response.zerocopysend``
  extension (``{"file", "offset", "count", "more_body"}``), sent with the
  kernel's ``sendfile`` (``loop.sendfile``): the bytes of a verified cached
  file go from the page cache to the socket without passing through Python
  or holding the GIL (registry.web.sending), so a stampede of 48 downloads
  costs the event loop one short call per socket wake-up, not a copy per
  block, and the other routes keep their latency.
* **Exit status 0** for a stop asked by SIGTERM or SIGINT: uvicorn re-raises
  the signal after a graceful stop, so the process would die with 143, which
  systemd (without ``SuccessExitStatus=143``) and Kubernetes count as a
  failure. Work that cannot be interrupted (a mirror's fill in a helper
  thread) is abandoned at that point: :func:`run` ends the process, and the
  fill's partial file is resumed by the next start (registry.pull.resume).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

#: seconds a connection may take to send a request's head
HEADER_TIMEOUT = 10.0
#: seconds an idle keep-alive connection is kept open
KEEP_ALIVE = 5.0
#: seconds responses in flight may take to finish after SIGTERM
DRAIN = 30.0
#: the ASGI extension for a body sent from an open file (module docstring)
ZERO_COPY = "http.response.zerocopysend"


class _Span:
    """``count`` bytes of a file, as h11 frames them (only their length)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count


def _zero_copy(cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop) -> None:
    """Give ``cycle`` (before its application runs) the zero-copy extension."""
    cycle.scope.setdefault("extensions", {})[ZERO_COPY] = {}  # type: ignore[typeddict-item]
    plain = cycle.send

    async def send(message: Any) -> None:
        if message["type"] != ZERO_COPY:
            await plain(message)
        else:
            await _sendfile(cycle, loop, message)
    cycle.send = send  # type: ignore[method-assign]


async def _sendfile(cycle: RequestResponseCycle, loop: asyncio.AbstractEventLoop,
                    message: Any) -> None:
    """One ``http.response.zerocopysend`` message: ``count`` bytes of
    ``file`` from ``offset``, framed by h11 (Content-Length or chunked) and
    written by ``loop.sendfile`` once the headers before them are out. A
    client that went away ends the response as a plain send does (later
    messages are dropped); a file shorter than ``count`` drops the
    connection (the client sees a short body, never a wrong one)."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if cycle.disconnected:
        return
    if not cycle.response_started or cycle.response_complete:
        raise RuntimeError(f"unexpected ASGI message {ZERO_COPY!r} outside a response body")
    file, offset = message["file"], int(message.get("offset") or 0)
    count = message.get("count")
    if count is None:
        count = os.fstat(file.fileno()).st_size - offset
    if count > 0 and cycle.scope["method"] != "HEAD":
        for part in cycle.conn.send_with_data_passthrough(h11.Data(data=_Span(count))):
            if not isinstance(part, _Span):
                cycle.transport.write(part)
                continue
            try:
                # fallback: a file the kernel cannot sendfile is read and written instead
                sent = await loop.sendfile(cycle.transport, file, offset, count)
            except (OSError, RuntimeError):  # the client went away (or closed)
                cycle.transport.close()
                cycle.disconnected = True
                return
            if sent != count:
                cycle.transport.close()
                raise OSError(f"sendfile: {sent} of {count} bytes (the file is shorter)")
    if not message.get("more_body", False):
        cycle.response_complete = True
        cycle.message_event.set()
        cycle.transport.write(cycle.conn.send(h11.EndOfMessage()))
        if cycle.conn.our_state is h11.MUST_CLOSE or not cycle.keep_alive:
            cycle.conn.send(h11.ConnectionClosed())
            cycle.transport.close()
        cycle.on_response()


class _TimedH11(H11Protocol):
    """h11 with a deadline for each request head (module docstring)."""

    header_timeout = HEADER_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._await_head()

    def _await_head(self) -> None:
        self._cancel_head()
        self._waiting_after = self.cycle
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _cancel_head(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is self._waiting_after and not self.transport.is_closing():
            self.transport.close()  # no complete request head in time

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:
            _zero_copy(self.cycle, self.loop)  # before its application's first step

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._waiting_after:
            self._cancel_head()  # a request head arrived

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None
                                                or self.cycle.response_complete):
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    """uvicorn's server that remembers, instead of re-raising, a stop signal."""

    stopped_by: int | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig in (signal.SIGTERM, signal.SIGINT) and self._captured_signals:
            self._captured_signals.pop()  # not raised again after the drain
            self.stopped_by = self.stopped_by or sig


def protocol(header_timeout: float) -> type[H11Protocol]:
    """The h11 protocol class with ``header_timeout`` seconds for each request head."""
    return type("TimedH11", (_TimedH11,), {"header_timeout": header_timeout})


def make_server(app: Any, *, header_timeout: float = HEADER_TIMEOUT,
                keep_alive: float = KEEP_ALIVE, drain: float = DRAIN) -> _Server:
    """A server for ``app`` with these bounds (seconds; see the module docstring)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            http=protocol(header_timeout), timeout_keep_alive=keep_alive,
                            timeout_graceful_shutdown=drain)
    return _Server(config)


def run(server: _Server, sock: socket.socket, cleanup: Any = None) -> None:
    """Serve on ``sock`` until stopped; after a SIGTERM/SIGINT stop (drained
    as the module docstring says), run ``cleanup`` and end the process with
    status 0 without waiting for helper threads."""
    try:
        server.run(sockets=[sock])
    finally:
        if cleanup is not None:
            cleanup()
    if server.stopped_by is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
