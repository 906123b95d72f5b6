"""Which trust records a mirror relays, and where (issue 50: a mirror's answer is a hint).

A ``registry serve`` answers ``GET /api/registry/records/{key}`` with the
store's bytes of a trust record, read-only and capped at
:data:`registry.rules.limits.MAX_JSON_BYTES` like every other document
(registry.web.hubrecords), and ``registry pull --from`` reads them there
(registry.pull.mirror_store). The mirror needs no keys: the puller checks
what it gets through :func:`registry.trust.release.open_release` (the signed
timestamp and snapshot, then every listed record against them), so a mirror
that drops or alters a record is refused like a store writer who did.

Relayed keys, exactly (each name checked by :func:`registry.rules.names.check_name`,
so no other object of the store is reachable):

* ``ledger/snapshots/<m>/timestamp.json``, ``ledger/snapshots/<m>/<n>.snapshot.json``
* ``ledger/yanks/<m>/<v>.json``, ``ledger/tombstones/<m>/<v>.json``
* ``ledger/revocations/<source>.json``
* ``models/<m>/policy.json`` (the model's key list)
"""

from __future__ import annotations

from registry.errors import RegistryError
from registry.rules.names import model_from_key
from registry.protocol.layout import (
    policy_key,
    revocation_key,
    snapshot_key,
    timestamp_key,
    tombstone_key,
    yank_key,
)

#: the route prefix a mirror serves relayed records under
ROUTE = "/api/registry/records/"


def relayed(key: str) -> str | None:
    """``key`` when it is a trust record a mirror relays (the module
    docstring), rebuilt from its checked names; None for any other key."""
    parts = key.split("/")
    try:
        if len(parts) == 3 and parts[0] == "models" and parts[2] == "policy.json":
            out = policy_key(model_from_key(parts[1]))
        elif len(parts) == 3 and parts[:2] == ["ledger", "revocations"] \
                and parts[2].endswith(".json"):
            out = revocation_key(parts[2][:-5])
        elif len(parts) == 4 and parts[0] == "ledger" and parts[3].endswith(".json"):
            kind, model, name = parts[1], model_from_key(parts[2]), parts[3]
            if kind == "snapshots" and name == "timestamp.json":
                out = timestamp_key(model)
            elif kind == "snapshots" and name.endswith(".snapshot.json"):
                head = name[:-len(".snapshot.json")]
                if not (head.isdigit() and 0 < len(head) < 12 and int(head) > 0):
                    return None
                out = snapshot_key(model, int(head))
            elif kind == "yanks":
                out = yank_key(model, name[:-5])
            elif kind == "tombstones":
                out = tombstone_key(model, name[:-5])
            else:
                return None
        else:
            return None
    except (RegistryError, ValueError):
        return None
    return out if out == key else None


__all__ = ["ROUTE", "relayed"]
