"""The live ledger: revocations of data sources, stored under ``ledger/`` in the store.

A revocation is an immutable fact written with a conditional create, so it is
in the store before any index hears of it, and ``registry index rebuild``
loses nothing::

    ledger/revocations/<source_id>.json   {"source_id", "revoked_at", "revocation_reason",
                                           "actor"}

``actor`` (:mod:`registry.host.actor`) is absent from revocations written before it was recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.rules import limits, numbers, schemas
from registry.host.actor import current_actor, read_actor
from registry.errors import DocumentError, ObjectExistsError, UsageError
from registry.protocol.layout import REVOCATIONS, revocation_key
from registry.protocol.manifest import utc_now
from registry.rules.names import check_name
from registry.store import Store, join

PREFIX = REVOCATIONS


@dataclass(frozen=True, slots=True)
class Revocation:
    source_id: str
    revoked_at: str
    revocation_reason: str
    #: who revoked it (registry.host.actor); None in revocations written before actors
    actor: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"source_id": self.source_id, "revoked_at": self.revoked_at,
                               "revocation_reason": self.revocation_reason}
        if self.actor is not None:
            doc["actor"] = self.actor
        return doc


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
    rev = Revocation(source_id, utc_now(), reason.strip(), current_actor())
    key = revocation_key(source_id)
    try:
        store.create(key, (numbers.dumps(rev.to_dict(), sort_keys=True) + "\n").encode())
    except ObjectExistsError:
        return _read(store, key), False
    return rev, True


def _read(store: Store, key: str) -> Revocation:
    """The revocation at ``key``.

    Raises:
        DocumentError: not JSON, larger than the JSON document cap, or not an
            object with string ``source_id``, ``revoked_at``, ``revocation_reason``.
    """
    where = store.url_of(key)
    doc = schemas.load_json(store.read_bytes(key, limit=limits.MAX_JSON_BYTES), path=where)
    fields = ("source_id", "revoked_at", "revocation_reason")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(f), str) for f in fields):
        raise DocumentError(where, "a revocation must be a JSON object with the strings "
                                   + ", ".join(fields))
    return Revocation(doc["source_id"], doc["revoked_at"], doc["revocation_reason"],
                      read_actor(doc.get("actor")))


def revocation_of(store: Store, source_id: str) -> dict[str, Any]:
    """The revocation document of ``source_id`` (``source_id``, ``revoked_at``,
    ``revocation_reason``).

    Raises:
        ObjectNotFoundError: the source is not revoked.
        DocumentError: the revocation file is not a valid revocation.
    """
    return _read(store, revocation_key(check_name(source_id, 'source_id'))).to_dict()


def revocations(store: Store, *, quarantined: list[dict[str, str]] | None = None
                ) -> dict[str, Revocation]:
    """Every revocation in the store, by source id.

    A record that cannot be read (garbled, over the cap, not a revocation, or
    naming another source than its file) is quarantined: left out and named
    in ``quarantined`` (``{"key", "reason"}``) when given, never stopping the
    others (issue 50 item 4).

    Raises:
        DocumentError: a record cannot be read and ``quarantined`` is None.
    """
    out = {}
    for name, is_dir in store.list_dir(PREFIX):
        if not is_dir and name.endswith(".json"):
            key = join(PREFIX, name)
            try:
                rev = _read(store, key)
                if rev.source_id != name[:-len(".json")]:
                    raise DocumentError(store.url_of(key), f"names source {rev.source_id!r}, "
                                                           "not the one of its file name")
            except (DocumentError, ValueError) as e:
                if quarantined is None:
                    raise
                quarantined.append({"key": key, "reason": str(e).splitlines()[0]})
                continue
            out[rev.source_id] = rev
    return dict(sorted(out.items()))


def revoked_reasons(store: Store) -> dict[str, str]:
    """source_id -> reason: the live ledger as the gates read it. A revocation
    record that cannot be read still revokes the source its file names (fail
    closed for that source alone): a store writer who garbles one record
    neither lifts it nor stops the gates of every other release."""
    bad: list[dict[str, str]] = []
    out = {k: v.revocation_reason for k, v in revocations(store, quarantined=bad).items()}
    for q in bad:
        source_id = q["key"].rpartition("/")[2][:-len(".json")]
        out.setdefault(source_id, f"its revocation record cannot be read ({q['reason']})")
    return out
