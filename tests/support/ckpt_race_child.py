"""A child process for the duplicate-writer race test (tests/test_ckpt_writers.py).

``python tests/support/ckpt_race_child.py URL LAYOUT WRITER ROUNDS BARRIER_DIR``

One writer of a training run, as a preempted job's zombie or a launcher started
twice would be: for each round ``r`` it waits until ``BARRIER_DIR/go-<r>``
exists, then saves step 200 of run ``race-<r>`` (tinyllm:
``runs/race-<r>/ckpt``; loongsage: the tree ``lg/race-<r>``) with its own
tensors (seeded by writer and round) through one Store opened before the
first round, closes its manager, prints one JSON line
``{"round", "writer", "ok", "error", "message", "manifest_sha256"}`` and creates
``BARRIER_DIR/done-<r>-<writer>``. ``error`` is the class name of a registry
error, or ``RAW <class>`` for anything else (a traceback is printed to stderr).
It creates ``BARRIER_DIR/ready-<writer>`` once imported and connected.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

STEP = 200


def tensors(writer: int, round_: int) -> dict[str, np.ndarray]:
    """The writer's own parameters: tiny, distinct per writer and round."""
    rng = np.random.default_rng(1000 * round_ + writer + 1)
    return {"embed.weight": rng.standard_normal((8, 4), dtype=np.float32),
            "head.bias": np.full(8, float(writer + 1), dtype=np.float32)}


def adamw(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{k}.{s}": np.full_like(v, 0.5 if s == "exp_avg" else 0.25)
            for k, v in params.items() for s in ("exp_avg", "exp_avg_sq")}


def trainer_state(step: int, writer: int) -> dict[str, Any]:
    return {"step": step, "tokens_seen": step * 128 + writer,
            "data_cursor": {"source": "synthetic", "shard": 0, "offset": step * 4},
            "generator": {"algorithm": "pcg32", "state": f"{step:016x}", "inc": "0" * 15 + "1"},
            "learning_rate": 0.001, "spec_sha256": "c" * 64, "git_sha": None}


def save_tinyllm(store: Any, round_: int, step: int, writer: int) -> str:
    from registry.checkpoint import CheckpointManager

    params = tensors(writer, round_)
    with CheckpointManager(store, f"race-{round_}", keep_ckpts=0, async_save=False) as mgr:
        result = mgr.save(step, params, adamw(params), optimizer="adamw",
                          config={"hidden_size": 4}, trainer_state=trainer_state(step, writer))
        return result.result().manifest_sha256


def save_loongsage(store: Any, round_: int, step: int, writer: int) -> str:
    from registry.checkpoint.loongsage import LoongSageCheckpointer

    params = tensors(writer, round_)
    ckpt = LoongSageCheckpointer(store, f"lg/race-{round_}", save_freq=100, total_steps=1000,
                                 async_save=True)
    try:
        ckpt.maybe_save(step, model=params, optimizer_state=adamw(params),
                        scheduler_state={"last_step": step}, rng_state={"seed": writer},
                        data_sources=[{"prompt_data_path": "data/a.jsonl",
                                       "state": {"offset": step}}])
    finally:
        landed = ckpt.finish()
    assert landed is not None
    return landed.manifest_sha256


SAVERS = {"tinyllm": save_tinyllm, "loongsage": save_loongsage}


def main() -> int:
    url, layout, writer, rounds, barrier = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                            int(sys.argv[4]), Path(sys.argv[5]))
    from registry.errors import RegistryError
    from registry.store import open_store

    store = open_store(url)  # one connection for every round, made before the race
    store.exists("warm-up")
    save = SAVERS[layout]
    (barrier / f"ready-{writer}").touch()
    for r in range(rounds):
        go = barrier / f"go-{r}"
        deadline = time.monotonic() + 120
        while not go.exists():
            if time.monotonic() > deadline:
                return 2
            time.sleep(0.001)
        out: dict[str, Any] = {"round": r, "writer": writer, "ok": False, "error": None,
                               "message": None, "manifest_sha256": None}
        try:
            out["manifest_sha256"] = save(store, r, STEP, writer)
            out["ok"] = True
        except RegistryError as e:
            out["error"], out["message"] = type(e).__name__, str(e)
        except BaseException as e:  # noqa: BLE001 - reported, and fails the test
            traceback.print_exc()
            out["error"], out["message"] = f"RAW {type(e).__name__}", str(e)
        print(json.dumps(out), flush=True)
        (barrier / f"done-{r}-{writer}").touch()
    return 0


if __name__ == "__main__":
    sys.exit(main())
