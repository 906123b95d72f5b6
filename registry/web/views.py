"""What each page shows: lists from the index, documents from the store.

Every function here only reads. Lists that can grow with the registry (a
model's versions, the releases trained on a source) are paged
(:data:`PAGE_SIZE` rows), so a page costs the same with 100 releases or
100,000 (``bench/web_bench.py``). Gate status and reasons come from
:func:`registry.index.queries.gate_results`, the same evaluation ``registry
show`` prints.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from registry.api import Registry
from registry.checkpoint import CheckpointTree, run_root
from registry.errors import NotCommittedError, PointerError, RegistryError
from registry.index import queries
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
from registry.ledger import PREFIX as REVOCATIONS
from registry.names import check_name
from registry.store import join
from registry.web.charts import Chart, Series

PAGE_SIZE = 50
#: the newest checkpoints of a run whose trainer state is read for the loss chart
RUN_CHART_STEPS = 100
#: documents larger than this (bytes) are not rendered inline
MAX_DOCUMENT = 1 << 20


@dataclass(frozen=True, slots=True)
class Paging:
    """Page ``number`` (1-based) of ``total`` rows, ``size`` per page."""

    number: int
    size: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def offset(self) -> int:
        return (self.number - 1) * self.size


def _paging(page: int, total: int) -> Paging:
    p = Paging(max(1, page), PAGE_SIZE, total)
    return p if p.number <= p.pages else Paging(p.pages, PAGE_SIZE, total)


def index_view(reg: Registry) -> dict[str, Any]:
    """Models (the ``registry ls`` document), runs, and the revoked data sources."""
    def q(s: Session) -> dict[str, Any]:
        runs = s.execute(select(Checkpoint.run_id, func.count(Checkpoint.id),
                                func.max(Checkpoint.step))
                         .group_by(Checkpoint.run_id).order_by(Checkpoint.run_id)).all()
        # only the revoked sources: there may be thousands of live ones, each
        # reachable from the ledger of the versions trained on it
        sources = s.execute(select(Revocation.source_id, LedgerSource.name,
                                   LedgerSource.license, Revocation.reason)
                            .outerjoin(LedgerSource,
                                       Revocation.source_id == LedgerSource.source_id)
                            .order_by(Revocation.source_id)).all()
        source_count = s.scalar(select(func.count(LedgerSource.id)))
        return {"models": queries.ls(s),
                "runs": [{"run_id": r, "checkpoints": n, "newest_step": m}
                         for r, n, m in runs],
                "sources": [{"source_id": sid, "name": name, "license": lic,
                             "revoked": True, "revocation_reason": reason}
                            for sid, name, lic, reason in sources],
                "source_count": source_count}
    return reg.index.run(q)


def model_view(reg: Registry, model_id: str, page: int = 1) -> dict[str, Any]:
    """One page of a model's versions, newest first, each with its gates; a
    chart per eval metric across those versions with their thresholds.

    Raises:
        InvalidNameError: ``model_id`` breaks the naming rule.
        NotCommittedError: the index knows no such model.
    """
    check_name(model_id, "model_id")

    def q(s: Session) -> dict[str, Any]:
        mpk = s.scalar(select(Model.id).where(Model.model_id == model_id))
        if mpk is None:
            raise NotCommittedError(f"model {model_id!r}: no such model in the index",
                                    path=join("models", model_id))
        total = s.scalar(select(func.count()).select_from(Release)
                          .where(Release.model_pk == mpk)) or 0
        paging = _paging(page, total)
        rows = s.execute(select(Release.id, Release.version, Release.created_at, Release.dtype,
                                Release.bytes, Release.manifest_sha256)
                         .where(Release.model_pk == mpk)
                         .order_by(Release.created_at.desc(), Release.version.desc())
                         .limit(paging.size).offset(paging.offset)).all()
        by_version: dict[str, list[str]] = {}
        aliases = s.execute(select(Alias.alias, Alias.version).where(Alias.model_pk == mpk)
                            .order_by(Alias.alias)).all()
        for alias, version in aliases:
            by_version.setdefault(version, []).append(alias)
        versions = []
        page_gates = queries.gate_results_many(s, model_id, [r.version for r in rows])
        for r in rows:
            gates = page_gates[r.version]
            versions.append({"version": r.version, "created_at": r.created_at,
                             "dtype": r.dtype, "bytes": r.bytes,
                             "manifest_sha256": r.manifest_sha256,
                             "passed": all(g.passed for g in gates),
                             "failing": [g.to_dict() for g in gates if not g.passed],
                             "aliases": by_version.get(r.version, [])})
        evals = s.execute(select(EvalResult.release_pk, EvalResult.task, EvalResult.metric,
                                 EvalResult.value, EvalResult.threshold)
                          .where(EvalResult.release_pk.in_([r.id for r in rows]))).all()
        policy = s.execute(select(Policy.metric, Policy.op, Policy.value)
                           .where(Policy.model_pk == mpk).order_by(Policy.position)).all()
        oldest_first = [r.version for r in reversed(rows)]
        pk_to_x = {r.id: oldest_first.index(r.version) for r in rows}
        return {"model_id": model_id, "paging": paging, "versions": versions,
                "aliases": [{"alias": a, "version": v} for a, v in aliases],
                "policy": [f"{m}{op}{v:g}" for m, op, v in policy],
                "charts": _eval_charts(oldest_first, pk_to_x, evals, policy)}
    return reg.index.run(q)


def _eval_charts(labels: list[str], pk_to_x: dict[int, int], evals: Sequence[Any],
                 policy: Sequence[Any]) -> list[Chart]:
    """One chart per ``task/metric``: its value per version, the threshold its
    eval summary stated (dashed), and any policy threshold on it (dashed)."""
    per_metric: dict[str, dict[int, tuple[float, float]]] = {}
    for pk, task, metric, value, threshold in evals:
        per_metric.setdefault(f"{task}/{metric}", {})[pk_to_x[pk]] = (value, threshold)
    charts = []
    for name in sorted(per_metric):
        points = per_metric[name]
        chart = Chart(name, labels, y_label=name.partition("/")[2])
        chart.series.append(Series(name, [(i, points[i][0] if i in points else None)
                                          for i in range(len(labels))]))
        chart.series.append(Series("threshold (eval summary)",
                                   [(i, points[i][1] if i in points else None)
                                    for i in range(len(labels))], dashed=True))
        metric = name.partition("/")[2]
        for m, op, v in policy:
            if m in (name, metric):
                chart.series.append(Series(f"policy {m}{op}{v:g}",
                                           [(i, v) for i in range(len(labels))], dashed=True))
        charts.append(chart)
    return charts


def _read_text(reg: Registry, key: str, size: int) -> str | None:
    if size > MAX_DOCUMENT:
        return None
    return reg.store.read_bytes(key).decode("utf-8", "replace")


def version_view(reg: Registry, model_id: str, ref: str) -> dict[str, Any]:
    """One release: the ``registry show`` document plus, from the store, its
    model card, ledger rows, heads and signature.

    Raises:
        InvalidNameError: a name breaks the naming rule.
        NotCommittedError: no such version or alias (store), or not indexed.
    """
    model_id, version = reg.resolve(f"{check_name(model_id, 'model_id')}@"
                                    f"{check_name(ref, 'version or alias')}")
    doc = reg.show(model_id, version)
    prefix = join("models", model_id, version)
    sizes = {f["path"]: f["bytes"] for f in doc["manifest"]}
    card = (_read_text(reg, join(prefix, "MODEL_CARD.md"), sizes["MODEL_CARD.md"])
            if "MODEL_CARD.md" in sizes else None)
    live = {s["source_id"]: s for s in doc["sources"]}
    ledger: list[dict[str, Any]] = []
    ledger_error = None
    if "ledger.json" in sizes:
        try:
            rows = json.loads(_read_text(reg, join(prefix, "ledger.json"),
                                         sizes["ledger.json"]) or "[]")
            for row in rows:
                src = live.get(row.get("source_id"), {})
                ledger.append({**row, "live_revoked": bool(src.get("revoked")),
                               "live_reason": src.get("revocation_reason")})
        except (ValueError, TypeError, AttributeError) as e:
            ledger_error = f"ledger.json: {e}"
    heads = []
    for path in sorted(p for p in sizes if p.startswith("heads/") and p.endswith(".json")):
        try:
            head = json.loads(_read_text(reg, join(prefix, path), sizes[path]) or "{}")
            heads.append({"path": path, "name": head.get("name"),
                          "input_dim": head.get("input_dim"), "labels": head.get("labels"),
                          "pooling": head.get("pooling")})
        except (ValueError, AttributeError) as e:
            heads.append({"path": path, "error": str(e)})
    signatures = [_signature(doc["signature"])] if doc.get("signature") else []
    store_url = reg.store.url
    pull = (f"registry pull {shlex.quote(f'{model_id}@{version}')} "
            f"--store {shlex.quote(store_url)}")
    return {"doc": doc, "ref": ref, "card": card, "ledger": ledger,
            "ledger_error": ledger_error, "heads": heads, "signatures": signatures,
            "pull": pull}


def _signature(sig: dict[str, Any]) -> dict[str, Any]:
    """The signer row of a signed release (``model.sig``, OpenSSF model signing):
    the signing key's fingerprint, and whether the model's policy keys verified
    it (only a pull with ``--trusted-key`` is a security check; see the README)."""
    state = {True: "verified against the policy's keys",
             False: "NOT verified by the policy's keys",
             None: "not verified here"}[sig.get("verified")]
    if sig.get("kind") == "certificate":
        return {"file": sig["path"], "signer": f"certificate {sig['subject']} "
                                               f"({sig['fingerprint']}, issued by "
                                               f"{sig['issuer']}; {state})"}
    return {"file": sig["path"], "signer": f"key {sig['fingerprint']} ({state})"}


def source_view(reg: Registry, source_id: str, page: int = 1) -> dict[str, Any]:
    """A data source: what the index knows of it, its revocation (read from the
    store's live ledger), and one page of the releases trained on it.

    Raises:
        InvalidNameError: ``source_id`` breaks the naming rule.
        NotCommittedError: no release lists the source and it is not revoked.
    """
    check_name(source_id, "source_id")
    revocation = None
    try:
        revocation = json.loads(reg.store.read_bytes(join(REVOCATIONS, f"{source_id}.json")))
    except FileNotFoundError:
        pass

    def q(s: Session) -> dict[str, Any]:
        src = s.execute(select(LedgerSource.id, LedgerSource.name, LedgerSource.uri,
                               LedgerSource.license)
                        .where(LedgerSource.source_id == source_id)).first()
        if src is None and revocation is None:
            raise NotCommittedError(f"data source {source_id!r}: no release lists it and it "
                                    "is not revoked", path=join(REVOCATIONS, source_id))
        total = (s.scalar(select(func.count()).select_from(ReleaseSource)
                          .where(ReleaseSource.source_pk == src.id)) or 0) if src else 0
        paging = _paging(page, total)
        # newest indexed first: the page is read from the (source_pk, release_pk)
        # index; ordering 20k releases by model and age would cost a join each
        pks = s.scalars(select(ReleaseSource.release_pk)
                        .where(ReleaseSource.source_pk == src.id)
                        .order_by(ReleaseSource.release_pk.desc())
                        .limit(paging.size).offset(paging.offset)).all() if src else []
        rows = s.execute(select(Model.model_id, Release.version, Release.uri,
                                Release.created_at, ReleaseSource.allowed_uses)
                         .select_from(Release).join(Model).join(ReleaseSource)
                         .where(ReleaseSource.release_pk.in_(pks),
                                ReleaseSource.source_pk == (src.id if src else -1))
                         .order_by(Release.id.desc())).all()
        releases = [{**dict(r._mapping), "allowed_uses": r.allowed_uses.split(",")
                     if r.allowed_uses else []} for r in rows]
        return {"source_id": source_id, "paging": paging, "releases": releases,
                "name": src.name if src else None, "uri": src.uri if src else None,
                "license": src.license if src else None}
    return {**reg.index.run(q), "revocation": revocation}


def run_view(reg: Registry, run_id: str) -> dict[str, Any]:
    """A training run: its committed checkpoints (index; the store's step
    directories when the index has none), the step LATEST names, and the
    training loss each step's ``trainer_state.json`` recorded, as a chart.

    Raises:
        InvalidNameError: ``run_id`` breaks the naming rule.
        NotCommittedError: neither the index nor the store has a checkpoint of it.
    """
    check_name(run_id, "run_id")
    tree = CheckpointTree(reg.store, run_root(run_id))
    steps = [{"step": c["step"], "bytes": c["bytes"], "created_at": c["created_at"],
              "manifest_sha256": c["manifest_sha256"]} for c in reg.checkpoints(run_id)]
    if not steps:
        from registry.verify import read_manifest
        for step in tree.steps():
            try:
                m = read_manifest(reg.store, tree.prefix(step))
            except RegistryError:
                continue
            steps.append({"step": step, "bytes": m.total_size, "created_at": m.created_at,
                          "manifest_sha256": m.digest})
    latest, latest_error = None, None
    try:
        latest = tree.latest()
    except PointerError as e:
        latest_error = str(e)
    if not steps and latest is None:
        raise NotCommittedError(f"run {run_id!r}: no committed checkpoint in the index or "
                                f"under {reg.store.url_of(tree.root)}", path=tree.root)
    charted = steps[-RUN_CHART_STEPS:]

    def loss(step: int) -> float | None:
        try:
            state = json.loads(reg.store.read_bytes(join(tree.prefix(step),
                                                         "trainer_state.json")))
        except (FileNotFoundError, ValueError, RegistryError):
            return None
        value = state.get("loss") if isinstance(state, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    with ThreadPoolExecutor(max_workers=8) as pool:  # one small GET each on S3
        losses = list(pool.map(loss, [c["step"] for c in charted]))
    for c, v in zip(charted, losses):
        c["loss"] = v
    chart = Chart("training loss", [str(c["step"]) for c in charted],
                  [Series("loss", [(i, v) for i, v in enumerate(losses)])], y_label="loss")
    return {"run_id": run_id, "tree": reg.store.url_of(tree.root), "steps": steps,
            "latest": latest, "latest_error": latest_error, "chart": chart,
            "charted": len(charted)}
