"""What the CLI and API ask the index (DESIGN section 6).

Gate semantics are those of :mod:`registry.gating.gates`: the facts that never change
after a release (card, ledger.json, eval summary) are stored precomputed; live
revocations and policy thresholds are joined at query time, so a revocation
makes a version stop passing at once. A test checks these queries agree with
``registry.gating.gates.evaluate`` run on the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from sqlalchemy import ColumnElement, Select, case, exists, or_, select
from sqlalchemy.orm import Session

from registry.errors import NotCommittedError
from registry.gating.gates import GateResult, Threshold
from registry.index.schema import (
    Alias,
    Checkpoint,
    EvalResult,
    LedgerSource,
    Model,
    Policy,
    Release,
    ReleaseFile,
    ReleaseSource,
    ReleaseTag,
    Revocation,
    Yank,
)
from registry.index.lite import gates_of as _gates
from registry.protocol.layout import release_prefix


def model_pk(model_id: str) -> Any:
    """``models.id`` of ``model_id`` as a scalar subquery: a constant to the
    planner, so a model's releases are read in the order of the release-order
    index (a join on ``models`` makes Postgres sort all 50k releases of a big
    model, as it plans for the average model)."""
    return select(Model.id).where(Model.model_id == model_id).scalar_subquery()


def _policy(s: Session, model: str | int, require: Iterable[Threshold]) -> list[Threshold]:
    """The model's thresholds (``model``: its id, or its primary key), then ``require``."""
    pk = model if isinstance(model, int) else model_pk(model)
    rows = s.execute(select(Policy.metric, Policy.op, Policy.value)
                     .where(Policy.model_pk == pk).order_by(Policy.position)).all()
    return [Threshold(m, op, v) for m, op, v in rows] + list(require)


def _revoked() -> ColumnElement[bool]:
    return (exists().where(ReleaseSource.release_pk == Release.id,
                           ReleaseSource.source_pk == LedgerSource.id,
                           LedgerSource.source_id == Revocation.source_id))


def _yanked() -> ColumnElement[bool]:
    """The release is yanked (issue 32 item 1): it fails the ``yanked`` gate."""
    return exists().where(Yank.release_pk == Release.id)


def _meets_policy() -> ColumnElement[bool]:
    """The release meets every threshold its model's policy stores (one
    correlated condition for any number of models: no query per model)."""
    match = or_(EvalResult.metric == Policy.metric, EvalResult.task_metric == Policy.metric)
    ok = case((Policy.op == ">=", EvalResult.value >= Policy.value),
              else_=EvalResult.value <= Policy.value)
    def evals(*where: ColumnElement[bool]) -> ColumnElement[bool]:
        return (select(EvalResult.id).where(EvalResult.release_pk == Release.id, match, *where)
                .correlate(Release, Policy).exists())
    return ~(select(Policy.position).where(Policy.model_pk == Release.model_pk,
                                           or_(~evals(), evals(~ok)))
             .correlate(Release).exists())


def _meets(t: Threshold) -> list[ColumnElement[bool]]:
    match = or_(EvalResult.metric == t.metric, EvalResult.task_metric == t.metric)
    ok = EvalResult.value >= t.value if t.op == ">=" else EvalResult.value <= t.value
    return [exists().where(EvalResult.release_pk == Release.id, match),
            ~exists().where(EvalResult.release_pk == Release.id, match, ~ok)]


def passing(s: Session, model_id: str, *, require: Iterable[Threshold] = (),
            latest: bool = False) -> list[dict[str, Any]]:
    """Versions of ``model_id`` passing every gate now, newest first.

    Args:
        require: thresholds on top of the model's policy.
        latest: only the newest passing version (at most one row).
    """
    q = (select(Release.version, Release.created_at, Release.manifest_sha256, Release.dtype,
                Release.bytes, Release.uri)
         .where(Release.card_ok, Release.ledger_ok, Release.evals_passed, ~_revoked(),
                ~_yanked()))
    # the newest: read backwards along the release-order index, stopping at the
    # first that passes; all of them: from the models row (Postgres would scan
    # the whole table for a model primary key it cannot see at planning time)
    q = (q.where(Release.model_pk == model_pk(model_id)) if latest
         else q.join(Model).where(Model.model_id == model_id))
    for t in _policy(s, model_id, require):
        q = q.where(*_meets(t))
    q = q.order_by(Release.seq.desc(), Release.version.desc())
    if latest:
        q = q.limit(1)
    return [dict(r._mapping) for r in s.execute(q)]


#: what may follow a source id's family name: ``books`` names ``books-2025``,
#: ``books_v2``, ``books.en``, ``books/2025``, ``books:2025``, never ``bookshelf``
FAMILY_SEPARATORS = "-_./:"


