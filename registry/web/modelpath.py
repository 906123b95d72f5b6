"""Namespaced model ids in the URL paths of the pages and the JSON API (issue 44 item 4).

A model id ``<org>/<name>`` is one path segment there, its ``/`` sent as
``%2F``: ``/models/acme%2Ftiny/1``, ``/api/v1/releases/acme%2Ftiny/prod``.
The segment after it is always a version, an alias or a fixed word, never the
id's second half, so ``/models/acme/tiny`` keeps meaning release ``tiny`` of
the model ``acme``. (The Hub and OCI routes take ``<org>/<name>`` as two
segments, as a Hub client sends it: registry.web.hubrefs.)

The server's path guard (registry.web.app) refuses every encoded ``/``
except this one: :func:`route_path` recognises it (a model-id segment of
``/models/``, ``/api/v1/models/`` or ``/api/v1/releases/`` that is exactly
``<name>%2F<name>``) and routes it as the one segment ``<org>%2F<name>``,
which :func:`model_param` turns back into the id. A literal ``%2F`` can never
reach a handler any other way: the guard refuses ``%252F``.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

from registry.rules.names import check_model_id

#: how a namespaced id's ``/`` travels inside one path segment
ENCODED_SLASH = "%2F"
_NAME = rb"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_ID_SEGMENT = re.compile(rb"(/(?:api/v1/)?(?:models|releases)/)(" + _NAME + rb")%2[fF]("
                         + _NAME + rb")(?=/|$)")


def route_path(raw_path: bytes) -> tuple[bytes, str] | None:
    """``(checked, routed)`` for an undecoded request path whose model-id
    segment is ``<org>%2F<name>`` (None for any other path): ``checked`` is
    the raw path with that ``%2F`` written as ``/`` (for the guard's other
    checks), ``routed`` the decoded path to route, the segment kept as
    ``<org>%2F<name>``."""
    m = _ID_SEGMENT.match(raw_path)
    if m is None:
        return None
    checked = raw_path[:m.start(3) - 3] + b"/" + raw_path[m.start(3):]
    routed = (m.group(1).decode() + m.group(2).decode() + ENCODED_SLASH + m.group(3).decode()
              + unquote(raw_path[m.end():].decode("latin-1")))
    return checked, routed


def model_param(value: str) -> str:
    """The model id a path parameter names (``acme%2Ftiny``: ``acme/tiny``).

    Raises:
        InvalidNameError: it is no model id (registry.rules.names.check_model_id).
    """
    return check_model_id(value.replace(ENCODED_SLASH, "/"))


def model_segment(model_id: str) -> str:
    """``model_id`` as one URL path segment (``acme/tiny``: ``acme%2Ftiny``);
    the pages' ``idpath`` filter."""
    return quote(model_id, safe="")


__all__ = ["ENCODED_SLASH", "model_param", "model_segment", "route_path"]
