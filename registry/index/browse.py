"""What ``registry serve`` asks the index: one page of a list, and summaries.

Lists that grow with the registry (a model's versions, the releases trained
on a data source) are read one page at a time with keyset pagination: a page
is the ``size`` rows after (or before) a cursor row, read from the index that
orders them (``ix_releases_model_created``, ``ix_release_sources_source_release``),
so page 1 and page 2,000 of a model with 100k releases cost the same (an
OFFSET would read and drop every row before the page). Each function runs a
fixed number of statements whatever the number of releases (a test counts
them). Gates are those of :mod:`registry.index.queries`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal, select, tuple_
from sqlalchemy.orm import Session

from registry.errors import NotCommittedError
from registry.gating.gates import GateResult, Threshold
from registry.index.queries import GATE_COLUMNS, ls, release_gates
from registry.index.schema import (
    Alias,
    Checkpoint,
    EvalResult,
    LedgerSource,
    Model,
    Policy,
    Release,
    ReleaseSource,
    Revocation,
)
from registry.protocol.layout import model_root


@dataclass(frozen=True, slots=True)
class Page:
    """Rows of one page, newest first, and the cursors of its neighbours.

    ``newer``/``older``: the cursor to pass as ``after``/``before`` for the
    page of newer/older rows, None when there is none. ``total``: rows in the
    whole list."""

    rows: list[dict[str, Any]]
    total: int
    newer: str | None
    older: str | None


def _page(rows: list[Any], size: int, *, before: object, after: object,
          cursor: Any) -> tuple[list[Any], str | None, str | None]:
    """Trim the ``size + 1`` rows read (newest first; ascending when paging
    ``after``) to ``size`` and name the neighbour pages' cursors."""
    more = len(rows) > size
    rows = rows[:size]
    if after is not None:
        rows.reverse()
    if not rows:
        return rows, None, None
    newer = cursor(rows[0]) if (after is not None and more) or before is not None else None
    older = cursor(rows[-1]) if (after is None and more) or after is not None else None
    return rows, newer, older


def model_page(s: Session, model_id: str, *, size: int, before: str | None = None,
               after: str | None = None) -> dict[str, Any]:
    """One page of a model's versions, newest first (the release order
    ``seq``, then version), each with its gates evaluated now; the eval results of the page,
    the model's aliases and policy. Six statements (the cursor is read by the
    page's own).

    Args:
        size: versions per page.
        before: a version: the page of versions older than it.
        after: a version: the page of versions newer than it.

    Returns:
        ``{"page": Page (rows: version, created_at, dtype, bytes,
        manifest_sha256, gates), "evals": rows (release_pk, task, metric,
        value, threshold), "release_pks": {version: pk}, "aliases": [(alias,
        version)], "policy": [(metric, op, value)]}``.

    Raises:
        NotCommittedError: no such model in the index, or the cursor names no
            version of it.
    """
    head = s.execute(select(Model.id, Model.release_count)
                     .where(Model.model_id == model_id)).first()
    if head is None:
        raise NotCommittedError(f"model {model_id!r}: no such model in the index",
                                path=model_root(model_id))
    mpk, total = head
    q = select(*GATE_COLUMNS, Release.created_at, Release.dtype, Release.bytes,
               Release.manifest_sha256).where(Release.model_pk == mpk)
    cursor = before if before is not None else after
    if cursor is not None:
        # the cursor's own key, read by the same statement (one round trip)
        at = tuple_(select(Release.seq).where(Release.model_pk == mpk,
                                                     Release.version == cursor)
                    .scalar_subquery(), literal(cursor))
        key = tuple_(Release.seq, Release.version)
        q = q.where(key < at if before is not None else key > at)
    order = ((Release.seq.asc(), Release.version.asc()) if after is not None
             else (Release.seq.desc(), Release.version.desc()))
    rows, newer, older = _page(s.execute(q.order_by(*order).limit(size + 1)).all(), size,
                               before=before, after=after, cursor=lambda r: r.version)
    if not rows and cursor is not None and s.scalar(
            select(Release.id).where(Release.model_pk == mpk, Release.version == cursor)) is None:
        raise NotCommittedError(f"{model_id}@{cursor}: no such version in the index "
                                "(the page cursor)", path=f"{model_root(model_id)}/{cursor}")
    evals = s.execute(select(EvalResult.release_pk, EvalResult.task, EvalResult.metric,
                             EvalResult.value, EvalResult.threshold)
                      .where(EvalResult.release_pk.in_([r.id for r in rows]))
                      .order_by(EvalResult.id)).all()
    aliases = s.execute(select(Alias.alias, Alias.version).where(Alias.model_pk == mpk)
                        .order_by(Alias.alias)).all()
    policy = [tuple(p) for p in s.execute(select(Policy.metric, Policy.op, Policy.value)
                                          .where(Policy.model_pk == mpk)
                                          .order_by(Policy.position))]
    gates: dict[int, list[GateResult]] = (
        release_gates(s, rows, mpk, evals=evals, policy=[Threshold(*p) for p in policy])
        if rows else {})
    return {"page": Page([{"version": r.version, "created_at": r.created_at, "dtype": r.dtype,
                           "bytes": r.bytes, "manifest_sha256": r.manifest_sha256,
                           "gates": gates[r.id]} for r in rows], total, newer, older),
            "evals": evals, "release_pks": {r.version: r.id for r in rows},
            "aliases": [tuple(a) for a in aliases], "policy": policy}


