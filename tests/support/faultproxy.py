"""A small fault-injecting HTTP proxy in front of the test S3 server.

Object stores in the field misbehave in a handful of ways (issue 13): they
ignore ``If-None-Match``/``If-Match`` or ``Range``, throttle (503 SlowDown),
fail (500), reset connections, answer late, deny one prefix, or report an
error for a request they carried out. The proxy reproduces each against the
real moto server: every request is forwarded unless a rule says otherwise.

A rule is a callable ``rule(req) -> Action | None``; the first rule that
returns an action decides. ``req`` is a :class:`Request` (method, key,
query, headers, ``seq``: the request's number since the proxy started or
was last :meth:`reset`). Every request is logged in ``proxy.log``.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.servers import ThreadedServer

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te",
        "upgrade", "content-length"}


@dataclass
class Request:
    seq: int
    method: str
    bucket: str
    key: str
    query: dict[str, list[str]]
    headers: dict[str, str]

    @property
    def op(self) -> str:
        """A short name of the S3 operation (enough for the fault matrix)."""
        q = self.query
        if self.method == "GET" and not self.key:
            return "ListObjects" if ("list-type" in q or "prefix" in q or not q) else "GET?"
        if "uploads" in q:
            return "CreateMultipart" if self.method == "POST" else "ListMultipart"
        if "uploadId" in q:
            return {"PUT": "UploadPart", "POST": "CompleteMultipart",
                    "DELETE": "AbortMultipart"}.get(self.method, "ListParts")
        if "delete" in q:
            return "DeleteObjects"
        return {"GET": "GetObject", "HEAD": "HeadObject", "PUT": "PutObject",
                "DELETE": "DeleteObject", "POST": "Post"}.get(self.method, self.method)


@dataclass
class Action:
    """What to do with one request.

    kind:
        ``error``: answer ``status`` with an S3 error ``code`` (not forwarded).
        ``error_after``: forward, then answer the error anyway (a server that
            did the work and reported a failure).
        ``reset``: close the connection with a TCP reset, nothing forwarded.
        ``reset_after``: forward, then reset instead of answering.
        ``delay``: sleep ``seconds``, then forward.
        ``strip``: forward without the headers in ``headers`` (a server that
            ignores them: ``If-None-Match``, ``If-Match``, ``Range``).
        ``corrupt``: forward, then flip the last byte of the answer's body and
            drop its checksum headers (a server or cache that returns other
            bytes than stored, and no checksum).
        ``edit``: forward with the request's headers and body passed through
            ``edit_request(headers, body) -> (headers, body)``, then answer what
            ``edit_response(req, status, headers, body)`` returns as
            ``(status, headers, body)`` (a server that writes other ETags or
            clocks, a cache that answers from an old view); with
            ``drop_answer``, reset the connection instead of answering (the
            request was carried out, its answer lost).

    ``hold`` (any forwarded answer, ``corrupt`` included): send the answer's
    head and its first ``hold_at`` body bytes, then wait until the event is
    set (at most ``hold_seconds``) before the rest: a store whose stream
    stalls mid-object, for as long as a test needs. ``rate`` (bytes per
    second, any forwarded answer): send the body at that pace, a slow store
    streaming a large object (benchmarks).
    """

    kind: str
    status: int = 503
    code: str = "SlowDown"
    seconds: float = 0.0
    headers: tuple[str, ...] = ()
    edit_request: Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]] | None = None
    edit_response: Callable[[Request, int, list[tuple[str, str]], bytes],
                            tuple[int, list[tuple[str, str]], bytes]] | None = None
    drop_answer: bool = False
    hold: threading.Event | None = None
    hold_at: int = 0
    hold_seconds: float = 120.0
    rate: float = 0.0


Rule = Callable[[Request], "Action | None"]


@dataclass
class FaultProxy(ThreadedServer):
    """Start with :meth:`start`; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    upstream: str
    rules: list[Rule] = field(default_factory=list)
    log: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        up = urlsplit(self.upstream)
        self._up = (up.hostname or "127.0.0.1", up.port or 80)
        self._lock = threading.Lock()
        self._seq = 0
        self._busy = 0
        self._idle = threading.Condition(self._lock)
        proxy = self

        class Handler(_Handler):
            owner = proxy

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self._serve(server)

    def reset(self) -> None:
        """Forget the log and the rules; numbering starts again at 0."""
        with self._lock:
            self._seq = 0
            self.log.clear()
            self.rules.clear()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no request is being handled (a delayed one still lands
        after its client gave up: a test checks the store after that)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError(f"the fault proxy still handles {self._busy} requests")

    def _track(self, delta: int) -> None:
        with self._idle:
            self._busy += delta
            if self._busy == 0:
                self._idle.notify_all()

    def _next(self, method: str, path: str, headers: dict[str, str]) -> Request:
        parts = urlsplit(path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        with self._lock:
            req = Request(self._seq, method, bucket, key,
                          parse_qs(parts.query, keep_blank_values=True), headers)
            self._seq += 1
            self.log.append(req)
        return req

    def decide(self, req: Request) -> Action | None:
        for rule in list(self.rules):
            action = rule(req)
            if action is not None:
                return action
        return None


def _error_body(code: str, status: int) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>injected by the test proxy ({status})</Message></Error>").encode()


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without TCP_NODELAY, Nagle's
        # algorithm holds the body until the client's delayed ACK (40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reset(self) -> None:
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes,
                action: Action | None = None) -> None:
        self.send_response_only(status)
        length = str(len(body))
        for k, v in headers:
            if k.lower() == "content-length" and self.command == "HEAD":
                length = v  # a HEAD answer has no body but the object's length
            if k.lower() not in _HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", length)
        self.end_headers()
        if self.command == "HEAD":
            return
        if action is not None and action.hold is not None and action.hold_at < len(body):
            self.wfile.write(body[:action.hold_at])
            self.wfile.flush()
            action.hold.wait(action.hold_seconds)
            body = body[action.hold_at:]
        if action is not None and action.rate > 0:
            step = 256 * 1024
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                time.sleep(step / action.rate)
            return
        self.wfile.write(body)

    def _handle(self) -> None:
        self.owner._track(1)
        try:
            self._handle_tracked()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (its read timeout)
        finally:
            self.owner._track(-1)

    def _handle_tracked(self) -> None:
        headers = {k: v for k, v in self.headers.items()}
        req = self.owner._next(self.command, self.path, headers)
        body = self._body()
        action = self.owner.decide(req)
        kind = action.kind if action else "forward"
        if kind == "reset":
            self._reset()
            return
        if kind == "error":
            assert action is not None
            self._answer(action.status, [("Content-Type", "application/xml")],
                         _error_body(action.code, action.status))
            return
        if kind == "delay":
            assert action is not None
            time.sleep(action.seconds)
        dropped = {h.lower() for h in action.headers} if kind == "strip" and action else set()
        send = {k: v for k, v in headers.items() if k.lower() not in _HOP | dropped}
        if kind == "edit" and action is not None and action.edit_request is not None:
            send, body = action.edit_request(send, body)
        conn = http.client.HTTPConnection(*self.owner._up, timeout=60)
        try:
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.request(self.command, self.path, body=body, headers=send)
            resp = conn.getresponse()
            data = resp.read()
            status, resp_headers = resp.status, resp.getheaders()
        finally:
            conn.close()
        if kind == "reset_after" or (kind == "edit" and action is not None
                                     and action.drop_answer):
            self._reset()
            return
        if kind == "corrupt" and data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
            resp_headers = [(k, v) for k, v in resp_headers  # no checksum to give it away
                            if not k.lower().startswith("x-amz-checksum")]
        if kind == "edit" and action is not None and action.edit_response is not None:
            status, resp_headers, data = action.edit_response(req, status, resp_headers, data)
        if kind == "error_after":
            assert action is not None
            self._answer(action.status, [("Content-Type", "application/xml")],
                         _error_body(action.code, action.status))
            return
        self._answer(status, resp_headers, data, action)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


# -- rules used by several tests ---------------------------------------------------


def drop_conditions(req: Request) -> Action | None:
    """A server that accepts conditional writes and ignores the condition."""
    if any(h.lower() in ("if-none-match", "if-match") for h in req.headers):
        return Action("strip", headers=("If-None-Match", "If-Match"))
    return None


def ignore_range(req: Request) -> Action | None:
    """A server (or proxy) that ignores ``Range`` and answers 200 with everything."""
    if any(h.lower() == "range" for h in req.headers):
        return Action("strip", headers=("Range",))
    return None


def deny_listing(prefix: str) -> Rule:
    """403 AccessDenied on every listing under ``prefix`` (a bucket policy
    that denies s3:ListBucket with that prefix); objects stay readable."""

    def rule(req: Request) -> Action | None:
        if req.op == "ListObjects" and any(prefix in p for p in req.query.get("prefix", [])):
            return Action("error", status=403, code="AccessDenied")
        return None

    return rule
