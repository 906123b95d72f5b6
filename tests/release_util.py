"""Ledgers, eval summaries and heads for release tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def ledger_row(source_id: str = "wiki", **kw: Any) -> dict[str, Any]:
    row = {"source_id": source_id, "name": f"{source_id} corpus",
           "uri": f"s3://data/{source_id}", "license": "CC-BY-4.0",
           "allowed_uses": ["train", "eval"], "revoked": False, "revoked_at": None,
           "revocation_reason": None}
    row.update(kw)
    return row


def summary(value: float = 0.9, threshold: float = 0.5, **kw: Any) -> dict[str, Any]:
    result = {"task": "copy", "metric": "accuracy", "value": value, "n": 100,
              "threshold": threshold, "higher_is_better": True, "passed": value >= threshold}
    doc = {"suite": "smoke", "suite_version": "1", "created_at": "2026-11-29T10:00:00Z",
           "results": [result], "passed": result["passed"]}
    doc.update(kw)
    return doc


def docs_args(tmp_path: Path) -> list[str]:
    """A ledger of one row and a passing eval summary written under ``tmp_path``:
    the ``--ledger`` and ``--evals`` arguments of ``registry publish`` for them."""
    ledger, evals = tmp_path / "ledger.json", tmp_path / "evals.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    return ["--ledger", str(ledger), "--evals", str(evals)]


def head(name: str = "sentiment", input_dim: int = 8, labels: int = 2) -> dict[str, Any]:
    return {"name": name, "input_dim": input_dim, "labels": [f"l{i}" for i in range(labels)],
            "weight": [[0.1] * input_dim for _ in range(labels)], "bias": [0.0] * labels,
            "pooling": "mean"}


def summary2(acc: float, loss: float) -> dict[str, Any]:
    """Two results: copy/accuracy (>= 0.5) and copy/loss (<= 3.0, lower is better)."""
    results = [{"task": "copy", "metric": "accuracy", "value": acc, "n": 100,
                "threshold": 0.5, "higher_is_better": True, "passed": acc >= 0.5},
               {"task": "copy", "metric": "loss", "value": loss, "n": 100,
                "threshold": 3.0, "higher_is_better": False, "passed": loss <= 3.0}]
    return {"suite": "smoke", "suite_version": "2", "created_at": "2026-11-29T10:00:00Z",
            "results": results, "passed": all(r["passed"] for r in results)}


def one_release_store(work: Path) -> tuple[str, str]:
    """A local store and SQLite index under ``work`` holding one release ``m@1``
    (a 4x8 float32 safetensors file, a config, one ledger row, a passing eval
    summary): (store, db)."""
    import numpy as np

    from registry.api import Registry
    from registry.formats.safetensors_io import write_safetensors

    src = work / "model"
    src.mkdir()
    with open(src / "model.safetensors", "wb") as f:
        write_safetensors(f, {"proj.weight": np.ones((4, 8), dtype=np.float32)},
                          metadata={"format": "pt"}, path="model.safetensors")
    (src / "config.json").write_text('{"hidden_size": 8}')
    store, db = str(work / "artifacts"), f"sqlite:///{work / 'registry.db'}"
    with Registry(store, db=db) as reg:
        reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary())
    return store, db
