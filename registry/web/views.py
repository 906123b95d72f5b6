"""What each page shows: lists from the index, documents from the store.

Every function here only reads, and asks the index through
:mod:`registry.index.browse` and :mod:`registry.index.queries` (the SQL lives
there, once). Lists that can grow with the registry (a model's versions, the
releases trained on a source) are keyset paged (:data:`PAGE_SIZE` rows after
a cursor), so a page costs the same with 100 releases or 100,000
(``bench/web_bench.py``; a test counts each page's SQL statements). Gate
status and reasons are the evaluation ``registry show`` prints. A release's
small files (card, ledger.json, heads) are read once per sha256
(:class:`registry.web.cache.ReleaseFiles`); what can change (aliases,
revocations, policies, LATEST) is read on every request.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from registry.rules import limits, schemas
from registry.api import Registry
from registry.checkpoint import CheckpointTree
from registry.errors import InvalidNameError, NotCommittedError, PointerError, RegistryError
from registry.index import browse
from registry.protocol.layout import REVOCATIONS, release_prefix, run_root
from registry.gating.ledger import revocation_of
from registry.rules.names import check_model_id, check_name
from registry.store import join
from registry.web.cache import ReleaseFiles
from registry.web.charts import Chart, Series
from registry.web.render import markdown

PAGE_SIZE = 50
#: the newest checkpoints of a run whose trainer state is read for the loss chart
RUN_CHART_STEPS = 100


def finite(value: Any) -> float | None:
    """``value`` as a finite float, None for anything else (a loss of 400
    digits, a string, ``1e999``): a store document cannot break a chart."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def index_view(reg: Registry) -> dict[str, Any]:
    """Models (the ``registry ls`` document), runs, and the revoked data sources."""
    return reg.index.read(browse.home)


def _one_cursor(before: str | None, after: str | None) -> None:
    """A page is older than one cursor or newer than one, never both."""
    if before is not None and after is not None:
        raise InvalidNameError("give ?before= or ?after=, not both")


def model_view(reg: Registry, model_id: str, *, before: str | None = None,
               after: str | None = None) -> dict[str, Any]:
    """One page of a model's versions, newest first, each with its gates; a
    chart per eval metric across those versions with their thresholds.

    Args:
        before, after: a version: show the page older (newer) than it.

    Raises:
        InvalidNameError: ``model_id`` or a cursor breaks the naming rule, or
            both cursors are given.
        NotCommittedError: the index knows no such model, or no such cursor version.
    """
    check_model_id(model_id)
    _one_cursor(before, after)
    for cursor in (before, after):
        if cursor is not None:
            check_name(cursor, "version")
    got = reg.index.read(lambda s: browse.model_page(s, model_id, size=PAGE_SIZE,
                                                     before=before, after=after))
    page: browse.Page = got["page"]
    by_version: dict[str, list[str]] = {}
    for alias, version in got["aliases"]:
        by_version.setdefault(version, []).append(alias)
    versions = [{**{k: v for k, v in r.items() if k != "gates"},
                 "passed": all(g.passed for g in r["gates"]),
                 "failing": [g.to_dict() for g in r["gates"] if not g.passed],
                 "aliases": by_version.get(r["version"], [])} for r in page.rows]
    oldest_first = [r["version"] for r in reversed(page.rows)]
    x_of = {v: i for i, v in enumerate(oldest_first)}
    pk_to_x = {pk: x_of[v] for v, pk in got["release_pks"].items()}
    policy = got["policy"]
    return {"model_id": model_id, "page": page, "versions": versions,
            "aliases": [{"alias": a, "version": v} for a, v in got["aliases"]],
            "policy": [f"{m}{op}{v:g}" for m, op, v in policy],
            "charts": _eval_charts(oldest_first, pk_to_x,
                                   [(e.release_pk, e.task, e.metric, e.value, e.threshold)
                                    for e in got["evals"]], policy)}


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


def version_view(reg: Registry, model_id: str, ref: str,
                 files: ReleaseFiles | None = None) -> dict[str, Any]:
    """One release: the ``registry show`` document plus, from the store, its
    model card, ledger rows, heads and signature.

    Args:
        files: where the release's small files are cached (by sha256); None
            reads them from the store.

    Raises:
        InvalidNameError: a name breaks the naming rule.
        NotCommittedError: no such version or alias (store), or not indexed.
    """
    model_id, version = reg.resolve(f"{check_model_id(model_id)}@"
                                    f"{check_name(ref, 'version or alias')}")
    doc = reg.show(model_id, version)
    prefix = release_prefix(model_id, version)
    entries = {f["path"]: f for f in doc["manifest"]}
    files = files or ReleaseFiles(reg.store, max_bytes=0)

    def read(path: str) -> tuple[str, bool] | None:
        f = entries.get(path)
        if f is None or f["bytes"] > limits.MAX_RENDERED_BYTES:
            return None
        # the manifest's size bounds the read: a store writer's 256 MiB card
        # behind an index that says 862 B is refused, not rendered
        return files.text(join(prefix, path), f["sha256"], limit=f["bytes"])

    card = None
    got = read("MODEL_CARD.md")
    if got is not None:
        text, verified = got
        card = (files.derived("markdown", entries["MODEL_CARD.md"]["sha256"],
                              lambda: markdown(text), 2 * len(text))
                if verified else markdown(text))
    live = {s["source_id"]: s for s in doc["sources"]}
    ledger: list[dict[str, Any]] = []
    ledger_error = None
    got = read("ledger.json")
    if got is not None:
        try:
            for row in schemas.load_json((got[0] or "[]").encode(), path="ledger.json"):
                src = live.get(row.get("source_id"), {})
                ledger.append({**row, "live_revoked": bool(src.get("revoked")),
                               "live_reason": src.get("revocation_reason")})
        except (ValueError, TypeError, AttributeError) as e:
            ledger_error = f"ledger.json: {e}"
    heads = []
    for path in sorted(p for p in entries if p.startswith("heads/") and p.endswith(".json")):
        try:
            got = read(path)
            head = schemas.load_json((got[0] if got else "{}").encode(), path=path)
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


