"""``registry events repair``: append the events the store's records imply and the
log lacks (a write that committed when its event append failed, exit 11).

Covered: ``model_version.created`` for every committed release, and the alias
events of every move on an alias's history chain (matched by the entry's
name, ``data.entry``). Revocations and policy changes carry no stable id to
match, so a missing ``source.revoked`` / ``policy.changed`` is not re-created.
Appended events carry ``data.repaired: true``; their time is the repair's.
"""

from __future__ import annotations

from collections.abc import Callable

from registry.actor import actor_of_metadata
from registry.alias_history import history_aliases, walk
from registry.aliases import alias_event
from registry.events import MODEL_VERSION_CREATED, append_event
from registry.errors import DocumentError, PointerError
from registry.events.log import Event, iter_events
from registry.layout import MODELS, release_prefix
from registry.store import Store
from registry.verify import is_committed, read_manifest


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
    events = list(iter_events(store, damaged=notes))
    out: list[str] = []
    for model_id in store.subdirs(MODELS):
        for version in store.subdirs(f"{MODELS}/{model_id}"):
            _guarded(damaged, lambda: _release(store, model_id, version, events, out))
        for alias in history_aliases(store, model_id):
            _guarded(damaged, lambda: _alias(store, model_id, alias, events, out))
    return out


def _guarded(damaged: list[str] | None, step: Callable[[], None]) -> None:
    try:
        step()
    except (DocumentError, PointerError) as e:
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