def releases_for_source(s: Session, source_id: str) -> list[dict[str, Any]]:
    """Every release whose ledger lists ``source_id``, by model then release
    order; when none does, every release whose ledger lists a source of the
    family ``source_id`` names (``books`` -> ``books-2025``, ``books-2026``:
    the id followed by one of :data:`FAMILY_SEPARATORS`). Each row says its
    ``source_id``."""
    rows = _for_sources(s, [source_id])
    if rows:
        return rows
    family = s.scalars(select(LedgerSource.source_id).distinct().where(or_(*(
        LedgerSource.source_id.startswith(source_id + sep, autoescape=True)
        for sep in FAMILY_SEPARATORS)))).all()
    return _for_sources(s, sorted(family)) if family else []


def _for_sources(s: Session, source_ids: Sequence[str]) -> list[dict[str, Any]]:
    q = (select(Model.model_id, Release.version, Release.uri, Release.created_at,
                ReleaseSource.allowed_uses, ReleaseSource.revoked_in_file,
                LedgerSource.source_id)
         .select_from(Release).join(Model).join(ReleaseSource)
         .join(LedgerSource, LedgerSource.id == ReleaseSource.source_pk)
         .where(LedgerSource.source_id.in_(source_ids))
         .order_by(Model.model_id, Release.seq, Release.version, LedgerSource.source_id))
    revoked = set(s.scalars(select(Revocation.source_id)
                            .where(Revocation.source_id.in_(source_ids))))
    return [{**dict(r._mapping), "allowed_uses": r.allowed_uses.split(",") if r.allowed_uses
             else [], "live_revoked": r.source_id in revoked} for r in s.execute(q)]


def _release(s: Session, model_id: str, version: str) -> Any:
    """The ``releases`` row (its columns as attributes; a plain row, not an
    ORM object: loading one costs more than the query on a page)."""
    rel = s.connection().execute(
        select(Release.__table__, Yank.reason.label("yank_reason"),
               Yank.yanked_at.label("yank_at"), Yank.actor.label("yank_actor"))
        .join(Model).outerjoin(Yank, Yank.release_pk == Release.id)
        .where(Model.model_id == model_id, Release.version == version)).first()
    if rel is None:
        raise NotCommittedError(f"{model_id}@{version}: not in the index (a release that "
                                "exists in the store is added by `registry index rebuild`)",
                                path=release_prefix(model_id, version))
    return rel


def gate_results(s: Session, model_id: str, version: str, *,
                 require: Iterable[Threshold] = ()) -> list[GateResult]:
    """Every gate of one release, evaluated now, with reasons.

    Raises:
        NotCommittedError: the release is not in the index.
    """
    rel = _release(s, model_id, version)
    return release_gates(s, [rel], rel.model_pk, require=require)[rel.id]


def gate_results_many(s: Session, model_id: str, versions: Iterable[str], *,
                      require: Iterable[Threshold] = ()) -> dict[str, list[GateResult]]:
    """:func:`gate_results` of several releases of one model in four queries;
    versions the index does not hold are left out."""
    rels = s.execute(select(*GATE_COLUMNS, Release.model_pk)
                     .where(Release.model_pk == model_pk(model_id),
                            Release.version.in_(list(versions)))).all()
    if not rels:
        return {}
    gates = release_gates(s, rels, rels[0].model_pk, require=require)
    return {r.version: gates[r.id] for r in rels}


#: the columns of ``releases`` that :func:`release_gates` reads
GATE_COLUMNS = (Release.id, Release.version, Release.card_ok, Release.ledger_ok,
                Release.ledger_reason, Release.evals_passed, Release.evals_reason)


