"""Index query latency at scale (issue 5, item 7): SQLite and Postgres.

Generates, directly in the database, 1,000 models, 100,000 releases,
1,000,000 eval results and 10,000 ledger sources (3 sources per release, 1 %
of sources revoked, a policy threshold on 10 % of models), then times
``query <model> --passing`` and ``query --source <id>`` through the same
functions the CLI uses (:mod:`registry.index.queries`), and reports p50/p95.

    python bench/index_bench.py [--scale 1.0] [--postgres URL] [--out FILE]

Targets: p50 <= 20 ms, p95 <= 50 ms on both backends.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from registry.index import Index  # noqa: E402
from registry.index import queries  # noqa: E402
from registry.index.schema import (  # noqa: E402
    EvalResult,
    LedgerSource,
    Model,
    Policy,
    Release,
    ReleaseSource,
    Revocation,
)

BATCH = 20_000


def populate(index: Index, *, models: int, releases_per_model: int, evals_per_release: int,
             sources: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    with index.engine.begin() as conn:
        conn.execute(insert(Model), [{"id": i + 1, "model_id": f"model-{i:05d}"}
                                     for i in range(models)])
        conn.execute(insert(LedgerSource), [
            {"id": i + 1, "source_id": f"src-{i:06d}", "name": f"source {i}",
             "uri": f"s3://data/src-{i}", "license": "CC-BY-4.0"} for i in range(sources)])
        conn.execute(insert(Revocation), [
            {"source_id": f"src-{i:06d}", "revoked_at": "2026-11-01T00:00:00Z",
             "reason": "bench"} for i in rng.sample(range(sources), sources // 100)])
        conn.execute(insert(Policy), [
            {"model_pk": m + 1, "position": 0, "metric": "accuracy", "op": ">=", "value": 0.5}
            for m in range(0, models, 10)])
        rel_rows, link_rows, eval_rows = [], [], []
        rid = 0
        eid = 0
        for m in range(models):
            for v in range(releases_per_model):
                rid += 1
                ok = rng.random() > 0.1
                rel_rows.append({
                    "id": rid, "model_pk": m + 1, "version": f"{v}.0",
                    "uri": f"s3://bucket/models/model-{m:05d}/{v}.0", "manifest_sha256": "a" * 64,
                    "bytes": 1 << 30, "dtype": "bf16", "source_run_id": "run", "source_step": v,
                    "source_uri": None, "source_manifest_sha256": "b" * 64, "seq": v + 1,
                    "created_at": f"2026-{1 + v % 12:02d}-{1 + v % 28:02d}T00:00:{v % 60:02d}Z",
                    "card_ok": True, "ledger_ok": True, "ledger_reason": "ok",
                    "evals_passed": ok, "evals_reason": "ok" if ok else "failed",
                    "suite": "bench", "suite_version": "1"})
                for s in rng.sample(range(sources), 3):
                    link_rows.append({"release_pk": rid, "source_pk": s + 1,
                                      "name": f"source {s}", "uri": f"s3://data/src-{s}",
                                      "license": "CC-BY-4.0", "allowed_uses": "train,eval",
                                      "revoked_in_file": False})
                for k in range(evals_per_release):
                    eid += 1
                    metric = "accuracy" if k == 0 else f"metric{k}"
                    value = rng.random()
                    eval_rows.append({"id": eid, "release_pk": rid, "task": f"task{k % 3}",
                                      "metric": metric, "task_metric": f"task{k % 3}/{metric}",
                                      "value": value, "n": 100, "threshold": 0.0,
                                      "higher_is_better": True, "passed": True})
            if len(eval_rows) >= BATCH or m == models - 1:
                conn.execute(insert(Release), rel_rows)
                conn.execute(insert(ReleaseSource), link_rows)
                conn.execute(insert(EvalResult), eval_rows)
                rel_rows, link_rows, eval_rows = [], [], []
        conn.execute(text(COUNT_RELEASES))
        if index.engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE"))
        else:
            conn.execute(text("ANALYZE"))
    return {"models": models, "releases": rid, "eval_results": eid, "sources": sources,
            "populate_seconds": round(time.perf_counter() - t0, 1)}


#: what record_release keeps up to date, for rows inserted here directly
COUNT_RELEASES = ("UPDATE models SET release_count = "
                  "(SELECT count(*) FROM releases WHERE releases.model_pk = models.id)")


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
            "n": len(ordered)}


def time_queries(index: Index, *, models: int, sources: int, n: int = 200,
                 seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    passing, by_source = [], []
    with index.session() as s:
        queries.passing(s, "model-00000")  # warm the connection and caches
        for _ in range(n):
            m = f"model-{rng.randrange(models):05d}"
            t = time.perf_counter()
            queries.passing(s, m)
            passing.append(time.perf_counter() - t)
            src = f"src-{rng.randrange(sources):06d}"
            t = time.perf_counter()
            queries.releases_for_source(s, src)
            by_source.append(time.perf_counter() - t)
    return {"query_passing": percentiles(passing), "query_source": percentiles(by_source)}


def run_backend(url: str, scale: float) -> dict[str, Any]:
    models = max(10, int(1000 * scale))
    sources = max(100, int(10_000 * scale))
    index = Index(url)
    sizes = populate(index, models=models, releases_per_model=100, evals_per_release=10,
                     sources=sources)
    result = {**sizes, **time_queries(index, models=models, sources=sources)}
    index.close()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-index.json")))
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = run_backend(f"sqlite:///{tmp}/bench.db", args.scale)
    admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
    name = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        results["postgres"] = run_backend(args.postgres.rsplit("/", 1)[0] + "/" + name,
                                          args.scale)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print("| backend | releases | eval results | query | p50 ms | p95 ms | target |")
    print("|---|---|---|---|---|---|---|")
    for backend, r in results.items():
        for q in ("query_passing", "query_source"):
            ok = r[q]["p50_ms"] <= 20 and r[q]["p95_ms"] <= 50
            print(f"| {backend} | {r['releases']:,} | {r['eval_results']:,} | {q} | "
                  f"{r[q]['p50_ms']} | {r[q]['p95_ms']} | {'met' if ok else 'MISSED'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
