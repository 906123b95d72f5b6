"""Retention policies (issue 46 item 3): keep the last N, the best K by a
trainer-state metric (min or max), every k-th step, one per time interval,
and any union; the pointer's step and every step a release names are never
removed. Applied by the writer after each commit (tinyllm CheckpointManager,
LoongSageCheckpointer) and by ``ckpt gc`` (local disk and S3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry.api import Registry
from registry.checkpoint import CheckpointManager, CheckpointTree, run_root
from registry.checkpoint.loongsage_save import LoongSageCheckpointer
from registry.checkpoint.retention import RetentionPolicy, StepFacts
from registry.errors import UsageError
from registry.store import open_store
from tests.ckpt_util import adamw, model, trainer_state
from tests.conftest import make_store_url, run_cli
from tests.release_util import ledger_row, summary

LOSS = {1: 3.0, 2: 2.0, 3: 2.5, 4: 1.0, 5: 1.5, 6: 1.2, 7: 2.2, 8: 2.1, 9: 1.9}


def test_each_rule_and_their_union() -> None:
    steps = [StepFacts(s, 100.0 * s, LOSS[s]) for s in range(1, 10)]
    assert RetentionPolicy(keep_last=2).kept(steps) == {8, 9}
    assert RetentionPolicy(keep_best=2, metric="loss").kept(steps) == {4, 6}
    assert RetentionPolicy(keep_best=2, metric="loss", mode="max").kept(steps) == {1, 3}
    assert RetentionPolicy(keep_every=4).kept(steps) == {4, 8}
    # one per 300 s of commit time, the newest of each: [100,300) [300,600) [600,900) [900,..)
    assert RetentionPolicy(keep_interval=300).kept(steps) == {2, 5, 8, 9}
    assert RetentionPolicy(keep_last=1, keep_best=1, metric="loss",
                           keep_every=3).kept(steps) == {9, 4, 3, 6}
    assert RetentionPolicy().kept(steps) == set(range(1, 10))  # no rule: everything
    no_metric = [StepFacts(s, None, None) for s in range(1, 4)]
    assert RetentionPolicy(keep_best=2, metric="loss").kept(no_metric) == set()
    for bad in ({"keep_last": -1}, {"keep_best": 1}, {"mode": "median"},
                {"keep_interval": float("nan")}, {"keep_every": True}):
        with pytest.raises(UsageError):
            RetentionPolicy(**bad)


def _save(mgr: CheckpointManager, step: int) -> None:
    params = model(step)
    mgr.save(step, params, adamw(params), optimizer="adamw", config={"hidden_size": 8},
             trainer_state={**trainer_state(step), "loss": LOSS[step]})


def test_the_tinyllm_writer_keeps_exactly_what_its_policy_names() -> None:
    store = open_store("memory://retention-writer")
    policy = RetentionPolicy(keep_best=2, metric="loss", keep_every=4)
    with CheckpointManager(store, "r1", keep_ckpts=1, async_save=True,
                           retention=policy) as mgr:
        for step in range(1, 10):
            _save(mgr, step)
    tree = CheckpointTree(store, run_root("r1"))
    # keep_last 1 (keep_ckpts) -> 9; best 2 by loss -> 4, 6; every 4th -> 4, 8
    assert tree.steps() == [4, 6, 8, 9] and tree.latest() == 9


@pytest.mark.parametrize("url_kind", ["local", "s3"])
def test_ckpt_gc_policy_keeps_the_pointer_and_released_steps(
        url_kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    url = make_store_url(url_kind, request, tmp_path)
    store = open_store(url)
    with CheckpointManager(store, "r1", keep_ckpts=0, async_save=False) as mgr:
        for step in range(1, 10):
            _save(mgr, step)
    reg = Registry(url, db=f"sqlite:///{tmp_path / 'i.db'}")
    reg.create_release("r1", 2, "m", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5))
    tree = CheckpointTree(store, run_root("r1"))
    r = run_cli("ckpt", "gc", "r1", "--keep-best", "1", "--metric", "loss", "--keep-every", "3",
                "--store", url, "--json")
    assert r.returncode == 0, r.stderr
    # best 1 -> 4; every 3rd -> 3, 6, 9; the pointer -> 9; released -> 2
    assert tree.steps() == [2, 3, 4, 6, 9]
    assert len(json.loads(r.stdout)["deleted"]) == 4
    r = run_cli("ckpt", "gc", "r1", "--keep-best", "1", "--mode", "max", "--store", url)
    assert r.returncode == 2 and "metric" in r.stderr and len(r.stderr.splitlines()) == 1
    r = run_cli("ckpt", "gc", "r1", "--store", url)
    assert r.returncode == 2 and "--keep-best" in r.stderr
    assert tree.steps() == [2, 3, 4, 6, 9]  # the refused runs deleted nothing


def test_the_loongsage_writer_applies_its_policy_after_each_commit() -> None:
    """keep_last 1, every 3rd, and the best 1 by the metrics the loop passes
    (saved as the step's trainer_state.json)."""
    store = open_store("memory://retention-loong")
    hf: dict[str, Any] = {"hidden_size": 3}
    c = LoongSageCheckpointer(store, "exp", save_freq=1, total_steps=8, save_checkpoint=False,
                              save_hf=True, hf_config=hf, async_save=True,
                              retention=RetentionPolicy(keep_last=1, keep_every=3, keep_best=1,
                                                        metric="loss"))
    for step in range(1, 9):
        c.on_step_start()
        c.maybe_save(step, model={"w": np.full((2, 3), step, np.float32)},
                     metrics={"loss": LOSS[step]})
    c.finish()
    # last -> 8; every 3rd -> 3, 6; best loss -> 4
    assert CheckpointTree(store, "exp", c.tree.layout).steps() == [3, 4, 6, 8]
    assert json.loads(store.read_bytes("exp/train_step_4/trainer_state.json")) == \
        {"loss": 1.0, "step": 4}