def release_gates(s: Session, rels: Sequence[Any], model: int, *,
                  require: Iterable[Threshold] = (), evals: Sequence[Any] | None = None,
                  policy: list[Threshold] | None = None) -> dict[int, list[GateResult]]:
    """The gates of releases ``rels`` of one model (rows with
    :data:`GATE_COLUMNS`; ``model`` its primary key), by release primary key:
    four queries (live revocations, yanks, eval results, policy) for any number
    of releases; two when the caller already read the page's eval results
    (``evals``: rows of release_pk, task, metric, value, in ``eval_results.id``
    order) and the model's ``policy`` (``require`` is then ignored)."""
    pks = [r.id for r in rels]
    revoked: dict[int, list[tuple[str, str]]] = {}
    for pk, sid, why in s.execute(select(ReleaseSource.release_pk, LedgerSource.source_id,
                                         Revocation.reason)
                                  .join(ReleaseSource, ReleaseSource.source_pk == LedgerSource.id)
                                  .join(Revocation, Revocation.source_id == LedgerSource.source_id)
                                  .where(ReleaseSource.release_pk.in_(pks))
                                  .order_by(LedgerSource.source_id)):
        revoked.setdefault(pk, []).append((sid, why))
    if evals is None:
        evals = s.execute(select(EvalResult.release_pk, EvalResult.task, EvalResult.metric,
                                 EvalResult.value)
                          .where(EvalResult.release_pk.in_(pks))
                          .order_by(EvalResult.id)).all()
    by_release: dict[int, list[tuple[str, str, float]]] = {}
    for e in evals:
        by_release.setdefault(e.release_pk, []).append((e.task, e.metric, e.value))
    if policy is None:
        policy = _policy(s, model, require)
    yanks = {pk: (why, at) for pk, why, at in s.execute(
        select(Yank.release_pk, Yank.reason, Yank.yanked_at).where(Yank.release_pk.in_(pks)))}
    return {r.id: _gates(r, revoked.get(r.id, []), by_release.get(r.id, []), policy,
                         yanks.get(r.id))
            for r in rels}


def show(s: Session, model_id: str, version: str) -> dict[str, Any]:
    """Manifest summary, gates with reasons, evals, sources, tags and yank of
    one release (seven queries: the gates are computed from the rows read for
    the rest; the yank comes with the release's row)."""
    rel = _release(s, model_id, version)
    files = s.execute(select(ReleaseFile.path, ReleaseFile.bytes, ReleaseFile.sha256)
                      .where(ReleaseFile.release_pk == rel.id).order_by(ReleaseFile.path)).all()
    sources = s.execute(select(LedgerSource.source_id, ReleaseSource.name, ReleaseSource.license,
                               ReleaseSource.uri, ReleaseSource.allowed_uses, Revocation.reason)
                        .join(ReleaseSource, ReleaseSource.source_pk == LedgerSource.id)
                        .outerjoin(Revocation, Revocation.source_id == LedgerSource.source_id)
                        .where(ReleaseSource.release_pk == rel.id)
                        .order_by(LedgerSource.source_id)).all()
    evals = s.execute(select(EvalResult.task, EvalResult.metric, EvalResult.value, EvalResult.n,
                             EvalResult.threshold, EvalResult.higher_is_better,
                             EvalResult.passed)
                      .where(EvalResult.release_pk == rel.id)
                      .order_by(EvalResult.id)).all()
    aliases = s.scalars(select(Alias.alias).where(Alias.model_pk == rel.model_pk,
                                                  Alias.version == version)
                        .order_by(Alias.alias)).all()
    tags = dict(s.execute(select(ReleaseTag.key, ReleaseTag.value)
                          .where(ReleaseTag.release_pk == rel.id).order_by(ReleaseTag.key)).all())
    gates = _gates(rel, [(r.source_id, r.reason) for r in sources if r.reason is not None],
                   [(e.task, e.metric, e.value) for e in evals],
                   _policy(s, rel.model_pk, ()),
                   (rel.yank_reason, rel.yank_at) if rel.yank_at is not None else None)
    return {
        "model_id": model_id, "version": version, "uri": rel.uri,
        "manifest_sha256": rel.manifest_sha256, "bytes": rel.bytes, "files": len(files),
        "dtype": rel.dtype, "created_at": rel.created_at, "aliases": list(aliases),
        "tags": tags,
        "yanked": ({"reason": rel.yank_reason, "at": rel.yank_at,
                    "actor": json.loads(rel.yank_actor)} if rel.yank_at is not None else None),
        "source": {"run_id": rel.source_run_id, "step": rel.source_step, "uri": rel.source_uri,
                   "manifest_sha256": rel.source_manifest_sha256},
        "passed": all(g.passed for g in gates), "gates": [g.to_dict() for g in gates],
        "evals": {"suite": rel.suite, "suite_version": rel.suite_version,
                  "results": [dict(r._mapping) for r in
                              sorted(evals, key=lambda e: (e.task, e.metric))]},
        "sources": [{"source_id": r.source_id, "name": r.name, "license": r.license,
                     "uri": r.uri, "allowed_uses": r.allowed_uses.split(",")
                     if r.allowed_uses else [], "revoked": r.reason is not None,
                     "revocation_reason": r.reason} for r in sources],
        "manifest": [{"path": p, "bytes": b, "sha256": h} for p, b, h in files],
    }


def model_ids(s: Session) -> list[str]:
    """Every model id in the index, sorted."""
    return list(s.execute(select(Model.model_id).order_by(Model.model_id)).scalars().all())


