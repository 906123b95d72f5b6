"""``registry release delete``: remove a release, leave its tombstone (issue 32 item 2).

The steps, each safe to stop after (a second ``release delete`` of the same
version finishes the job; ``registry gc`` removes an uncommitted leftover):

1. refuse while an alias points at the release, or an alias of the model cannot
   be read (it may point there) (ReleaseInUseError);
2. create the tombstone (conditional create, :mod:`registry.lifecycle.tombstone`):
   the commit point. Two deleters racing: one creates it, the other finds the
   same release's tombstone and carries on with the removal;
3. look at the aliases again: an ``alias set`` that read the release as
   committed just before the tombstone may have moved an alias to it
   meanwhile. Then the tombstone is removed again (the release was not
   touched) and the delete refused; :func:`registry.refs.aliases.set_alias` checks
   for a tombstone after its own move too and, finding one, waits for the
   delete to back off (the move stands) or go on (the move is undone), so
   exactly one of the two wins (both lose only if the deleter dies between
   its tombstone and this look);
4. delete ``MANIFEST.json`` first, then every other file
   (:func:`registry.protocol.commit.delete_directory`, as ``gc`` does): a half-deleted
   directory is never read as committed;
5. remove the release's yank record and tags (the index drops their rows with
   the release's);
6. append ``model_version.deleted`` to the event log.
"""

from __future__ import annotations

from typing import Any

from registry.refs.aliases import damaged_alias_note, list_aliases
from registry.protocol.commit import delete_directory
from registry.errors import (
    NotCommittedError,
    ObjectExistsError,
    ReleaseInUseError,
)
from registry.protocol.layout import release_prefix, tags_key, tombstone_key, yank_key
from registry.lifecycle import records
from registry.lifecycle.tombstone import read_tombstone
from registry.protocol.manifest import utc_now
from registry.trust.model_sig import SIGNATURE
from registry.protocol.sequence import sequence_of
from registry.store import Store
from registry.protocol.verify import read_manifest


def _refuse_aliased(store: Store, model_id: str, version: str) -> None:
    damaged: dict[str, str] = {}
    aliases = tuple(sorted(a for a, v in list_aliases(store, model_id, damaged=damaged).items()
                           if v == version))
    if damaged:  # it may point here: fail closed
        raise ReleaseInUseError(
            f"{store.url_of(release_prefix(model_id, version))}: not deleted: "
            f"{damaged_alias_note(model_id, damaged)}",
            path=release_prefix(model_id, version), aliases=tuple(sorted(damaged)))
    if aliases:
        raise ReleaseInUseError(
            f"{store.url_of(release_prefix(model_id, version))}: not deleted: alias"
            f"{'es' if len(aliases) > 1 else ''} {', '.join(aliases)} point"
            f"{'' if len(aliases) > 1 else 's'} at it; move "
            f"{'them' if len(aliases) > 1 else 'it'} first (`registry alias set`)",
            path=release_prefix(model_id, version), aliases=aliases)


def delete_release(store: Store, model_id: str, version: str, reason: str, *,
                   actor: dict[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Delete the release ``model_id@version``; returns ``(tombstone, deleted)``
    (``deleted`` False: another delete had already made the tombstone and
    this call finished removing what was left, if anything).

    Raises:
        InvalidNameError: a bad model id or version.
        UsageError: an empty reason.
        NotCommittedError: no such release (nor a tombstone of it).
        ReleaseInUseError: an alias points at it, or an alias of the model
            is damaged (it may); nothing is changed.
        StorageError: the store failed; a second call resumes.
        EventNotRecordedError: the delete is done, its event did not land.
    """
    why = records.check_reason(reason, f"delete of {model_id}@{version}")
    who = records.actor_of(actor)
    prefix = release_prefix(model_id, version)
    key = tombstone_key(model_id, version)
    existing = read_tombstone(store, model_id, version)
    if existing is not None:  # a delete stopped half way, or raced: finish it
        _remove(store, model_id, version)
        return existing, False
    manifest = read_manifest(store, prefix)
    _refuse_aliased(store, model_id, version)
    doc = {"schema": records.RECORD_SCHEMA, "model_id": model_id, "version": version,
           "manifest_sha256": manifest.digest, "sequence": sequence_of(manifest),
           "files": len(manifest.files), "bytes": manifest.total_size,
           "signed": any(e.path == SIGNATURE for e in manifest.files),
           "created_at": manifest.created_at, "deleted_at": utc_now(), "reason": why,
           "actor": who}
    data = records.dump(doc)
    try:
        store.create(key, data)
    except ObjectExistsError:
        other = read_tombstone(store, model_id, version)
        if other is None or other.get("manifest_sha256") != manifest.digest:
            raise NotCommittedError(f"{store.url_of(key)}: another delete of {model_id}@"
                                    f"{version} raced this one with another release",
                                    path=prefix) from None
        _remove(store, model_id, version)
        return other, False
    try:
        _refuse_aliased(store, model_id, version)
    except ReleaseInUseError:
        store.delete(key)  # nothing of the release was touched
        raise
    _remove(store, model_id, version)
    from registry.events import MODEL_VERSION_DELETED

    records.event(store, MODEL_VERSION_DELETED, model_id, version,
                  {"reason": why, "manifest_sha256": manifest.digest}, who)
    return doc, True


def _remove(store: Store, model_id: str, version: str) -> None:
    """Everything of a tombstoned release but its tombstone: the directory
    (manifest first), then its yank record and tags."""
    delete_directory(store, release_prefix(model_id, version))
    for key in (yank_key(model_id, version), tags_key(model_id, version)):
        store.delete(key)