def search_view(reg: Registry, *, tag: str | None = None, since: str | None = None,
                dtype: str | None = None, source: str | None = None,
                model: str | None = None) -> dict[str, Any]:
    """The search page (issue 32 item 3): releases matching every filter
    given; ``tag`` holds one or more ``KEY=VALUE`` (or ``KEY``) separated by
    spaces. No filter: the newest releases.

    Raises:
        UsageError, InvalidNameError: a malformed filter (a 400 page).
    """
    from registry.index.search import MAX_ROWS

    tags = (tag or "").split()
    model_id = check_model_id(model.strip()) if model and model.strip() else None
    rows = reg.search(model_id=model_id, tags=tags, since=(since or "").strip() or None,
                      dtype=(dtype or "").strip() or None,
                      source=(source or "").strip() or None)
    return {"rows": rows, "truncated": len(rows) >= MAX_ROWS,
            "query": {"tag": tag or "", "since": since or "", "dtype": dtype or "",
                      "source": source or "", "model": model or ""}}


def _signature(sig: dict[str, Any]) -> dict[str, Any]:
    """The signer row of a signed release (``model.sig``, OpenSSF model signing):
    the signing key's fingerprint, and whether the model's policy keys verified
    it (only a pull with ``--trusted-key`` is a security check; see docs/guarantees.md)."""
    state = {True: "verified against the policy's keys",
             False: "NOT verified by the policy's keys",
             None: "not verified here"}[sig.get("verified")]
    if sig.get("kind") == "certificate":
        return {"file": sig["path"], "signer": f"certificate {sig['subject']} "
                                               f"({sig['fingerprint']}, issued by "
                                               f"{sig['issuer']}; {state})"}
    return {"file": sig["path"], "signer": f"key {sig['fingerprint']} ({state})"}


def source_view(reg: Registry, source_id: str, *, before: str | None = None,
                after: str | None = None) -> dict[str, Any]:
    """A data source: what the index knows of it, its revocation (read from the
    store's live ledger), and one page of the releases trained on it.

    Args:
        before, after: a release ``MODEL_ID@VERSION`` on the list: show the
            page indexed before (after) it.

    Raises:
        InvalidNameError: ``source_id`` breaks the naming rule.
        NotCommittedError: no release lists the source and it is not revoked;
            or the cursor names no release trained on it.
    """
    check_name(source_id, "source_id")
    _one_cursor(before, after)
    for cursor in (before, after):
        if cursor is not None:
            m, at, v = cursor.partition("@")
            if not at:
                raise InvalidNameError(f"{cursor!r}: expected MODEL_ID@VERSION (the page "
                                       "cursor)", name=cursor)
            check_model_id(m)
            check_name(v, "version")
    revocation = None
    try:
        revocation = revocation_of(reg.store, source_id)
    except FileNotFoundError:
        pass
    got = reg.index.read(lambda s: browse.source_page(s, source_id, size=PAGE_SIZE,
                                                      before=before, after=after))
    if got is None and revocation is None:
        raise NotCommittedError(f"data source {source_id!r}: no release lists it and it "
                                "is not revoked", path=join(REVOCATIONS, source_id))
    got = got or {"name": None, "uri": None, "license": None,
                  "page": browse.Page([], 0, None, None)}
    return {"source_id": source_id, "page": got["page"], "releases": got["page"].rows,
            "name": got["name"], "uri": got["uri"], "license": got["license"],
            "revocation": revocation}


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
        from registry.protocol.verify import read_manifest
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
        key = join(tree.prefix(step), "trainer_state.json")
        try:
            state = schemas.load_json(reg.store.read_bytes(key, limit=limits.MAX_JSON_BYTES),
                                      path=reg.store.url_of(key))
        except (FileNotFoundError, RegistryError):
            return None
        value = state.get("loss") if isinstance(state, dict) else None
        return finite(value)

    with ThreadPoolExecutor(max_workers=8) as pool:  # one small GET each on S3
        losses = list(pool.map(loss, [c["step"] for c in charted]))
    for c, v in zip(charted, losses):
        c["loss"] = v
    chart = Chart("training loss", [str(c["step"]) for c in charted],
                  [Series("loss", [(i, v) for i, v in enumerate(losses)])], y_label="loss")
    return {"run_id": run_id, "tree": reg.store.url_of(tree.root), "steps": steps,
            "latest": latest, "latest_error": latest_error, "chart": chart,
            "charted": len(charted)}
