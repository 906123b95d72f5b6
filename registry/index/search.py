"""Searching releases in the index: ``registry query --tag --since --dtype --source``
and the web's search box (issue 32 item 3).

Every filter is optional and they combine with AND. Tags are matched through
``release_tags`` (indexed by ``(key, value)``); the rows carry each release's
tags and whether it is yanked, in two more queries for the whole page.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from registry.errors import UsageError
from registry.index.schema import (
    LedgerSource,
    Model,
    Release,
    ReleaseSource,
    ReleaseTag,
    Yank,
)

#: most rows one search returns.
MAX_ROWS = 1000


def parse_since(text: str, *, now: datetime | None = None) -> str:
    """``--since``: an RFC 3339 time or date (``2026-11-30``,
    ``2026-11-30T12:00:00Z``) or a duration back from now (``7d``, ``12h``),
    as the index's ``created_at`` strings compare (UTC, microseconds).

    Raises:
        UsageError: neither.
    """
    from registry.lifecycle.gc import parse_duration

    t = text.strip()
    when: datetime
    try:
        when = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        try:
            seconds = parse_duration(t, what="--since")
        except UsageError:
            raise UsageError(f"--since {text!r}: expected a date or time (2026-11-30, "
                             "2026-11-30T12:00:00Z) or a duration back from now (7d, 12h)"
                             ) from None
        when = (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_tag_filters(items: list[str]) -> dict[str, str | None]:
    """``["team=nlp", "reviewed"]`` -> ``{"team": "nlp", "reviewed": None}``
    (a key alone: the release has that tag, any value).

    Raises:
        UsageError: a bad key or value.
    """
    from registry.lifecycle.tags import check_tag

    out: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        check_tag(key, value)
        out[key] = value if sep else None
    return out


def _dtype(d: str) -> Any:
    d = d.strip().lower()
    return or_(Release.dtype == d, Release.dtype.like(f"{d} (%"),
               Release.dtype.like(f"{d}+%"), Release.dtype.like(f"%+{d}"))


def search(s: Session, *, model_id: str | None = None,
           tags: Mapping[str, str | None] | None = None, since: str | None = None,
           dtype: str | None = None, source: str | None = None,
           limit: int = MAX_ROWS) -> list[dict[str, Any]]:
    """Releases matching every filter given, by model, newest first.

    Args:
        model_id: only this model's releases.
        tags: key -> value (None: any value) the release must carry.
        since: created at or after this time (:func:`parse_since`'s form).
        dtype: the stored dtype label is, starts with or contains this
            (``bf16``, ``int4``, ``f32``).
        source: the release's source run id or URI, or a data source id its
            ledger lists.
        limit: at most this many rows.

    Returns:
        ``{"model_id", "version", "created_at", "dtype", "bytes",
        "manifest_sha256", "uri", "tags": {...}, "yanked": bool}`` per release.
    """
    q = (select(Release.id, Model.model_id, Release.version, Release.created_at, Release.dtype,
                Release.bytes, Release.manifest_sha256, Release.uri)
         .join(Model, Model.id == Release.model_pk))
    if model_id is not None:
        q = q.where(Model.model_id == model_id)
    for key, value in (tags or {}).items():
        cond = [ReleaseTag.release_pk == Release.id, ReleaseTag.key == key]
        if value is not None:
            cond.append(ReleaseTag.value == value)
        q = q.where(exists().where(*cond))
    if since is not None:
        q = q.where(Release.created_at >= since)
    if dtype:
        q = q.where(_dtype(dtype))
    if source:
        q = q.where(or_(Release.source_run_id == source, Release.source_uri == source,
                        exists().where(ReleaseSource.release_pk == Release.id,
                                       ReleaseSource.source_pk == LedgerSource.id,
                                       LedgerSource.source_id == source)))
    q = q.order_by(Model.model_id, Release.seq.desc(), Release.version.desc()).limit(limit)
    rows = s.execute(q).all()
    pks = [r.id for r in rows]
    by_pk: dict[int, dict[str, str]] = {}
    yanked: set[int] = set()
    if pks:
        for pk, k, v in s.execute(select(ReleaseTag.release_pk, ReleaseTag.key,
                                         ReleaseTag.value)
                                  .where(ReleaseTag.release_pk.in_(pks))
                                  .order_by(ReleaseTag.key)):
            by_pk.setdefault(pk, {})[k] = v
        yanked = set(s.scalars(select(Yank.release_pk).where(Yank.release_pk.in_(pks))))
    return [{"model_id": r.model_id, "version": r.version, "created_at": r.created_at,
             "dtype": r.dtype, "bytes": r.bytes, "manifest_sha256": r.manifest_sha256,
             "uri": r.uri, "tags": by_pk.get(r.id, {}), "yanked": r.id in yanked}
            for r in rows]
