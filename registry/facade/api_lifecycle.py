"""The Registry facade's part for the life of a release (issue 32 items 1-3).

Each write goes to the store first (:mod:`registry.lifecycle`), then to the
index; a failing index write is an :class:`registry.api.IndexWriteWarning`,
never an undone store write (``registry index rebuild`` repairs the index).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from registry.errors import EventNotRecordedError
from registry.index import search as index_search
from registry.index.record_lifecycle import record_tombstone, sync_tags, sync_yank
from registry.lifecycle import delete as lifecycle_delete
from registry.lifecycle import retention, tags, yank
from registry.lifecycle.tombstone import read_tombstone
from registry.store import Store

T = TypeVar("T")


def _committed(write: Callable[[], T], index: Callable[[], None]) -> T:
    """Run a store ``write``, then ``index`` it -- also when the write committed
    but its event did not land (EventNotRecordedError, re-raised after)."""
    try:
        out = write()
    except EventNotRecordedError:
        index()
        raise
    index()
    return out


class LifecycleMixin:
    """Yank, unyank, delete, retention, tags and search; mixed into
    :class:`registry.api.Registry` (which provides ``store``, ``_record``
    and ``_query``)."""

    store: Store
    _record: Callable[[str, Callable[[Session], Any]], None]
    _query: Callable[[Callable[[Session], Any]], Any]

    snapshots: list[dict[str, Any]]

    def _resign(self, model_ids: list[str] | None, sign_key: str | os.PathLike[str] | None,
                *, only_signed: bool = False) -> None:
        """A new signed snapshot of ``model_ids`` (None: every model that has
        one) after a change of their records, when ``sign_key`` is given
        (:func:`registry.trust.snapshot.resign`); ``only_signed``: only of a
        model that has one already (an alias move's key signs the move, and
        opts no model into snapshots)."""
        if sign_key is None:
            return
        from registry.trust import snapshot

        if only_signed and model_ids is not None:
            have = set(snapshot.signed_models(self.store))
            model_ids = [m for m in model_ids if m in have]
        self.snapshots += snapshot.resign(self.store, model_ids, sign_key)

    def _signed(self, write: Callable[[], T], model_id: str,
                sign_key: str | os.PathLike[str] | None) -> T:
        """``write``, then a new snapshot of ``model_id`` with ``sign_key``
        (also when only its event failed)."""
        try:
            out = write()
        except EventNotRecordedError:
            self._resign([model_id], sign_key)
            raise
        self._resign([model_id], sign_key)
        return out

    def yank(self, model_id: str, version: str, reason: str, *,
             sign_key: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any], bool]:
        """:func:`registry.lifecycle.yank.yank`, then index it: ``(record, changed)``.
        With ``sign_key``, the model's snapshot is signed again (into :attr:`snapshots`)."""
        return self._signed(lambda: _committed(
            lambda: yank.yank(self.store, model_id, version, reason),
            lambda: self._sync_yank(model_id, version)), model_id, sign_key)

    def unyank(self, model_id: str, version: str, *, reason: str | None = None,
               sign_key: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any], bool]:
        """:func:`registry.lifecycle.yank.unyank`, then index it (``sign_key``: as yank)."""
        return self._signed(lambda: _committed(
            lambda: yank.unyank(self.store, model_id, version, reason=reason),
            lambda: self._sync_yank(model_id, version)), model_id, sign_key)

    def _sync_yank(self, model_id: str, version: str) -> None:
        self._record(f"yank record of {model_id}@{version}",
                     lambda s: sync_yank(s, self.store, model_id, version))

    def delete_release(self, model_id: str, version: str, reason: str, *,
                       sign_key: str | os.PathLike[str] | None = None
                       ) -> tuple[dict[str, Any], bool]:
        """:func:`registry.lifecycle.delete.delete_release`, then index the
        tombstone (the release's rows go): ``(tombstone, deleted)``. With
        ``sign_key``, the model's snapshot is signed again, listing the tombstone."""
        def index() -> None:
            doc = read_tombstone(self.store, model_id, version)
            if doc is not None:
                self._record(f"delete of {model_id}@{version}",
                             lambda s: record_tombstone(s, doc))
        return self._signed(lambda: _committed(
            lambda: lifecycle_delete.delete_release(self.store, model_id, version, reason),
            index), model_id, sign_key)

    def release_gc(self, *, keep_last: int | None = None, unaliased: bool = False,
                   older_than: float | None = None, model_id: str | None = None,
                   dry_run: bool = False, reason: str | None = None) -> retention.GcReport:
        """Apply a retention policy (:func:`registry.lifecycle.retention.collect`);
        each release deleted is indexed as its tombstone."""
        report = retention.collect(self.store, keep_last=keep_last, unaliased=unaliased,
                                   older_than=older_than, model_id=model_id, dry_run=dry_run,
                                   reason=reason)
        for doc in report.tombstones:
            self._record(f"delete of {doc['model_id']}@{doc['version']}",
                         lambda s, d=doc: record_tombstone(s, d))
        return report

    def set_tags(self, model_id: str, version: str,
                 values: Mapping[str, str]) -> dict[str, str]:
        """:func:`registry.lifecycle.tags.set_tags`, then index them; returns every tag."""
        return _committed(lambda: tags.set_tags(self.store, model_id, version, values),
                          lambda: self._sync_tags(model_id, version))

    def remove_tags(self, model_id: str, version: str, keys: Iterable[str]) -> dict[str, str]:
        """:func:`registry.lifecycle.tags.remove_tags`, then index them; returns the rest."""
        return _committed(lambda: tags.remove_tags(self.store, model_id, version, keys),
                          lambda: self._sync_tags(model_id, version))

    def _sync_tags(self, model_id: str, version: str) -> None:
        self._record(f"tags of {model_id}@{version}",
                     lambda s: sync_tags(s, self.store, model_id, version))

    def tags(self, model_id: str, version: str) -> dict[str, str]:
        """The tags of a release, read from the store."""
        return tags.read_tags(self.store, model_id, version)

    def search(self, *, model_id: str | None = None, tags: Iterable[str] = (),
               since: str | None = None, dtype: str | None = None,
               source: str | None = None) -> list[dict[str, Any]]:
        """Releases in the index matching every filter given
        (:func:`registry.index.search.search`): ``tags`` as ``KEY=VALUE`` or
        ``KEY``, ``since`` a date, time or duration back (``7d``).

        Raises:
            UsageError: a bad tag filter or ``since``.
        """
        wanted = index_search.parse_tag_filters(list(tags))
        after = index_search.parse_since(since) if since else None
        return self._query(lambda s: index_search.search(
            s, model_id=model_id, tags=wanted, since=after, dtype=dtype, source=source))
