"""Index write paths of a release's life (issue 32 items 1-3): yanks, tags, tombstones.

Each takes the record as the store holds it (:mod:`registry.lifecycle`) and is
idempotent, so the incremental path (the CLI and API after a store write) and
``registry index rebuild`` run the same code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from registry.index.record import model_pk
from registry.index.schema import Alias, Model, Release, ReleaseTag, Tombstone, Yank
from registry.lifecycle.tags import read_tags
from registry.lifecycle.yank import yank_record
from registry.store import Store


def _release_pk(s: Session, model_id: str, version: str) -> int | None:
    return s.scalar(select(Release.id).join(Model).where(Model.model_id == model_id,
                                                         Release.version == version))


def _actor(doc: Mapping[str, Any]) -> str:
    actor = doc.get("actor")
    return json.dumps(actor if isinstance(actor, dict) else None, sort_keys=True)


def record_yank(s: Session, model_id: str, version: str,
                doc: Mapping[str, Any] | None) -> None:
    """The yank record of a release: a row when ``doc`` says yanked, none
    otherwise (unyanked, or ``doc`` None). A release the index lacks is skipped
    (``index rebuild`` adds both)."""
    pk = _release_pk(s, model_id, version)
    if pk is None:
        return
    s.execute(delete(Yank).where(Yank.release_pk == pk))
    if doc is not None and doc.get("yanked") is True:
        s.add(Yank(release_pk=pk, reason=str(doc.get("reason", ""))[:1000],
                   yanked_at=str(doc.get("at", ""))[:32], actor=_actor(doc)))


def record_tags(s: Session, model_id: str, version: str, tags: Mapping[str, str]) -> None:
    """Replace the indexed tags of a release with ``tags``."""
    pk = _release_pk(s, model_id, version)
    if pk is None:
        return
    s.execute(delete(ReleaseTag).where(ReleaseTag.release_pk == pk))
    s.add_all(ReleaseTag(release_pk=pk, key=k, value=v) for k, v in sorted(tags.items()))


def _lock_release(s: Session, model_id: str, version: str) -> int | None:
    """Take the release row's write lock (a no-op update: a row lock on
    Postgres, the database's write lock on SQLite) and return its pk."""
    pk = _release_pk(s, model_id, version)
    if pk is not None:
        s.execute(update(Release).where(Release.id == pk).values(seq=Release.seq))
    return pk


def sync_tags(s: Session, store: Store, model_id: str, version: str) -> None:
    """Index the tags the store holds *now*, read under the release row's
    lock: of concurrent writers, the last to take the lock reads after every
    swap that came before it, so the index ends as the store (no lost update
    in the index either)."""
    if _lock_release(s, model_id, version) is not None:
        record_tags(s, model_id, version, read_tags(store, model_id, version))


def sync_yank(s: Session, store: Store, model_id: str, version: str) -> None:
    """Index the yank record the store holds now (as :func:`sync_tags`)."""
    if _lock_release(s, model_id, version) is not None:
        record_yank(s, model_id, version, yank_record(store, model_id, version))


def record_tombstone(s: Session, doc: Mapping[str, Any]) -> None:
    """A deleted release: its tombstone row replaces its release row (and the
    rows that hang off it: files, evals, sources, yank, tags); aliases still
    naming it in the index are dropped (the store refuses to delete an
    aliased release, so only a stale index holds such a row)."""
    model_id, version = str(doc["model_id"]), str(doc["version"])
    mpk = model_pk(s, model_id)
    gone = s.execute(delete(Release).where(Release.model_pk == mpk,
                                           Release.version == version)).rowcount
    if gone:
        s.execute(update(Model).where(Model.id == mpk)
                  .values(release_count=Model.release_count - gone))
    s.execute(delete(Alias).where(Alias.model_pk == mpk, Alias.version == version))
    s.execute(delete(Tombstone).where(Tombstone.model_pk == mpk, Tombstone.version == version))
    seq = doc.get("sequence")
    s.add(Tombstone(model_pk=mpk, version=version,
                    manifest_sha256=str(doc.get("manifest_sha256", ""))[:64],
                    seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
                    deleted_at=str(doc.get("deleted_at", ""))[:32],
                    reason=str(doc.get("reason", ""))[:1000], actor=_actor(doc)))
