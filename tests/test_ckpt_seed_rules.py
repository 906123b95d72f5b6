"""The seeds' last checkpoint rules (issue 46 item 2): stale pointer temp
files go with retention (seed 000 step 6, "any stale *.tmp"); an HF-only
LoongSage save leaves the tracker where it was (seed 003 1 and 4.1, the
reading documented in docs/loongsage-ranks.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from registry.checkpoint import LOONGSAGE, TINYLLM, CheckpointTree, run_root
from registry.checkpoint.lease import WriterLease
from registry.checkpoint.loongsage_save import LoongSageCheckpointer
from registry.store import join, open_store
from tests.conftest import run_cli


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.mark.parametrize("layout", ["tinyllm", "loongsage"])
def test_retention_removes_pointer_temp_files_older_than_a_writer_lease(
        layout: str, tmp_path: Path) -> None:
    """``LATEST.tmp`` (the seed's own staging name) and ``LATEST.tmp-<random>``
    (a store's swap killed before its rename) older than the writer lease go
    with ``ckpt gc`` and with retention beside a live writer; a young one (a
    swap in progress) and the pointer stay."""
    url = str(tmp_path / "store")
    store = open_store(url)
    store.ensure_root()
    name = "r1" if layout == "tinyllm" else "lg/r1"
    tree = (CheckpointTree(store, run_root(name), TINYLLM) if layout == "tinyllm"
            else CheckpointTree(store, name, LOONGSAGE))
    pointer = tree.layout.pointer
    root = Path(url, *tree.root.split("/"))
    root.mkdir(parents=True)
    (root / pointer).write_text(tree.layout.pointer_value(5) + "\n")
    for temp, age in ((".tmp", 600), (".tmp-0123456789ab", 600), (".tmp-young", 0)):
        (root / f"{pointer}{temp}").write_text("x\n")
        _age(root / f"{pointer}{temp}", age)
    r = run_cli("ckpt", "gc", name, "--keep", "1", "--store", url, "--layout", layout)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in root.iterdir()) == [pointer, f"{pointer}.tmp-young"]

    # beside a live writer (its lease 30 s): a temp older than that goes, a younger stays
    lease = WriterLease(store, tree.root, seconds=30)
    lease.hold()
    try:
        for temp, age in ((".tmp", 60), (".tmp-young", 10)):
            (root / f"{pointer}{temp}").write_text("x\n")
            _age(root / f"{pointer}{temp}", age)
        deleted = tree.retain(1)
        assert deleted == [join(tree.root, f"{pointer}.tmp")]
        assert (root / f"{pointer}.tmp-young").exists() and (root / pointer).exists()
    finally:
        lease.release()


def test_an_hf_only_save_leaves_the_tracker_where_it_was(tmp_path: Path) -> None:
    """Seed 003: the tracker names "the most recent successfully saved step"
    that resume treats as "a valid, resumable checkpoint" and hf_model/
    "cannot be used to resume training": an HF-only save commits its step
    but the tracker stays on the last dist_ckpt step (or absent), so resume
    never lands on weights without optimizer state."""
    url = str(tmp_path / "store")
    store = open_store(url)
    model = {"w": np.ones((2, 3), np.float32)}
    c = LoongSageCheckpointer(store, "exp", save_freq=1, total_steps=2, async_save=False,
                              save_checkpoint=False, save_hf=True, hf_config={"hidden_size": 3})
    for step in (1, 2):
        assert c.maybe_save(step, model=model)
    c.finish()
    assert [r.tracked for r in c.saved] == [False, False]
    assert store.exists(join("exp", "train_step_2", "MANIFEST.json"))
    assert not store.exists(join("exp", "latest_checkpointed_iteration.txt"))
