"""``registry events repair``: append the events the store's records imply and the
log lacks (a write that committed when its event append failed, exit 11).

Covered:

* ``model_version.created`` for every committed release;
* the alias events of every move on an alias's history chain (matched by
  the entry's name, ``data.entry``);
* ``model_version.deleted`` for every tombstone without one;
* ``model_version.yanked`` / ``.unyanked`` for a yank record whose revision
  (``data.revision``) no event carries: the record's state now (a record
  keeps only its newest revision, so earlier lost ones are not re-created);
* ``model_version_tag.set`` / ``.deleted`` where the newest tag event of a
  release's key disagrees with its tags record, so that the log, replayed,
  gives the tags the store holds.

Revocations and policy changes carry no stable id to match, so a missing
``source.revoked`` / ``policy.changed`` is not re-created. Appended events
carry ``data.repaired: true``; their time is the repair's, their actor the
record's (the repairing process's where the record's is not a valid actor).
A repair that runs while a write is between its commit and its event may
append that event as well as the writer: the log then holds the same state
twice, never a wrong one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from registry.host.actor import actor_of_metadata
from registry.refs.alias_history import history_aliases, walk
from registry.refs.aliases import alias_event
from registry.errors import DocumentError, InvalidNameError, PointerError
from registry.events import (
    MODEL_VERSION_CREATED,
    MODEL_VERSION_DELETED,
    MODEL_VERSION_TAG_DELETED,
    MODEL_VERSION_TAG_SET,
    MODEL_VERSION_UNYANKED,
    MODEL_VERSION_YANKED,
    append_event,
)
from registry.events.log import Event, event_numbers, iter_events
from registry.rules import limits
from registry.protocol.layout import (
    EVENTS,
    MODELS,
    TAGS,
    TOMBSTONES,
    YANKS,
    model_ids,
    model_root,
    release_prefix,
    yank_key,
)
from registry.lifecycle import records
from registry.lifecycle.tags import read_tags_record
from registry.lifecycle.tombstone import tombstones
from registry.rules.schemas import validate
from registry.store import Store
from registry.protocol.verify import is_committed, read_manifest


def repair(store: Store, *, damaged: list[str] | None = None) -> list[str]:
    """Append the missing events; returns a line per event appended.

    Args:
        damaged: where to note what could not be read (a garbled manifest,
            alias pointer or history entry: a message each) and carry on with
            the rest; None: raise instead.

    Raises:
        StorageError, EventNotRecordedError: the store refused a read or an append.
        DocumentError, PointerError: a release's manifest or an alias's pointer
            or history is garbled and ``damaged`` is None.
    """
    notes: list[str] = []
    out: list[str] = []
    for line in set_aside(store):
        (damaged.append(line) if damaged is not None else out.append(line))
    events = list(iter_events(store, damaged=notes))
    for model_id in model_ids(store.subdirs(MODELS)):
        for version in store.subdirs(model_root(model_id)):
            _guarded(damaged, lambda: _release(store, model_id, version, events, out))
        for alias in history_aliases(store, model_id):
            _guarded(damaged, lambda: _alias(store, model_id, alias, events, out))
    # a model whose every release was deleted may have no models/<id>/ left
    lifecycle_models = {m for root in (TOMBSTONES, YANKS, TAGS)
                        for m in model_ids(store.subdirs(root))}
    for model_id in sorted(lifecycle_models):
        mine = [e for e in events if e.model_id == model_id]
        stones = tombstones(store, model_id)  # a deleted release's yank and tags go with it
        _guarded(damaged, lambda: _deletes(store, model_id, stones, mine, out))
        _guarded(damaged, lambda: _yanks(store, model_id, set(stones), mine, out))
        _guarded(damaged, lambda: _tags(store, model_id, set(stones), mine, out, damaged))
    return out


#: where ``events repair`` sets aside event objects out of bounds
QUARANTINE = "events-quarantine"


def set_aside(store: Store) -> list[str]:
    """Move every event object out of bounds (:func:`registry.events.log.split_numbers`:
    a number past a jump, more than 12 digits) to ``events-quarantine/`` (copy,
    then delete), so appends number after the real log again; a line each."""
    bad: list[str] = []
    event_numbers(store, quarantined=bad)
    lines = []
    for name in bad:
        src, dst = f"{EVENTS}/{name}", f"{QUARANTINE}/{name}"
        try:
            data = store.read_bytes(src, limit=limits.MAX_JSON_BYTES)
        except DocumentError:  # over the cap: its first bytes are no use to anyone
            data = b'{"set_aside": "larger than REGISTRY_MAX_JSON_BYTES"}\n'
        store.write_bytes(dst, data)
        store.delete(src)
        lines.append(f"set aside {store.url_of(src)} (its number is out of bounds) to "
                     f"{store.url_of(dst)}")
    return lines


def _guarded(damaged: list[str] | None, step: Callable[[], None]) -> None:
    try:
        step()
    except (DocumentError, PointerError, InvalidNameError) as e:
        if damaged is None:
            raise
        damaged.append(str(e))


def _release(store: Store, model_id: str, version: str, events: list[Event],
             out: list[str]) -> None:
    if version == "refs" or version.startswith(".") or ".tmp" in version:
        return
    try:
        prefix = release_prefix(model_id, version)
    except ValueError:
        return
    if any(e.name == MODEL_VERSION_CREATED and (e.model_id, e.version) == (model_id, version)
           for e in events) or not is_committed(store, prefix):
        return
    manifest = read_manifest(store, prefix)
    if manifest.kind != "release":
        return
    metadata = manifest.meta.get("metadata", {})
    append_event(store, MODEL_VERSION_CREATED, model_id=model_id, version=version,
                 data={"manifest_sha256": manifest.digest,
                       "sequence": metadata.get("sequence"), "repaired": True},
                 actor=actor_of_metadata(metadata))
    out.append(f"{MODEL_VERSION_CREATED} {model_id}@{version}")


def _alias(store: Store, model_id: str, alias: str, events: list[Event],
           out: list[str]) -> None:
    entries = {(e.model_id, e.data.get("alias"), e.data.get("entry")) for e in events}
    for move in reversed(list(walk(store, model_id, alias, broken=[]))):
        if (model_id, alias, move.name) in entries:
            continue
        alias_event(store, move, repaired=True)
        out.append(f"alias move {move.seq} of {model_id}@{alias}")


def _actor(record: dict[str, Any]) -> dict[str, Any] | None:
    """The record's actor if it is a valid event actor, else None (the
    repairing process's, :func:`registry.events.append_event`): a store
    writer's record must not make the log hold an event its schema refuses."""
    actor = record.get("actor")
    try:
        validate(actor, "event", path="actor", defs="actor")
    except DocumentError:
        return None
    return actor if isinstance(actor, dict) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _append(store: Store, name: str, model_id: str, version: str, data: dict[str, Any],
            record: dict[str, Any], out: list[str]) -> None:
    append_event(store, name, model_id=model_id, version=version,
                 data={**data, "repaired": True}, actor=_actor(record))
    out.append(f"{name} {model_id}@{version}")