def source_page(s: Session, source_id: str, *, size: int, before: str | None = None,
                after: str | None = None) -> dict[str, Any] | None:
    """What the index knows of a data source and one page of the releases
    trained on it, newest indexed first. Two statements.

    Args:
        size: releases per page.
        before, after: a release ``MODEL_ID@VERSION`` on the list: the page
            indexed before (after) it.

    Returns:
        ``{"name", "uri", "license", "page": Page (rows: model_id, version,
        uri, created_at, allowed_uses)}``, or None when no release lists the
        source.

    Raises:
        NotCommittedError: the cursor names no release trained on the source.
    """
    src = s.execute(select(LedgerSource.id, LedgerSource.name, LedgerSource.uri,
                           LedgerSource.license,
                           select(func.count()).where(ReleaseSource.source_pk == LedgerSource.id)
                           .correlate(LedgerSource).scalar_subquery())
                    .where(LedgerSource.source_id == source_id)).first()
    if src is None:
        return None
    q = (select(Model.model_id, Release.version, Release.uri, Release.created_at,
                ReleaseSource.allowed_uses, ReleaseSource.release_pk)
         .select_from(ReleaseSource).join(Release, Release.id == ReleaseSource.release_pk)
         .join(Model, Model.id == Release.model_pk).where(ReleaseSource.source_pk == src.id))
    cursor = before if before is not None else after
    at = None
    if cursor is not None:
        model_id, _, version = cursor.partition("@")
        at = (select(ReleaseSource.release_pk)
              .join(Release, Release.id == ReleaseSource.release_pk)
              .join(Model, Model.id == Release.model_pk)
              .where(ReleaseSource.source_pk == src.id, Model.model_id == model_id,
                     Release.version == version).scalar_subquery())
        q = q.where(ReleaseSource.release_pk < at if before is not None
                    else ReleaseSource.release_pk > at)
    order = ReleaseSource.release_pk.asc() if after is not None else ReleaseSource.release_pk.desc()
    rows, newer, older = _page(s.execute(q.order_by(order).limit(size + 1)).all(), size,
                               before=before, after=after,
                               cursor=lambda r: f"{r.model_id}@{r.version}")
    if not rows and at is not None and s.scalar(select(at)) is None:
        raise NotCommittedError(f"{cursor}: no release of that name is trained on "
                                f"{source_id!r} (the page cursor)", path=cursor)
    return {"name": src.name, "uri": src.uri, "license": src.license,
            "page": Page([{"model_id": r.model_id, "version": r.version, "uri": r.uri,
                           "created_at": r.created_at,
                           "allowed_uses": r.allowed_uses.split(",") if r.allowed_uses
                           else []} for r in rows], src[4] or 0, newer, older)}


def home(s: Session) -> dict[str, Any]:
    """The index page: models (the ``registry ls`` document), runs with their
    checkpoint count and newest step, the revoked data sources (only those:
    there may be thousands of live ones) and how many sources there are.
    Five statements, whatever the number of models, policies and releases."""
    runs = s.execute(select(Checkpoint.run_id, func.count(), func.max(Checkpoint.step))
                     .group_by(Checkpoint.run_id).order_by(Checkpoint.run_id)).all()
    sources = s.execute(select(Revocation.source_id, LedgerSource.name, LedgerSource.license,
                               Revocation.reason)
                        .outerjoin(LedgerSource, Revocation.source_id == LedgerSource.source_id)
                        .order_by(Revocation.source_id)).all()
    return {"models": ls(s),
            "runs": [{"run_id": r, "checkpoints": n, "newest_step": m} for r, n, m in runs],
            "sources": [{"source_id": sid, "name": name, "license": lic, "revoked": True,
                         "revocation_reason": reason}
                        for sid, name, lic, reason in sources],
            "source_count": s.scalar(select(func.count(LedgerSource.id)))}
