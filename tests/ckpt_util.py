"""Small helpers shared by checkpoint tests: a model, its AdamW state, a trainer state."""

from __future__ import annotations

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
