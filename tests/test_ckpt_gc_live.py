"""``registry ckpt gc`` and retention beside live writers (issue 13: gc never
removes what a live writer owns).

- A run's writer (CheckpointManager, or LoongSageCheckpointer) paused
  mid-save (every file of step 200 staged, nothing committed), in its own
  process, on local disk and S3: ``ckpt gc --keep 1`` from another process
  leaves its staging directory and claim alone and says why; the writer then
  commits and points at step 200, which verifies.
- A claim whose process is alive (no writer lease) guards its staging
  directory even with ``min_age`` 0; a dead one's goes.
- Pointer temp files and lock files of a swap in progress are never
  leftovers: a process moving the pointer in a loop beside retention in a
  loop never fails, and the pointer ends where it was moved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry.checkpoint import LOONGSAGE, TINYLLM, CheckpointTree, run_root
from registry.protocol.claim import Claim
from registry.store import open_store
from tests.conftest import REPO, run_cli
from tests.support.forkclient import python_popen

RUN = "live"


def _start_writer(url: str, layout: str, tree: str, barrier: Path) -> subprocess.Popen[str]:
    proc = python_popen([sys.executable, "-m", "tests.support.paused_saver_child", url,
                             layout, tree, str(barrier)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (barrier / "staged").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer never staged step 200"
        time.sleep(0.02)
    return proc


@pytest.mark.parametrize("layout", ["tinyllm", "loongsage"])
def test_ckpt_gc_beside_a_live_writer_leaves_its_save_alone(durable_store_url: str,
                                                           layout: str, tmp_path: Path) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    name = RUN if layout == "tinyllm" else f"lg/{RUN}"
    writer = _start_writer(durable_store_url, layout, name, barrier)
    gc = ["ckpt", "gc", name, "--keep", "1", "--store", durable_store_url, "--layout", layout]
    try:
        store = open_store(durable_store_url)
        tree = (CheckpointTree(store, run_root(RUN), TINYLLM) if layout == "tinyllm"
                else CheckpointTree(store, name, LOONGSAGE))
        before = store.walk_files(tree.root)
        staged = {k for k in before if "000200" in k or "_200" in k}
        assert staged, before  # the paused save's files (and claim)
        r = run_cli(*gc)
        assert r.returncode == 0, r.stderr
        assert "a writer is saving into this run" in r.stderr and "pid" in r.stderr, r.stderr
        assert "deleted" not in r.stdout, r.stdout
        assert store.walk_files(tree.root) == before  # nothing of the save, nor step 100
        j = run_cli(*gc, "--json")
        assert j.returncode == 0 and json.loads(j.stdout)["live_writer"], j
    finally:
        (barrier / "go").touch()
        out, err = writer.communicate(timeout=120)
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"ok": True, "error": None, "latest": 200}, (result, err)
    assert tree.latest() == 200 and tree.info(200, full=True).report.ok
    # The writer is gone (its lease released): gc applies retention in full.
    r = run_cli(*gc)
    assert r.returncode == 0 and "a writer is saving" not in r.stderr, r.stderr
    assert tree.steps() == [200] and tree.info(200, full=True).report.ok
    assert not [k for k in store.walk_files(tree.root) if ".tmp" in k or ".claim" in k]


def test_retention_spares_a_live_claim_even_at_min_age_zero(durable_store_url: str) -> None:
    """No writer lease: a staging directory whose claim's process is alive
    (this test's) stays; once its claim is not live (a dead pid), it goes."""
    store = open_store(durable_store_url)
    tree = CheckpointTree(store, run_root("claimed"))
    staging = f"{tree.prefix(300)}.tmp-abc"
    store.write_bytes(f"{staging}/model.safetensors", b"x" * 10)
    claim = Claim(store, f"{staging}.claim")
    claim.take()
    try:
        assert tree.retain(1, min_age=0) == []
        assert store.exists(f"{staging}/model.safetensors") and store.exists(claim.key)
    finally:
        claim.release()
    store.write_bytes(f"{staging}.claim", json.dumps(
        {"owner": "x", "host": os.uname().nodename, "pid": 2**22 + 12345,
         "started_at": "2026-01-01T00:00:00Z", "lease_seconds": 600}).encode())
    assert sorted(tree.retain(1, min_age=0)) == sorted([staging, f"{staging}.claim"])
    assert store.walk_files(tree.root) == {}


_MOVER = """
import sys
import pytest

from registry.checkpoint import LOONGSAGE, TINYLLM, CheckpointTree, run_root
from registry.store import open_store
tree = CheckpointTree(open_store(sys.argv[1]), run_root("ptr"))
for step in range(1, int(sys.argv[2]) + 1):
    tree.store.swap(tree.pointer_key, tree.layout.pointer_value(step).encode() + b"\\n",
                    tree.store.read_versioned(tree.pointer_key)[1] if step > 1 else None)
print("moved", flush=True)
"""


def test_pointer_swaps_in_progress_survive_retention_at_min_age_zero(tmp_path: Path) -> None:
    """Local disk (where swaps use ``LATEST.lock`` and ``LATEST.tmp-<random>``):
    retention at min_age 0 in a loop beside 150 pointer swaps in another
    process; every swap succeeds and the pointer holds the last one."""
    url = str(tmp_path / "store")
    store = open_store(url)
    store.ensure_root()
    tree = CheckpointTree(store, run_root("ptr"))
    mover = python_popen([sys.executable, "-c", _MOVER, url, "150"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[str] = set()
    while mover.poll() is None:
        deleted = tree.retain(1, min_age=0)
        assert deleted == [], deleted
        seen |= {name for name, _ in store.list_dir(tree.root)}
    out, err = mover.communicate()
    assert mover.returncode == 0 and "moved" in out, err
    assert store.read_bytes(tree.pointer_key).strip() == tree.layout.pointer_value(150).encode()
    assert not [n for n, _ in store.list_dir(tree.root) if ".tmp" in n or n.endswith(".lock")]
