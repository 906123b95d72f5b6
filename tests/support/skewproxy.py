"""Fault-proxy rules for many-hosts faults (issue 31): ETags that are not an
MD5, a server whose clock is off, and a listing that lags the objects.

Each is a callable rule for :class:`tests.support.faultproxy.FaultProxy`
(``proxy.rules.append(rule)``) answering ``Action("edit", ...)``.
"""

from __future__ import annotations

import hashlib
import html
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime, parsedate_to_datetime

from tests.support.faultproxy import Action, Request

Headers = list[tuple[str, str]]


class OpaqueETags:
    """A server whose ETags are not the MD5 of the body (SSE-KMS, many
    S3-compatible servers): every ETag the client sees is replaced by an
    opaque one (still 32 hex digits, plus the part count of a multipart
    object), and mapped back wherever the client sends one (``If-Match``,
    a CompleteMultipartUpload's part list).

    ``drop``: a predicate on requests; the first request it matches of each
    key and condition is carried out and its answer lost (the client retries).
    """

    def __init__(self, drop: Callable[[Request], bool] | None = None) -> None:
        self._real: dict[str, str] = {}
        self._lock = threading.Lock()
        self._drop = drop
        self.dropped: list[str] = []
        self._seen: set[tuple[str, str, str]] = set()

    def fake(self, real: str) -> str:
        inner = real.strip('"')
        digest, dash, parts = inner.partition("-")
        fake = hashlib.sha256(b"kms" + digest.encode()).hexdigest()[:32] + dash + parts
        with self._lock:
            self._real[fake] = inner
        return f'"{fake}"'

    def real(self, fake: str) -> str:
        with self._lock:
            return f'"{self._real.get(fake.strip(chr(34)), fake.strip(chr(34)))}"'

    def _request(self, headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        out = {k: (self.real(v) if k.lower() == "if-match" else v) for k, v in headers.items()}
        if b"<ETag>" in body:
            body = re.sub(rb"<ETag>(.*?)</ETag>", lambda m: b"<ETag>" + html.escape(self.real(
                html.unescape(m.group(1).decode()))).encode() + b"</ETag>", body)
        return out, body

    def _response(self, req: Request, status: int, headers: Headers,
                  body: bytes) -> tuple[int, Headers, bytes]:
        headers = [(k, self.fake(v) if k.lower() == "etag" else v) for k, v in headers]
        if b"<ETag>" in body:
            body = re.sub(rb"<ETag>(.*?)</ETag>", lambda m: b"<ETag>" + html.escape(self.fake(
                html.unescape(m.group(1).decode()))).encode() + b"</ETag>", body)
        return status, headers, body

    def __call__(self, req: Request) -> Action | None:
        drop = False
        lowered = {k.lower(): v for k, v in req.headers.items()}
        which = (req.key, lowered.get("if-match", ""), lowered.get("if-none-match", ""))
        if self._drop is not None and self._drop(req) and which not in self._seen:
            self._seen.add(which)
            self.dropped.append(req.key)
            drop = True
        return Action("edit", edit_request=self._request, edit_response=self._response,
                      drop_answer=drop)


class ServerClock:
    """A server whose clock is ``offset`` seconds off (positive: ahead):
    ``Last-Modified``, ``Date`` and every ``<LastModified>``/``<Initiated>``
    of a listing are shifted."""

    def __init__(self, offset: float) -> None:
        self.offset = timedelta(seconds=offset)

    def _xml(self, m: re.Match[bytes]) -> bytes:
        tag, text = m.group(1), m.group(2).decode()
        t = datetime.fromisoformat(text.replace("Z", "+00:00")) + self.offset
        stamp = t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return b"<" + tag + b">" + stamp.encode() + b"</" + tag + b">"

    def _response(self, req: Request, status: int, headers: Headers,
                  body: bytes) -> tuple[int, Headers, bytes]:
        out = []
        for k, v in headers:
            if k.lower() in ("last-modified", "date"):
                v = format_datetime(parsedate_to_datetime(v) + self.offset, usegmt=True)
            out.append((k, v))
        body = re.sub(rb"<(LastModified|Initiated)>([^<]+)</\1>", self._xml, body)
        return status, out, body

    def __call__(self, req: Request) -> Action | None:
        return Action("edit", edit_response=self._response)


class LaggingListing:
    """A listing that lags the objects (GCS, Swift, RGW, a cache in front of
    S3): while ``recording``, every listing answer is remembered; once
    :meth:`freeze` is called, a listing asked before is answered from that
    old view, while GET and HEAD of objects stay fresh."""

    def __init__(self) -> None:
        self.frozen = False
        self._seen: dict[tuple[str, ...], tuple[int, Headers, bytes]] = {}

    def freeze(self) -> None:
        self.frozen = True

    @staticmethod
    def _key(req: Request) -> tuple[str, ...]:
        return (req.bucket, req.key, *sorted(f"{k}={v}" for k, v in req.query.items()))

    def _response(self, req: Request, status: int, headers: Headers,
                  body: bytes) -> tuple[int, Headers, bytes]:
        key = self._key(req)
        if self.frozen and key in self._seen:
            return self._seen[key]
        if not self.frozen:
            self._seen[key] = (status, headers, body)
        return status, headers, body

    def __call__(self, req: Request) -> Action | None:
        if req.op != "ListObjects":
            return None
        return Action("edit", edit_response=self._response)


