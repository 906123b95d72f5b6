"""What ``registry serve`` answers to, and the headers on every answer.

A web page in the operator's browser is an attacker here: through DNS
rebinding (``evil.example`` resolving to 127.0.0.1) it can make the browser
send requests to the loopback server with ``Host: evil.example`` and read the
answers, since they are same-origin for that page. So the server answers only
requests whose ``Host`` names it (:func:`allowed_hosts`); any other gets 421
Misdirected Request (RFC 9110, section 15.5.20) before any route or token
check runs. A request without a Host header (HTTP/1.0) gets 400.

Every response carries a Content-Security-Policy without inline or remote
script (the pages have no script at all; styles come from
``/static/registry.css``), ``frame-ancestors 'none'`` (no framing, so no
clickjacking), ``X-Content-Type-Options: nosniff`` (a store document served as
JSON or text is never sniffed into HTML) and ``Referrer-Policy: no-referrer``
(store paths in URLs do not leak to links).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

#: the Content-Security-Policy of every response
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _norm(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def allowed_hosts(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names (no port) a server bound to ``bind`` answers to: the
    bind address itself, ``localhost`` and the loopback addresses, each of
    ``extra`` (``--allowed-host``), and for a wildcard bind (``0.0.0.0``,
    ``::``) this machine's host name and fully qualified name too.

    Raises:
        ValueError: an ``extra`` name is empty or holds a port, a path or a space.
    """
    names = {_norm(bind), *LOOPBACK_NAMES}
    for name in extra:
        n = _norm(name)
        if not n or any(c in n for c in "/ @?#") or (":" in n and not _is_ip(n)):
            raise ValueError(f"--allowed-host {name!r}: give a host name or address, "
                             "without scheme, port or path")
        names.add(n)
    if _is_ip(_norm(bind)) and ipaddress.ip_address(_norm(bind)).is_unspecified:
        names.update(_norm(n) for n in (socket.gethostname(), socket.getfqdn()) if n)
    return frozenset(names)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_of(header: str) -> str:
    """The host name of a ``Host`` header value (``name``, ``name:port``,
    ``[v6]:port``), lower case, without its port."""
    h = header.strip()
    if h.startswith("["):
        return _norm(h[1:].partition("]")[0])
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return _norm(h)


def refuse_host(header: str | None, allowed: frozenset[str]) -> tuple[int, str] | None:
    """(HTTP status, why) when a request with ``Host: header`` must be
    refused, else None."""
    if not header:
        return 400, "the request has no Host header"
    if host_of(header) not in allowed:
        return 421, (f"Host {header[:100]!r} is not a name of this server (DNS rebinding "
                     "is refused; add a name with registry serve --allowed-host)")
    return None
