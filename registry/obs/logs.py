"""Log lines as JSON objects (``registry --log-format json``), one per line on stderr.

``REGISTRY_LOG_FORMAT`` (``text``, the default, or ``json``) is the switch;
``registry --log-format`` sets it for the command. In JSON mode an error is
the ``--json`` error document (class, exit code, message, path) on one line,
with ``ts`` and ``level`` added; ``registry serve`` also writes one object per
request (:func:`request_line`): method, the path without its query string,
route class, status, bytes, seconds and the trace id when tracing is on.
Header values, query strings and URL credentials are never written: a token
sent as ``?token=`` or in ``Authorization`` cannot reach a log.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

ENV = "REGISTRY_LOG_FORMAT"
FORMATS = ("text", "json")


def log_format() -> str:
    """``json`` or ``text`` (anything else in the variable reads as text)."""
    return "json" if os.environ.get(ENV, "").strip().lower() == "json" else "text"


def json_logs() -> bool:
    return log_format() == "json"


def line(level: str, event: str, **fields: Any) -> str:
    """One JSON object: ``ts`` (RFC 3339, UTC, milliseconds), ``level``,
    ``event`` and ``fields``, every URL credential redacted."""
    from registry.redact import redact

    ts = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
    doc = {"ts": ts.replace("+00:00", "Z"), "level": level, "event": event, **fields}
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
