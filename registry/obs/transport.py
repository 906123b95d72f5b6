"""The OTLP/HTTP exporter's transport: one persistent ``http.client`` connection.

The SDK's exporter (registry.obs.otlp) keeps what it decides from the
``OTEL_EXPORTER_OTLP_*`` variables: the endpoint, headers, timeout,
compression, certificates and its retries (a connection error is retried
at once, 429/502/503/504 with backoff). Only the transport under it is
replaced: the SDK's default is a ``requests`` session, whose per-request
work (a ``PreparedRequest``, the merge of the session's settings, reading
the proxy variables, cookie jars, adapters) cost about 30 us of CPU per
export on the benchmark machine, on the export thread but out of the
same cores as the requests (issue 48 item 8). This one keeps one
connection per endpoint and sends each batch as one ``POST`` on it.

HTTPS: the server's certificate is verified against the system's CAs or
``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE`` (``verify``), with the client
certificate and key of mTLS when given (``cert``), as the SDK's transports do.

Proxies: the standard variables are read once, when the exporter is built
(``urllib.request.getproxies``: ``HTTPS_PROXY``, ``HTTP_PROXY``,
``ALL_PROXY``, ``NO_PROXY``, the lower-case names too), as ``requests``
reads them. An ``https`` endpoint behind a proxy is reached through a
``CONNECT`` tunnel (TLS end to end, the proxy's ``user:password`` sent as
``Proxy-Authorization``), an ``http`` one by sending the absolute URL to
the proxy. Not supported (the SDK's ``requests`` transport is kept
instead): an ``https://`` proxy URL (TLS to the proxy itself) and the
SDK's credential-provider session variable.

May import: nothing of the package.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass(frozen=True)
class Result:
    """The SDK's ``BaseHTTPResult``: a status and reason, or the error."""

    status_code: int | None = None
    reason: str | None = None
    error: Exception | None = None
    body: bytes = b""
    _headers: dict[str, str] = field(default_factory=dict)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        return self._headers  # names lower-cased: the SDK asks for "retry-after"

    def text(self) -> str:
        return self.body.decode("utf-8")


def proxy_for(url: str) -> str | None:
    """The proxy URL the standard variables give for ``url`` (None: direct)."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


def supported(url: str) -> bool:
    """Whether this transport can reach ``url`` as ``requests`` would."""
    if os.environ.get("_OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER") or \
            os.environ.get("_OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER"):
        return False
    proxy = proxy_for(url)
    return urlsplit(url).scheme in ("http", "https") and (
        proxy is None or urlsplit(proxy).scheme in ("http", ""))


class Transport:
    """The SDK's ``BaseHTTPTransport`` over one kept ``http.client`` connection
    (the module docstring). Thread-safe: one request at a time."""

    def __init__(self, *, verify: bool | str = True,
                 cert: str | tuple[str, str] | None = None) -> None:
        self._verify, self._cert = verify, cert
        self._conn: http.client.HTTPConnection | None = None
        self._target: tuple[str, str | None] | None = None
        self._auth: dict[str, str] = {}
        self._lock = threading.Lock()

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(
            cafile=self._verify if isinstance(self._verify, str) else None)
        if self._verify is False:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if isinstance(self._cert, tuple):
            ctx.load_cert_chain(self._cert[0], self._cert[1])
        elif self._cert:
            ctx.load_cert_chain(self._cert)
        return ctx

    def _connect(self, url: str, timeout: float | None) -> tuple[http.client.HTTPConnection, str]:
        """The kept connection for ``url`` (made when there is none) and the
        request target to send on it."""
        parts = urlsplit(url)
        proxy = proxy_for(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        if self._conn is None or self._target != (url, proxy):
            self.close()
            host, port = parts.hostname or "", parts.port
            if proxy is None:
                conn: http.client.HTTPConnection = (
                    http.client.HTTPSConnection(host, port, timeout=timeout,
                                                context=self._context())
                    if parts.scheme == "https" else
                    http.client.HTTPConnection(host, port, timeout=timeout))
            else:
                p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
                auth = {}
                if p.username:
                    token = f"{unquote(p.username)}:{unquote(p.password or '')}"
                    auth["Proxy-Authorization"] = "Basic " + base64.b64encode(
                        token.encode()).decode()
                if parts.scheme == "https":
                    conn = http.client.HTTPSConnection(p.hostname or "", p.port or 80,
                                                       timeout=timeout, context=self._context())
                    conn.set_tunnel(host, port or 443, headers=auth)
                else:
                    conn = http.client.HTTPConnection(p.hostname or "", p.port or 80,
                                                      timeout=timeout)
            self._conn, self._target, self._auth = conn, (url, proxy), (
                auth if proxy is not None and parts.scheme == "http" else {})
        if proxy is not None and parts.scheme == "http":
            path = url  # an http proxy takes the absolute URL
        self._conn.timeout = timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(timeout)
        return self._conn, path

    def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                timeout: float | None = None, data: bytes | None = None) -> Any:
        """Send one request on the kept connection; a failure closes it (the
        SDK's client retries a connection error once at once, on a new one)."""
        with self._lock:
            try:
                conn, target = self._connect(url, timeout)
                conn.request(method, target, body=data,
                             headers={**(headers or {}), **self._auth})
                resp = conn.getresponse()
                body = resp.read()
                result = Result(resp.status, resp.reason, None, body,
                                {k.lower(): v for k, v in resp.getheaders()})
                if resp.will_close:
                    self.close()
                return result
            except Exception as error:  # noqa: BLE001 - the SDK's result carries it
                self.close()
                return Result(error=error)

    def is_connection_error(self, exception: Exception | None) -> bool:
        """A refused, reset, timed-out or dropped connection, or a TLS failure."""
        return isinstance(exception, (OSError, http.client.HTTPException))

    def close(self) -> None:
        conn, self._conn, self._target = self._conn, None, None
        if conn is not None:
            conn.close()


def transport_for(url: str) -> Transport | None:
    """A :class:`Transport` for the endpoint ``url`` with the certificates the
    SDK would use (its ``_build_transport`` rules), or None where
    :func:`supported` says no (the SDK's own transport is used)."""
    if not supported(url):
        return None
    env = os.environ.get
    verify: bool | str = (env("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
                          or env("OTEL_EXPORTER_OTLP_CERTIFICATE") or True)
    key = env("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY") or env("OTEL_EXPORTER_OTLP_CLIENT_KEY")
    crt = (env("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE")
           or env("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"))
    cert = (crt, key) if crt and key else crt
    return Transport(verify=verify, cert=cert)
