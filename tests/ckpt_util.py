"""Small helpers shared by checkpoint tests: a model, its AdamW state, a trainer
state, and a store writer's rewrite of a committed step."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"embed.weight": rng.standard_normal((16, 8), dtype=np.float32),
            "head.bias": rng.standard_normal(16, dtype=np.float32)}


def adamw(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{k}.{s}": np.full_like(v, 0.5 if s == "exp_avg" else 0.25)
            for k, v in params.items() for s in ("exp_avg", "exp_avg_sq")}


def trainer_state(step: int) -> dict[str, Any]:
    return {"step": step, "tokens_seen": step * 128,
            "data_cursor": {"source": "synthetic", "shard": 0, "offset": step * 4},
            "generator": {"algorithm": "pcg32", "state": f"{step:016x}", "inc": "0" * 15 + "1"},
            "learning_rate": 0.001, "spec_sha256": "c" * 64, "git_sha": None}


def save(mgr: Any, step: int, **kw: Any) -> Any:
    params = kw.pop("params", None) or model(step)
    return mgr.save(step, params, adamw(params), optimizer="adamw",
                    config=kw.pop("config", {"hidden_size": 8}),
                    trainer_state=trainer_state(step), **kw)


def plant(store: Any, step: str, files: dict[str, bytes]) -> None:
    """The store writer: replace files of the committed ``step`` and rewrite
    its manifest to list them."""
    from registry.protocol.manifest import MANIFEST, FileEntry, Manifest
    from registry.protocol.verify import read_manifest
    from registry.store import join

    m = read_manifest(store, step)
    entries = {e.path: e for e in m.files}
    for path, data in files.items():
        store.write_bytes(join(step, path), data)
        entries[path] = FileEntry(path, len(data), hashlib.sha256(data).hexdigest())
    store.write_bytes(join(step, MANIFEST),
                      Manifest.build("checkpoint", entries.values(), **dict(m.meta)).to_bytes())
