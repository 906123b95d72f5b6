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
from uvicorn.protocols.http.h11_impl import H11Protocol

#: seconds a connection may take to send a request's head
HEADER_TIMEOUT = 10.0
#: seconds an idle keep-alive connection is kept open
KEEP_ALIVE = 5.0
#: seconds responses in flight may take to finish after SIGTERM
DRAIN = 30.0


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
