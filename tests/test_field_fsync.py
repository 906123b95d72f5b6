"""Issue 13 item 6: on local disk every folder a commit creates (``evals/``,
``heads/``, LoongSage's ``dist_ckpt/``, ``hf_model/``, ``data_source/``) is
fsynced before the manifest is written, and every new folder's entry is
fsynced into its parent; so is a new ``refs/`` folder of a pointer. Checked
with an fsync spy (the seed's step 1 for files, extended to folders). S3 has
no folders to sync: its commit is covered by the other tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from registry.refs.aliases import set_alias
from registry.protocol.commit import commit_local_directory
from registry.store import open_store
from tests.support.fsync_spy import record_fsyncs

NESTED = ["model.safetensors", "evals/summary.json", "heads/sentiment.json",
          "dist_ckpt/mp_rank_00/model_optim_rng.pt", "hf_model/config.json",
          "data_source/shard-0/state.json"]


def test_every_folder_a_commit_creates_is_fsynced_before_the_manifest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    for rel in NESTED:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(rel.encode())
    store = open_store(str(tmp_path / "store"))
    events = record_fsyncs(monkeypatch)
    commit_local_directory(store, src, "runs/r1/ckpt/step-000001", kind="checkpoint",
                           run_id="r1", step=1)
    manifest_at = next(i for i, (what, p) in enumerate(events)
                       if what == "open" and p.endswith("/MANIFEST.json"))
    staging = os.path.dirname(events[manifest_at][1])
    synced_before = {p for what, p in events[:manifest_at] if what == "fsync-dir"}
    folders = {os.path.join(staging, *rel.split("/")[:i])
               for rel in NESTED for i in range(1, rel.count("/") + 1)}
    assert len(folders) == 7
    missing = sorted(os.path.relpath(f, staging) for f in folders - synced_before)
    assert not missing, f"folders not fsynced before MANIFEST.json: {missing}"
    # Each new folder's entry is fsynced into its parent, up to the store root.
    root = os.path.realpath(tmp_path / "store")
    for parent in (root, f"{root}/runs", f"{root}/runs/r1", f"{root}/runs/r1/ckpt"):
        assert ("fsync-dir", parent) in events, parent


def test_a_new_refs_folder_is_fsynced_into_its_parent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"x")
    commit_local_directory(store, src, "models/m/1", kind="checkpoint", run_id="r", step=1)
    events = record_fsyncs(monkeypatch)
    set_alias(store, "m", "prod", "1")
    assert ("fsync-dir", os.path.realpath(tmp_path / "store/models/m")) in events
    assert ("fsync-dir", os.path.realpath(tmp_path / "store/models/m/refs")) in events
