"""``registry events repair``: append the events the store's records imply and the
log lacks (a write that committed when its event append failed, exit 11).

Covered: ``model_version.created`` for every committed release, and the alias
events of every move on an alias's history chain (matched by the entry's
name, ``data.entry``). Revocations and policy changes carry no stable id to
match, so a missing ``source.revoked`` / ``policy.changed`` is not re-created.
Appended events carry ``data.repaired: true``; their time is the repair's.
"""

from __future__ import annotations

from registry.actor import actor_of_metadata
from registry.alias_history import history_aliases, walk
from registry.aliases import alias_event
from registry.events import MODEL_VERSION_CREATED, append_event
from registry.events.log import iter_events
from registry.layout import MODELS, release_prefix
from registry.store import Store
from registry.verify import is_committed, read_manifest


def repair(store: Store) -> list[str]:
    """Append the missing events; returns a line per event appended.

    Raises:
        StorageError, EventNotRecordedError: the store refused a read or an append.
    """
    damaged: list[str] = []
    events = list(iter_events(store, damaged=damaged))
    created = {(e.model_id, e.version) for e in events if e.name == MODEL_VERSION_CREATED}
    entries = {(e.model_id, e.data.get("alias"), e.data.get("entry")) for e in events}
    out: list[str] = []
    for model_id in store.subdirs(MODELS):
        for version in store.subdirs(f"{MODELS}/{model_id}"):
            if version == "refs" or version.startswith(".") or ".tmp" in version:
                continue
            try:
                prefix = release_prefix(model_id, version)
            except ValueError:
                continue
            if (model_id, version) in created or not is_committed(store, prefix):
                continue
            manifest = read_manifest(store, prefix)
            if manifest.kind != "release":
                continue
            metadata = manifest.meta.get("metadata", {})
            append_event(store, MODEL_VERSION_CREATED, model_id=model_id, version=version,
                         data={"manifest_sha256": manifest.digest,
                               "sequence": metadata.get("sequence"), "repaired": True},
                         actor=actor_of_metadata(metadata))
            out.append(f"{MODEL_VERSION_CREATED} {model_id}@{version}")
        for alias in history_aliases(store, model_id):
            for move in reversed(list(walk(store, model_id, alias, broken=[]))):
                if (model_id, alias, move.name) in entries:
                    continue
                alias_event(store, move, repaired=True)
                out.append(f"alias move {move.seq} of {model_id}@{alias}")
    return out
