"""registry serve's server sends file bodies zero-copy (the ASGI
``http.response.zerocopysend`` extension, registry.web.server), framed right
and cut, never padded, when the file is short. A real uvicorn server on a
real socket, read with http.client."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.web.server import ZERO_COPY, make_server
from registry.web.sending import FileSpans

DATA = os.urandom(3 * 1024 * 1024 + 17)


def _app(path: Path, seen: list[Any]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append(ZERO_COPY in scope.get("extensions", {}))
        route = scope["path"]
        size = len(DATA)
        if route == "/spans":  # FileSpans, as the mirror sends: three spans, one range
            fd = os.open(path, os.O_RDONLY)

            async def spans() -> Any:
                yield 10, 1000
                yield 1000, 2_000_000
                yield 2_000_000, size - 5

            await FileSpans(fd, spans(), status_code=206, sent=lambda n: None,
                            headers={"Content-Length": str(size - 15)})(scope, receive, send)
            return
        count = size + 100 if route == "/short" else size  # /short: the file ends first
        headers = [] if route == "/chunked" else [(b"content-length", b"%d" % count)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        with open(path, "rb") as f:
            await send({"type": ZERO_COPY, "file": f, "offset": 0, "count": 4096,
                        "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            await send({"type": ZERO_COPY, "file": f, "offset": 4096, "count": count - 4096,
                        "more_body": route != "/chunked"})
        if route != "/chunked":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[tuple[int, list[Any]]]:
    path = tmp_path / "blob"
    path.write_bytes(DATA)
    seen: list[Any] = []
    srv = make_server(_app(path, seen))
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield port, seen
    finally:
        srv.should_exit = True
        t.join(20)


def _get(port: int, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def test_whole_file_and_its_framing(server: tuple[int, list[Any]]) -> None:
    port, seen = server
    for path in ("/whole", "/chunked"):
        status, headers, body = _get(port, path)
        assert status == 200
        assert hashlib.sha256(body).hexdigest() == hashlib.sha256(DATA).hexdigest()
        assert ("Transfer-Encoding" in headers) == (path == "/chunked")
    assert seen == [True, True]  # the server offered the extension


def test_spans_of_a_file_response(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    status, _, body = _get(port, "/spans")
    assert status == 206
    assert body == DATA[10:len(DATA) - 5]


def test_a_short_file_cuts_the_response(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/short")
    r = conn.getresponse()
    assert r.status == 200 and int(r.getheader("Content-Length")) == len(DATA) + 100
    with pytest.raises(http.client.IncompleteRead) as got:
        r.read()
    assert got.value.partial == DATA  # what the file holds, then the connection dropped
    conn.close()


def test_keep_alive_after_a_zero_copy_body(server: tuple[int, list[Any]]) -> None:
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(3):  # the same connection: the framing ended each response
            conn.request("GET", "/whole")
            r = conn.getresponse()
            assert r.status == 200 and r.read() == DATA
    finally:
        conn.close()