def _deletes(store: Store, model_id: str, stones: dict[str, dict[str, Any]],
             mine: list[Event], out: list[str]) -> None:
    logged = {e.version for e in mine if e.name == MODEL_VERSION_DELETED}
    for version, stone in sorted(stones.items()):
        if version not in logged:
            _append(store, MODEL_VERSION_DELETED, model_id, version,
                    {"reason": _text(stone.get("reason")),
                     "manifest_sha256": _text(stone.get("manifest_sha256"))}, stone, out)


def _yanks(store: Store, model_id: str, gone: set[str], mine: list[Event],
           out: list[str]) -> None:
    logged = {(e.version, e.data.get("revision")) for e in mine
              if e.name in (MODEL_VERSION_YANKED, MODEL_VERSION_UNYANKED)}
    found = records.per_version(store, YANKS, model_id,
                                lambda v: records.load(store, yank_key(model_id, v)))
    for version, rec in sorted(found.items()):
        revision = rec.get("revision")
        if version in gone or not isinstance(revision, int) or (version, revision) in logged:
            continue
        name = MODEL_VERSION_YANKED if rec.get("yanked") is True else MODEL_VERSION_UNYANKED
        _append(store, name, model_id, version,
                {"reason": _text(rec.get("reason")) or "",
                 "manifest_sha256": _text(rec.get("manifest_sha256")),
                 "revision": revision}, rec, out)


def _tags(store: Store, model_id: str, gone: set[str], mine: list[Event], out: list[str],
          damaged: list[str] | None) -> None:
    newest: dict[tuple[str, str], str | None] = {}  # (version, key) -> value (None: removed)
    for e in mine:  # in log order: the last word on a key wins
        key = e.data.get("key")
        if e.version is None or not isinstance(key, str):
            continue
        if e.name == MODEL_VERSION_TAG_SET:
            newest[(e.version, key)] = _text(e.data.get("value"))
        elif e.name == MODEL_VERSION_TAG_DELETED:
            newest[(e.version, key)] = None
    stored = set(records.per_version(store, TAGS, model_id, lambda v: v))  # names only
    for version in sorted((stored | {v for v, _ in newest}) - gone):
        try:
            tags, record = read_tags_record(store, model_id, version)
        except (DocumentError, InvalidNameError) as e:  # garbled: tell, never guess
            if damaged is None:
                raise
            damaged.append(str(e))
            continue
        for key, value in sorted(tags.items()):
            if newest.get((version, key)) != value:
                _append(store, MODEL_VERSION_TAG_SET, model_id, version,
                        {"key": key, "value": value}, record, out)
        for (v, key), value in sorted(newest.items()):
            if v == version and value is not None and key not in tags:
                _append(store, MODEL_VERSION_TAG_DELETED, model_id, version, {"key": key},
                        record, out)