@cache
def _models_summary() -> Select[Any]:
    """One statement for every model, each answer read from the release-order
    index (a model may have 100k releases), policy thresholds included; the
    count is kept in the models row (counting was most of the cost). Built
    once: it has no parameter, and building it costs more than running it."""
    def newest(*where: Any) -> Any:
        return (select(Release.version).where(Release.model_pk == Model.id, *where)
                .order_by(Release.seq.desc(), Release.version.desc()).limit(1)
                .correlate(Model).scalar_subquery())
    return select(Model.model_id, Model.release_count, newest(),
                  newest(Release.card_ok, Release.ledger_ok, Release.evals_passed,
                         ~_revoked(), ~_yanked(), _meets_policy())).order_by(Model.model_id)


def ls(s: Session, model_id: str | None = None) -> list[dict[str, Any]]:
    """Models (with release counts, newest and newest passing version, aliases),
    or the releases of one model newest first."""
    if model_id is None:
        summary = s.execute(_models_summary()).all()
        by_model: dict[str, list[str]] = {}
        for m, alias in s.execute(select(Model.model_id, Alias.alias).join(Alias)
                                  .order_by(Alias.alias)):
            by_model.setdefault(m, []).append(alias)
        out = []
        for m, count, newest_version, newest_ok in summary:
            out.append({"model_id": m, "releases": count, "newest": newest_version,
                        "newest_passing": newest_ok, "aliases": by_model.get(m, [])})
        return out
    ok = {r["version"] for r in passing(s, model_id)}
    aliases: dict[str, list[str]] = {}
    for alias, version in s.execute(select(Alias.alias, Alias.version).join(Model)
                                    .where(Model.model_id == model_id)):
        aliases.setdefault(version, []).append(alias)
    rows = s.execute(select(Release.id, Release.version, Release.created_at, Release.dtype,
                            Release.bytes, Release.manifest_sha256).join(Model)
                     .where(Model.model_id == model_id)
                     .order_by(Release.seq.desc(), Release.version.desc())).all()
    pks = [r.id for r in rows]
    tags: dict[int, dict[str, str]] = {}
    for pk, k, v in s.execute(select(ReleaseTag.release_pk, ReleaseTag.key, ReleaseTag.value)
                              .where(ReleaseTag.release_pk.in_(pks)).order_by(ReleaseTag.key)):
        tags.setdefault(pk, {})[k] = v
    yanked = set(s.scalars(select(Yank.release_pk).where(Yank.release_pk.in_(pks))))
    return [{**{k: v for k, v in r._mapping.items() if k != "id"},
             "passing": r.version in ok, "aliases": sorted(aliases.get(r.version, [])),
             "tags": tags.get(r.id, {}), "yanked": r.id in yanked} for r in rows]


def diff(s: Session, model_id: str, a: str, b: str) -> dict[str, Any]:
    """Files added, removed and changed (by sha256) from ``a`` to ``b``; eval deltas."""
    ra, rb = _release(s, model_id, a), _release(s, model_id, b)

    def files(rel: Any) -> dict[str, tuple[int, str]]:
        return {p: (n, h) for p, n, h in s.execute(
            select(ReleaseFile.path, ReleaseFile.bytes, ReleaseFile.sha256)
            .where(ReleaseFile.release_pk == rel.id))}

    def evals(rel: Any) -> dict[str, float]:
        return {f"{t}/{m}": v for t, m, v in s.execute(
            select(EvalResult.task, EvalResult.metric, EvalResult.value)
            .where(EvalResult.release_pk == rel.id))}

    fa, fb = files(ra), files(rb)
    ea, eb = evals(ra), evals(rb)
    return {
        "model_id": model_id, "a": a, "b": b,
        "added": sorted(set(fb) - set(fa)), "removed": sorted(set(fa) - set(fb)),
        "changed": sorted(p for p in set(fa) & set(fb) if fa[p][1] != fb[p][1]),
        "unchanged": sorted(p for p in set(fa) & set(fb) if fa[p][1] == fb[p][1]),
        "evals": [{"metric": k, "a": ea.get(k), "b": eb.get(k),
                   "delta": (eb[k] - ea[k]) if k in ea and k in eb else None}
                  for k in sorted(set(ea) | set(eb))],
    }


def checkpoints(s: Session, run_id: str) -> list[dict[str, Any]]:
    rows = s.execute(select(Checkpoint.step, Checkpoint.uri, Checkpoint.manifest_sha256,
                            Checkpoint.bytes, Checkpoint.created_at)
                     .where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)).all()
    return [dict(r._mapping) for r in rows]


def revocations(s: Session) -> list[dict[str, Any]]:
    rows = s.execute(select(Revocation.source_id, Revocation.revoked_at, Revocation.reason)
                     .order_by(Revocation.source_id)).all()
    return [dict(r._mapping) for r in rows]
