"""Issue 13 item 3: zero-byte "folder" keys (``incoming/``, made by an S3
console's "Create folder") are not files, anywhere the registry lists a store
or a source: publish, the commit check, verify, gc, index rebuild, pull. On
local disk the same thing is an empty folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import boto3

from registry.lifecycle.gc import collect
from registry.gating.ledger import revocations, revoke
from registry.release import ModelRelease
from registry.store import Store, open_store
from registry.protocol.verify import verify_directory
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.test_loongsage import hf_dir


def marker(store: Store, key: str) -> None:
    """A folder marker at ``key/`` (an empty folder on local disk)."""
    local = store.local_path(key)
    if local is not None:
        os.makedirs(local, exist_ok=True)
        return
    bucket, _, prefix = store.root.partition("/")
    full = f"{prefix}/{key}/" if prefix else f"{key}/"
    boto3.client("s3").put_object(Bucket=bucket, Key=full.replace("//", "/"), Body=b"")


def test_folder_markers_are_ignored_everywhere(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    # A source directory in the store's backend holding markers (S3 console
    # "Create folder") beside the model files.
    src = hf_dir(tmp_path)
    for name in ("model.safetensors", "config.json"):
        store.write_bytes(f"incoming/{name}", (src / name).read_bytes())
    for key in ("incoming", "incoming/sub", "incoming/sub/deeper"):
        marker(store, key)
    src_url = f"{durable_store_url}/incoming"
    rel = ModelRelease(store)
    result = rel.publish(src_url, "m", "1", ledger=[ledger_row()], eval_summary=summary())
    assert sorted(e.path for e in result.manifest.files if "/" not in e.path) == [
        "MODEL_CARD.md", "config.json", "ledger.json", "model.safetensors"]
    ledger, evals = tmp_path / "ledger.json", tmp_path / "summary.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    db = ["--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = run_cli("publish", src_url, "--model-id", "m", "--version", "2", "--ledger",
                str(ledger), "--evals", str(evals), "--store", durable_store_url, *db)
    assert r.returncode == 0, r.stderr
    # Markers inside the store: in a committed release, beside it, in refs/ and ledger/.
    for key in ("models", "models/m", "models/m/1", "models/m/1/evals", "models/m/refs",
                "ledger/revocations", "runs"):
        marker(store, key)
    for version in ("1", "2"):
        report = verify_directory(store, f"models/m/{version}", full=True)
        assert report.ok and report.extras == (), report.to_dict()
    r = run_cli("verify", f"{durable_store_url}/models/m/1")
    assert r.returncode == 0 and "''" not in r.stdout and "evals/" not in r.stderr, r.stdout
    assert collect(store, older_than=0) == []
    revoke(store, "other", "test")
    assert list(revocations(store)) == ["other"]
    r = run_cli("alias", "set", "m", "prod", "1", "--store", durable_store_url, *db)
    assert r.returncode == 0, r.stderr
    r = run_cli("index", "rebuild", "--store", durable_store_url, *db, "--json")
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)
    assert counts["releases"] == 2 and counts["aliases"] == 1 and counts["revocations"] == 1
    r = run_cli("pull", "m@prod", "--store", durable_store_url, "--cache",
                str(tmp_path / "cache"), "--to", str(tmp_path / "served"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "served" / "model.safetensors").read_bytes() == \
        (src / "model.safetensors").read_bytes()
