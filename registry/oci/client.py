"""A small OCI distribution client on ``http.client``: what push and pull need, no more.

Why not a library (docs/decisions.md, "Releases as OCI artifacts"): oras-py
streams a blob to its final file name without checking its digest, and cannot
upload from an iterator of store chunks; this client streams both ways, checks
digest and size of every blob as it reads, caps every document, and drops
credentials on a redirect to another origin.

Every answer is another party's: a blob is verified against its digest and
size as it streams (:class:`BlobStream`), a manifest is read up to
``limits.MAX_OCI_MANIFEST_BYTES`` and checked against the digest asked for.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

from registry.rules import limits, schemas
from registry.errors import (
    DocumentError,
    IntegrityError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    UsageError,
)
from registry.oci.auth import Credentials
from registry.oci.ref import OciRef

#: seconds to wait for a connection or an answer
TIMEOUT = 60.0
#: bytes per read of a blob stream
CHUNK = 1 << 20
_REDIRECTS = 5


class BlobStream:
    """A blob's bytes as they arrive, checked: more than ``size`` bytes, fewer,
    or another sha256 raise IntegrityError before the last chunk is handed
    out (whole-blob reads only; a range is checked for its length)."""

    def __init__(self, response: http.client.HTTPResponse, *, where: str, size: int,
                 sha256: str | None, conn: http.client.HTTPConnection | None = None) -> None:
        self._r = response
        self._conn = conn
        self._where = where
        self._size = size
        self._h = hashlib.sha256() if sha256 is not None else None
        self._want = sha256
        self._got = 0

    def __iter__(self) -> Iterator[bytes]:
        try:
            while True:
                block = self._r.read(min(CHUNK, self._size - self._got + 1))
                if not block:
                    break
                self._got += len(block)
                if self._got > self._size:
                    raise IntegrityError(self._where, expected_size=self._size,
                                         actual_size=self._got,
                                         reason=f"more than the {self._size} bytes its "
                                                "descriptor says")
                if self._h is not None:
                    self._h.update(block)
                if self._got == self._size:
                    self._check()
                yield block
            if self._got != self._size:
                raise IntegrityError(self._where, expected_size=self._size,
                                     actual_size=self._got,
                                     reason=f"truncated: {self._got} of {self._size} bytes")
            if self._size == 0:
                self._check()
        finally:
            self._r.close()
            if self._got != self._size and self._conn is not None:
                self._conn.close()  # bytes left unread on it: never reused

    def _check(self) -> None:
        if self._h is not None and self._h.hexdigest() != self._want:
            raise IntegrityError(self._where, expected_sha256=self._want,
                                 actual_sha256=self._h.hexdigest(), expected_size=self._size,
                                 actual_size=self._got)


class OciClient:
    """One repository of one OCI registry (``ref.host``/``ref.repo``).

    Args:
        ref: the reference (its host and repository are used).
        insecure: plain HTTP instead of HTTPS; refused for a host that is not
            loopback unless ``allow_insecure_remote``.
        credentials: what to answer a 401 with (registry.oci.auth).

    Raises (from its methods):
        ObjectNotFoundError: 404.
        StoragePermissionError: 401 or 403 after authenticating.
        StorageError: any other HTTP error, or the registry cannot be reached.
        IntegrityError: a blob or manifest differs from its digest or size.
        DocumentError: a manifest larger than the cap, or not JSON.
    """

    def __init__(self, ref: OciRef, *, insecure: bool = False,
                 allow_insecure_remote: bool = False,
                 credentials: Credentials | None = None) -> None:
        if insecure and not ref.loopback and not allow_insecure_remote:
            raise UsageError(f"--insecure: {ref.host} is not a loopback address; plain HTTP "
                             "to another host sends the model and any credentials in clear "
                             "(--allow-insecure-remote to force)")
        self.ref = ref
        self.base = f"{'http' if insecure else 'https'}://{ref.host}"
        self.credentials = credentials or Credentials()
        self._auth: str | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[http.client.HTTPConnection] = []
        weakref.finalize(self, _close_all, self._all)

    def close(self) -> None:
        """Close every connection (a later request opens new ones)."""
        _close_all(self._all)
        self._local = threading.local()

    def __enter__(self) -> OciClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP -----------------------------------------------------------------------

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        key = (parts.scheme, parts.netloc)
        conns: dict[tuple[str, str], http.client.HTTPConnection] = \
            self._local.__dict__.setdefault("conns", {})
        conn = conns.get(key)
        if conn is None:
            cls = http.client.HTTPSConnection if parts.scheme == "https" else \
                http.client.HTTPConnection
            conn = conns[key] = cls(parts.netloc, timeout=TIMEOUT)
            with self._lock:
                self._all.append(conn)
        return conn

    def _send(self, method: str, url: str, headers: dict[str, str],
              body: bytes | Iterable[bytes] | None) -> http.client.HTTPResponse:
        for attempt in (1, 2):
            conn = self._connection(url)
            parts = urlsplit(url)
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            try:
                conn.request(method, target, body=body, headers=headers)
                self._local.last = conn
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError,
                    ConnectionResetError) as e:
                conn.close()
                # a kept-alive connection the server closed: once more, on a new
                # one, when the body can be sent again
                if attempt == 2 or not (body is None or isinstance(body, bytes)):
                    raise StorageError(f"{url}: {e}", key=url) from None
            except OSError as e:
                conn.close()
                raise StorageError(f"{self.base}: the OCI registry cannot be reached ({e})",
                                   key=url) from None
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, headers: dict[str, str] | None = None,
                body: bytes | Iterable[bytes] | None = None,
                ok: tuple[int, ...] = (200,)) -> http.client.HTTPResponse:
        """Send ``method path`` (``/v2/...`` or an absolute URL of this
        registry); answers a 401 once, follows redirects of GET and HEAD
        (credentials only to this origin). Returns the open response, of a
        status in ``ok``; raises as the class says for any other."""
        url = urljoin(self.base, path)
        h = dict(headers or {})
        for _ in range(_REDIRECTS + 1):
            same = _origin(url) == _origin(self.base)
            if same and self._auth:
                h["Authorization"] = self._auth
            else:
                h.pop("Authorization", None)
            r = self._send(method, url, h, body)
            if r.status == 401 and same and self._answer(r, url):
                if _is_stream(body):  # sent already: cannot be sent again
                    raise StoragePermissionError(f"{method} {url}: HTTP 401 mid-upload",
                                                 key=url)
                h["Authorization"] = self._auth or ""
                r = self._send(method, url, h, body)
            if r.status in (301, 302, 303, 307, 308) and method in ("GET", "HEAD"):
                location = r.getheader("Location") or ""
                r.read()
                url = urljoin(url, location)
                if urlsplit(url).scheme not in ("http", "https"):
                    raise StorageError(f"{self.base}: redirected to {location!r}", key=url)
                continue
            if r.status in ok:
                return r
            raise self._error(r, method, url)
        raise StorageError(f"{url}: more than {_REDIRECTS} redirects", key=url)

    def _answer(self, r: http.client.HTTPResponse, url: str) -> bool:
        """Take a 401's challenge: Basic (the credentials) or Bearer (a token
        from its realm). False when there is nothing new to answer with."""
        challenge = r.getheader("WWW-Authenticate") or ""
        r.read()
        scheme, params = _parse_challenge(challenge)
        old = self._auth
        if scheme == "basic":
            basic = self.credentials.basic(self.ref.host)
            if basic is None:
                return False
            self._auth = f"Basic {basic}"
        elif scheme == "bearer" and params.get("realm"):
            self._auth = f"Bearer {self._token(params)}"
        else:
            return False
        return self._auth != old

    def _token(self, params: dict[str, str]) -> str:
        realm = params["realm"]
        if urlsplit(realm).scheme != "https" and not self.base.startswith("http://"):
            raise StorageError(f"{self.base}: token realm {realm!r} is not HTTPS", key=realm)
        query = {k: v for k, v in params.items() if k in ("service", "scope")}
        url = realm + ("&" if "?" in realm else "?") + urlencode(query)
        h = {}
        basic = self.credentials.basic(self.ref.host)
        if basic is not None:
            h["Authorization"] = f"Basic {basic}"
        r = self._send("GET", url, h, None)
        data = limits.read_at_most(r, limits.MAX_POINTER_BYTES)
        if r.status != 200:
            raise StoragePermissionError(f"{realm}: token refused (HTTP {r.status})", key=realm)
        doc = schemas.load_json(data, path=realm)
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str):
            raise StoragePermissionError(f"{realm}: answered without a token", key=realm)
        return token

    def _error(self, r: http.client.HTTPResponse, method: str, url: str) -> StorageError:
        data = limits.read_at_most(r, 64 << 10)
        r.close()
        last = self._local.__dict__.get("last")
        if last is not None:
            last.close()  # a longer error body would be read as the next answer
        why = r.reason
        try:
            errors = json.loads(data).get("errors") or []
            if errors:
                why = f"{errors[0].get('code')}: {errors[0].get('message')}"
        except (ValueError, AttributeError):
            pass
        what = f"{method} {url}: HTTP {r.status} {why}"
        if r.status == 404:
            return ObjectNotFoundError(what, key=url)
        if r.status in (401, 403):
            return StoragePermissionError(what, key=url)
        return StorageError(what, key=url)

    def _path(self, kind: str, reference: str) -> str:
        return f"/v2/{self.ref.repo}/{kind}/{reference}"

    # -- manifests ------------------------------------------------------------------

    def get_manifest(self, reference: str, *, accept: Iterable[str]) -> tuple[bytes, str, str]:
        """A manifest or index by tag or digest: (bytes, media type, sha256 hex).

        Raises:
            DocumentError: larger than ``limits.MAX_OCI_MANIFEST_BYTES``.
            IntegrityError: fetched by digest and the bytes hash otherwise.
        """
        where = f"{self.ref.host}/{self.ref.repo}@{reference}"
        r = self.request("GET", self._path("manifests", reference),
                         headers={"Accept": ", ".join(accept)})
        cap = limits.MAX_OCI_MANIFEST_BYTES
        length = r.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > cap:
            r.close()
            raise DocumentError(where, f"manifest of {length} bytes: larger than "
                                       f"{cap} bytes (REGISTRY_MAX_OCI_MANIFEST_BYTES)")
        data = limits.read_at_most(r, cap)
        r.close()
        if len(data) > cap:
            raise DocumentError(where, f"manifest larger than {cap} bytes "
                                       "(REGISTRY_MAX_OCI_MANIFEST_BYTES)")
        digest = hashlib.sha256(data).hexdigest()
        if reference.startswith("sha256:") and reference != f"sha256:{digest}":
            raise IntegrityError(where, expected_sha256=reference[7:], actual_sha256=digest,
                                 reason=f"the registry answered a manifest of sha256 {digest}")
        media = (r.getheader("Content-Type") or "").split(";")[0].strip()
        return data, media, digest

    def put_manifest(self, reference: str, data: bytes, media_type: str) -> str | None:
        """PUT a manifest under a tag or its digest; returns the registry's
        ``OCI-Subject`` header (set by one that indexes referrers), else None.

        Raises:
            IntegrityError: the registry says it stored another digest.
        """
        r = self.request("PUT", self._path("manifests", reference), body=data,
                         headers={"Content-Type": media_type,
                                  "Content-Length": str(len(data))}, ok=(201, 200))
        r.read()
        said = r.getheader("Docker-Content-Digest")
        mine = "sha256:" + hashlib.sha256(data).hexdigest()
        if said and said != mine:
            raise IntegrityError(f"{self.ref.host}/{self.ref.repo}:{reference}",
                                 reason=f"the registry stored {said}, sent {mine}")
        return r.getheader("OCI-Subject")

    def referrers(self, digest: str) -> list[dict[str, Any]]:
        """Descriptors of the manifests whose subject is ``digest``: the
        referrers API, else (a registry without it answers 404, 400, 405 or
        501) the ``sha256-<hex>`` tag's index, else [].

        Raises:
            DocumentError: an answer over ``limits.MAX_OCI_MANIFEST_BYTES`` or
                not an image index.
        """
        from registry.oci.mapping import OCI_INDEX, fallback_tag, parse_index

        path = self._path("referrers", digest)
        cap = limits.MAX_OCI_MANIFEST_BYTES
        r = self.request("GET", path, headers={"Accept": OCI_INDEX},
                         ok=(200, 400, 404, 405, 501))
        data = limits.read_at_most(r, cap)
        r.close()
        if r.status == 200:
            if len(data) > cap:
                raise DocumentError(path, f"larger than {cap} bytes "
                                          "(REGISTRY_MAX_OCI_MANIFEST_BYTES)")
            return parse_index(data, where=f"{self.ref.host}{path}")
        if len(data) >= cap:
            self._local.last.close()  # an error body left unread: never reused
        tag = fallback_tag(digest)
        try:
            data, _, _ = self.get_manifest(tag, accept=[OCI_INDEX])
        except ObjectNotFoundError:
            return []
        return parse_index(data, where=f"{self.ref.host}/{self.ref.repo}:{tag}")

    def tags(self) -> list[str]:
        """The repository's tags (``tags/list``, one page)."""
        r = self.request("GET", f"/v2/{self.ref.repo}/tags/list")
        doc = schemas.load_json(limits.read_at_most(r, limits.MAX_OCI_MANIFEST_BYTES),
                                path=f"{self.ref.repo}/tags/list")
        r.close()
        return [str(t) for t in (doc.get("tags") or [])] if isinstance(doc, dict) else []

    # -- blobs ----------------------------------------------------------------------

    def blob_size(self, sha256: str) -> int | None:
        """The size the registry holds of blob ``sha256`` (hex), None when absent."""
        try:
            r = self.request("HEAD", self._path("blobs", f"sha256:{sha256}"))
        except ObjectNotFoundError:
            return None
        r.read()
        length = r.getheader("Content-Length")
        return int(length) if length and length.isdigit() else None

    def blob(self, sha256: str, size: int, *, start: int = 0,
             end: int | None = None) -> BlobStream:
        """Blob ``sha256`` (hex) of ``size`` bytes, checked as it streams
        (a range ``[start, end)``: its length only)."""
        where = f"{self.ref.host}/{self.ref.repo}@sha256:{sha256}"
        whole = start == 0 and (end is None or end >= size)
        headers = {} if whole else {"Range": f"bytes={start}-{(end or size) - 1}"}
        r = self.request("GET", self._path("blobs", f"sha256:{sha256}"), headers=headers,
                         ok=(200,) if whole else (206,))
        return BlobStream(r, where=where, size=size if whole else (end or size) - start,
                          sha256=sha256 if whole else None,
                          conn=self._local.__dict__.get("last"))

    def read_blob(self, sha256: str, size: int, *, cap: int) -> bytes:
        """A small blob whole, checked; refused unread above ``cap`` bytes.

        Raises:
            DocumentError: ``size`` above ``cap``.
        """
        if size > cap:
            raise DocumentError(f"{self.ref.host}/{self.ref.repo}@sha256:{sha256}",
                                f"{size} bytes: larger than {cap}")
        return b"".join(self.blob(sha256, size))

    def push_blob(self, sha256: str, size: int, chunks: Callable[[], Iterator[bytes]], *,
                  mount_from: str | None = None, chunk_size: int | None = None) -> str:
        """Make blob ``sha256`` (hex, ``size`` bytes) present: ``"present"``
        when the registry has it, ``"mounted"`` when mounted from repository
        ``mount_from`` of the same registry, else ``"uploaded"`` from
        ``chunks()`` (one streaming PUT, or PATCHes of ``chunk_size`` bytes).

        Raises:
            IntegrityError: the registry's digest check refused the bytes
                (``chunks`` gave other bytes than ``sha256``).
        """
        digest = f"sha256:{sha256}"
        if self.blob_size(sha256) == size:
            return "present"
        query = {"mount": digest, "from": mount_from} if mount_from else {}
        r = self.request("POST", f"/v2/{self.ref.repo}/blobs/uploads/"
                         + (f"?{urlencode(query)}" if query else ""),
                         headers={"Content-Length": "0"}, body=b"", ok=(201, 202))
        r.read()
        if r.status == 201:
            return "mounted"
        location = urljoin(self.base, r.getheader("Location") or "")
        if chunk_size and size > chunk_size:
            stream = _Rechunk(chunks())
            sent = 0
            while sent < size:
                n = min(chunk_size, size - sent)
                r = self.request("PATCH", location, body=stream.take(n),
                                 headers={"Content-Type": "application/octet-stream",
                                          "Content-Length": str(n),
                                          "Content-Range": f"{sent}-{sent + n - 1}"},
                                 ok=(202,))
                r.read()
                location = urljoin(self.base, r.getheader("Location") or location)
                sent += n
            body: bytes | Iterable[bytes] = b""
            length = 0
        else:
            body, length = chunks(), size
        sep = "&" if "?" in location else "?"
        try:
            r = self.request("PUT", f"{location}{sep}{urlencode({'digest': digest})}",
                             body=body, headers={"Content-Type": "application/octet-stream",
                                                 "Content-Length": str(length)}, ok=(201,))
        except StorageError as e:
            if "DIGEST_INVALID" in str(e) or "SIZE_INVALID" in str(e):
                raise IntegrityError(f"{self.ref.repo}@{digest}",
                                     reason=f"the registry refused the bytes: {e}") from None
            raise
        r.read()
        return "uploaded"


class _Rechunk:
    """An iterator of chunks cut into consecutive runs of ``n`` bytes."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._rest = b""

    def take(self, n: int) -> Iterator[bytes]:
        while n > 0:
            block = self._rest or next(self._it, b"")
            self._rest = b""
            if not block:
                return
            if len(block) > n:
                block, self._rest = block[:n], block[n:]
            n -= len(block)
            yield block


def _close_all(conns: list[http.client.HTTPConnection]) -> None:
    for conn in list(conns):
        conn.close()
    conns.clear()


def _is_stream(body: object) -> bool:
    return body is not None and not isinstance(body, bytes)


def _origin(url: str) -> tuple[str, str]:
    p = urlsplit(url)
    return p.scheme, p.netloc.lower()


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    for m in re.finditer(r'([A-Za-z]+)="([^"]*)"', rest):
        params[m.group(1).lower()] = m.group(2)
    return scheme.lower(), params
