"""Log lines as JSON objects (``registry --log-format json``), one per line on stderr.

``REGISTRY_LOG_FORMAT`` (``text``, the default, or ``json``) is the switch;
``registry --log-format`` sets it for the command. In JSON mode an error is
the ``--json`` error document (class, exit code, message, path) on one line,
with ``ts`` and ``level`` added; ``registry serve`` also writes one object per
request (:func:`request_line`): method, the path without its query string,
route class, status, bytes, seconds and the trace id when tracing is on. In
text mode ``registry serve --request-log`` writes the same fields as one
``key=value`` line per request (:func:`request_text`).
Header values, query strings and URL credentials are never written: a token
sent as ``?token=``, in ``Authorization`` or in a cookie cannot reach a log.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import urllib.parse
from typing import Any

ENV = "REGISTRY_LOG_FORMAT"
FORMATS = ("text", "json")


def log_format() -> str:
    """``json`` or ``text`` (anything else in the variable reads as text)."""
    return "json" if os.environ.get(ENV, "").strip().lower() == "json" else "text"


def json_logs() -> bool:
    return log_format() == "json"


def _now() -> str:
    """RFC 3339, UTC, milliseconds: ``2026-12-03T12:00:00.000Z``."""
    ts = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
    return ts.replace("+00:00", "Z")


def line(level: str, event: str, **fields: Any) -> str:
    """One JSON object: ``ts`` (RFC 3339, UTC, milliseconds), ``level``,
    ``event`` and ``fields``, every URL credential redacted."""
    from registry.host.redact import redact

    doc = {"ts": _now(), "level": level, "event": event, **fields}
    return redact(json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False))


def emit(level: str, event: str, **fields: Any) -> None:
    """Write :func:`line` to stderr."""
    sys.stderr.write(line(level, event, **fields) + "\n")
    sys.stderr.flush()


def request_line(method: str, path: str, route: str, status: int, sent: int,
                 seconds: float, trace_id: str | None = None) -> str:
    """The log object of one served request (no query string, no headers)."""
    return line("error" if status >= 500 else "info", "request", method=method,
                path=path.partition("?")[0][:2048], route=route, status=status,
                bytes=sent, seconds=round(seconds, 6), trace_id=trace_id)


#: characters a logged path keeps as they are; anything else (spaces, control
#: characters such as a decoded ``%0A``, non-ASCII) is percent-encoded, so a
#: request cannot forge a second log line or break the fields apart
_PATH_SAFE = "/:@!$&'()*+,;-._~"


def request_text(method: str, path: str, route: str, status: int, sent: int,
                 seconds: float, trace_id: str | None = None) -> str:
    """The text log line of one served request, the fields of
    :func:`request_line` as ``key=value`` after a timestamp:

    ``2026-12-03T12:00:00.000Z request method=GET path=/api/v1/models route=api
    status=200 bytes=5120 seconds=0.0123``

    No query string, no header value; the path percent-encoded past
    :data:`_PATH_SAFE` and URL credentials redacted."""
    from registry.host.redact import redact

    shown = urllib.parse.quote(path.partition("?")[0][:2048], safe=_PATH_SAFE)
    text = (f"{_now()} request method={method} path={shown} route={route} status={status} "
            f"bytes={sent} seconds={seconds:.6f}")
    if trace_id is not None:
        text += f" trace_id={trace_id}"
    return redact(text)
