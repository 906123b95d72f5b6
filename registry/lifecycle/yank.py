"""Yank: take a release out of service without deleting it (issue 32 item 1).

A yank is a record beside the immutable release, moved by compare-and-swap::

    ledger/yanks/<model_id>/<version>.json
        {"schema": 1, "model_id", "version", "manifest_sha256", "yanked": true,
         "reason", "at", "actor", "revision"}

``registry unyank`` swaps in ``"yanked": false`` (with who and when, and the
yank it lifted in ``"lifted"``), so the record says the last transition and the
event log (``model_version.yanked`` / ``model_version.unyanked``) says all of
them. The release's bytes never change. ``revision`` counts the record's
transitions (1, 2, ...) and each event carries it in ``data.revision``: the
event is appended after the swap, so events of concurrent writers may land in
another order than their swaps; ``revision`` is the swap order.

A yanked release fails the ``yanked`` gate (:func:`yank_gate`) wherever gates
are checked from the store (:meth:`registry.release.ModelRelease.check`: alias
moves, ``pull --require-passing``, ``gate check``, the web and the Hub API) and
in the index (the ``yanks`` table); a plain pull refuses it unless told
``allow_yanked`` (:func:`registry.pull.pull`). A record that cannot be read
(garbled by a store writer) fails the gate too: a reader never takes an
unreadable record as "not yanked".
"""

from __future__ import annotations

from typing import Any

from registry.errors import DocumentError
from registry.gating.gates import GateResult
from registry.protocol.layout import YANKS, release_prefix, yank_key
from registry.lifecycle import records
from registry.protocol.manifest import utc_now
from registry.store import Store
from registry.protocol.verify import read_manifest

GATE = "yanked"


def _revision(record: dict[str, Any] | None) -> int:
    """The record's revision: 1 for its first transition, one more for each
    swap after (0: no record, or one written before revisions, or a store
    writer's garbage)."""
    value = (record or {}).get("revision")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _swap(store: Store, model_id: str, version: str, want: bool, reason: str,
          actor: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    key = yank_key(model_id, version)
    manifest = read_manifest(store, release_prefix(model_id, version))
    store.ensure_root()

    def change(current: dict[str, Any] | None
               ) -> tuple[tuple[dict[str, Any], bool], dict[str, Any] | None]:
        if current is not None and bool(current.get("yanked")) == want:
            return (current, False), None
        if current is None and not want:
            return ({"schema": records.RECORD_SCHEMA, "model_id": model_id,
                     "version": version, "yanked": False}, False), None
        doc: dict[str, Any] = {
            "schema": records.RECORD_SCHEMA, "model_id": model_id, "version": version,
            "manifest_sha256": manifest.digest, "yanked": want, "reason": reason,
            "at": utc_now(), "actor": actor, "revision": _revision(current) + 1}
        if not want and current is not None:
            doc["lifted"] = {k: current.get(k) for k in ("reason", "at", "actor")}
        return (doc, True), doc

    return records.swap_record(store, key, "the yank record", change)


def _transition(store: Store, model_id: str, version: str, want: bool, why: str,
                who: dict[str, Any], event: str) -> tuple[dict[str, Any], bool]:
    """Yank (``want``) or unyank, and append ``event`` when that changed the record."""
    doc, changed = _swap(store, model_id, version, want, why, who)
    if changed:
        records.event(store, event, model_id, version,
                      {"reason": why, "manifest_sha256": doc["manifest_sha256"],
                       "revision": doc["revision"]}, who)
    return doc, changed


def yank(store: Store, model_id: str, version: str, reason: str, *,
         actor: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Yank the committed release ``model_id@version``; returns ``(record, changed)``.

    Yanking a yanked release changes nothing (``changed`` False: the first
    yank's record, reason and actor stay).

    Raises:
        InvalidNameError: a bad model id or version.
        UsageError: an empty reason, or one that is not one printable line.
        NotCommittedError: no such committed release.
        DocumentError: the existing record is garbled (repair: delete it).
        PointerConflictError: the record kept changing (64 tries).
        EventNotRecordedError: the yank committed, its event did not.

    Notes:
        Atomic against concurrent yanks and unyanks (compare-and-swap on the
        record): each sees the other's result, none is lost. Durable on return.
    """
    from registry.events import MODEL_VERSION_YANKED

    why = records.check_reason(reason, f"yank of {model_id}@{version}")
    return _transition(store, model_id, version, True, why, records.actor_of(actor),
                       MODEL_VERSION_YANKED)


def unyank(store: Store, model_id: str, version: str, *, reason: str | None = None,
           actor: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Lift the yank of ``model_id@version``; returns ``(record, changed)``
    (``changed`` False: it was not yanked). Raises as :func:`yank` (the
    reason is optional here)."""
    why = (records.check_reason(reason, f"unyank of {model_id}@{version}")
           if reason is not None else "")
    from registry.events import MODEL_VERSION_UNYANKED

    return _transition(store, model_id, version, False, why, records.actor_of(actor),
                       MODEL_VERSION_UNYANKED)


def yank_record(store: Store, model_id: str, version: str) -> dict[str, Any] | None:
    """The yank record of a yanked release, else None (never yanked, or unyanked).

    Raises:
        DocumentError: the record is garbled.
    """
    doc = records.load(store, yank_key(model_id, version))
    return doc if doc is not None and doc.get("yanked") is True else None


def describe(doc: dict[str, Any]) -> str:
    """``yanked at <time> by <user>@<host>: <reason>``."""
    from registry.host.actor import describe as who, read_actor

    return (f"yanked at {doc.get('at')} by {who(read_actor(doc.get('actor')))}: "
            f"{doc.get('reason')}")


def yank_gate(store: Store, model_id: str, version: str) -> list[GateResult]:
    """``[GateResult("yanked", False, why)]`` for a yanked release (or one
    whose yank record cannot be read), ``[]`` otherwise: like the ``code``
    gate, the ``yanked`` gate is listed only where it has something to say."""
    try:
        return gate_of(records.load(store, yank_key(model_id, version)))
    except DocumentError as e:
        return gate_of(None, e)


def gate_of(record: dict[str, Any] | None,
            garbled: DocumentError | None = None) -> list[GateResult]:
    """:func:`yank_gate` of a yank record already read (``garbled``: its parse failed)."""
    if garbled is not None:
        return [GateResult(GATE, False, f"the yank record cannot be read ({garbled}); a "
                           "record nobody can read is not taken as 'not yanked'")]
    yanked_now = record is not None and record.get("yanked") is True
    return [GateResult(GATE, False, describe(record))] if yanked_now else []  # type: ignore[arg-type]


def yanked(store: Store, model_id: str) -> dict[str, dict[str, Any]]:
    """version -> yank record, for every yanked release of ``model_id`` (for
    ``index rebuild``). Garbled records are left out (the gate reports them)."""
    return records.per_version(store, YANKS, model_id,
                               lambda v: yank_record(store, model_id, v))
