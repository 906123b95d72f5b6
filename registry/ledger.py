"""The live ledger: revocations of data sources, stored under ``ledger/`` in the store.

A revocation is an immutable fact written with a conditional create, so it is
in the store before any index hears of it, and ``registry index rebuild``
loses nothing::

    ledger/revocations/<source_id>.json   {"source_id", "revoked_at", "revocation_reason"}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry import numbers
from registry import schemas
from registry.errors import ObjectExistsError, UsageError
from registry.layout import REVOCATIONS, revocation_key
from registry.manifest import utc_now
from registry.names import check_name
from registry.store import Store, join

PREFIX = REVOCATIONS


@dataclass(frozen=True, slots=True)
class Revocation:
    source_id: str
    revoked_at: str
    revocation_reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"source_id": self.source_id, "revoked_at": self.revoked_at,
                "revocation_reason": self.revocation_reason}


def revoke(store: Store, source_id: str, reason: str) -> tuple[Revocation, bool]:
    """Record that ``source_id`` is revoked; returns ``(revocation, created)``.

    Revoking an already revoked source keeps the first revocation (its time and
    reason) and returns ``created=False``.

    Raises:
        InvalidNameError: ``source_id`` breaks the naming rule.
        ValueError: ``reason`` is empty.
    """
    check_name(source_id, "source_id")
    if not reason.strip():
        raise UsageError("a revocation needs a reason")
    rev = Revocation(source_id, utc_now(), reason.strip())
    key = revocation_key(source_id)
    try:
        store.create(key, (numbers.dumps(rev.to_dict(), sort_keys=True) + "\n").encode())
    except ObjectExistsError:
        return _read(store, key), False
    return rev, True


def _read(store: Store, key: str) -> Revocation:
    doc = schemas.load_json(store.read_bytes(key), path=store.url_of(key))
    return Revocation(doc["source_id"], doc["revoked_at"], doc["revocation_reason"])


def revocations(store: Store) -> dict[str, Revocation]:
    """Every revocation in the store, by source id."""
    out = {}
    for name, is_dir in store.list_dir(PREFIX):
        if not is_dir and name.endswith(".json"):
            rev = _read(store, join(PREFIX, name))
            out[rev.source_id] = rev
    return dict(sorted(out.items()))


def revoked_reasons(store: Store) -> dict[str, str]:
    """source_id -> reason: the live ledger as the gates read it."""
    return {k: v.revocation_reason for k, v in revocations(store).items()}
