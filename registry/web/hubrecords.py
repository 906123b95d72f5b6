"""The trust records a ``registry serve`` relays to ``registry pull --from`` (issue 50).

| route | what the client uses it for |
|---|---|
| ``GET /api/registry/records/{key}`` | the store's bytes of one trust record |

``key`` is one of the keys :func:`registry.trust.relay.relayed` names (the
signed timestamp and snapshots, yank records, tombstones, revocations, a
model's policy.json); any other key is 404. The bytes are the store's, read
live (never cached: a record may change at any time) and capped at
:data:`registry.rules.limits.MAX_JSON_BYTES` like every document (a longer one is
refused by the app's error handler, nothing sent). The server holds no keys
for this and vouches for nothing: the puller checks the signed timestamp and
snapshot and every listed record against them (registry.trust.freshness).
Errors: 404 ``EntryNotFound`` for an absent or unrelayed key; a store outage
as registry.web.failure answers it.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from registry.rules import limits
from registry.errors import ObjectNotFoundError
from registry.trust.relay import relayed
from registry.web.hub import error_of
from registry.web.hubrefs import HubError

router = APIRouter(include_in_schema=False)


@router.get("/api/registry/records/{key:path}")
async def record(request: Request, key: str) -> Response:
    """The store's bytes of trust record ``key`` (the module docstring)."""
    store = request.app.state.hub.store
    canonical = relayed(key)
    try:
        if canonical is None:
            raise HubError(404, "EntryNotFound", f"{key!r}: not a trust record this "
                                                 "server relays")
        try:
            raw = await run_in_threadpool(store.read_bytes, canonical,
                                          limit=limits.MAX_JSON_BYTES)
        except (ObjectNotFoundError, FileNotFoundError):
            raise HubError(404, "EntryNotFound", f"{canonical}: no such record") from None
    except Exception as e:  # noqa: BLE001 -- answered as the Hub routes answer it
        return error_of(e, "GET")
    return Response(raw, media_type="application/json",
                    headers={"Cache-Control": "no-store"})


__all__ = ["router"]
