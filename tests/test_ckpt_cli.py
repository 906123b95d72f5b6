"""``registry ckpt ls|latest|verify|gc`` on local disk and S3, checked against the store."""

from __future__ import annotations

import json

from registry.checkpoint import CheckpointManager
from registry.protocol.manifest import MANIFEST
from registry.store import open_store
from tests.ckpt_util import save
from tests.conftest import run_cli

ROOT = "runs/r1/ckpt"


def populate(url: str) -> None:
    with CheckpointManager(url, "r1", keep_ckpts=0) as m:
        for s in (10, 20, 30):
            save(m, s)


def test_ls_latest_verify(durable_store_url: str) -> None:
    populate(durable_store_url)
    store = open_store(durable_store_url)
    store.write_bytes(f"{ROOT}/step-000040/model.safetensors", b"half written")
    r = run_cli("ckpt", "ls", "r1", "--store", durable_store_url, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["latest"] == 30
    assert [(s["step"], s["committed"], s["verified"]) for s in doc["steps"]] == [
        (10, True, True), (20, True, True), (30, True, True), (40, False, False)]
    assert doc["steps"][0]["bytes"] > 0
    r = run_cli("ckpt", "latest", "r1", "--store", durable_store_url)
    assert r.returncode == 0 and r.stdout.startswith("step-000030\t")
    r = run_cli("ckpt", "verify", "r1", "--store", durable_store_url, "--step", "20")
    assert r.returncode == 0 and "OK   step-000020" in r.stdout
    # step-000040 has no manifest: not a checkpoint (readers ignore it), so a
    # run-wide verify lists it as SKIP and passes; named with --step it fails.
    r = run_cli("ckpt", "verify", "r1", "--store", durable_store_url)
    assert r.returncode == 0, r.stdout
    assert "SKIP step-000040" in r.stdout and "not committed" in r.stdout
    assert r.stdout.count("OK   step-") == 3
    r = run_cli("ckpt", "verify", "r1", "--store", durable_store_url, "--step", "40")
    assert r.returncode == 1 and "FAIL step-000040" in r.stdout
    # The pointer naming an uncommitted step is a failure.
    store.write_bytes(f"{ROOT}/LATEST", b"step-000040\n")
    r = run_cli("ckpt", "verify", "r1", "--store", durable_store_url, "--json")
    assert r.returncode == 1
    assert {s["step"]: s["ignored"] for s in json.loads(r.stdout)}[40] is False


def test_verify_detects_flipped_byte(durable_store_url: str) -> None:
    populate(durable_store_url)
    store = open_store(durable_store_url)
    key = f"{ROOT}/step-000020/model.safetensors"
    data = store.read_bytes(key)
    store.write_bytes(key, data[:-1] + bytes([data[-1] ^ 1]))
    r = run_cli("ckpt", "verify", "r1", "--store", durable_store_url, "--json")
    assert r.returncode == 1
    by_step = {s["step"]: s for s in json.loads(r.stdout)}
    assert by_step[20]["verified"] is False and "sha256" in by_step[20]["problems"][0]
    assert by_step[10]["verified"] and by_step[30]["verified"]


def test_gc_keeps_newest(durable_store_url: str) -> None:
    populate(durable_store_url)
    r = run_cli("ckpt", "gc", "r1", "--store", durable_store_url, "--keep", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["deleted"]) == 2
    store = open_store(durable_store_url)
    assert [n for n, d in store.list_dir(ROOT) if d] == ["step-000030"]
    assert store.exists(f"{ROOT}/step-000030/{MANIFEST}")


def test_latest_problems_are_clean_errors(durable_store_url: str) -> None:
    open_store(durable_store_url).ensure_root()  # a missing local store is exit 6 instead
    r = run_cli("ckpt", "latest", "r1", "--store", durable_store_url)
    assert r.returncode == 3 and "no such run 'r1'" in r.stderr and "Traceback" not in r.stderr
    populate(durable_store_url)
    store = open_store(durable_store_url)
    store.delete(f"{ROOT}/LATEST")
    r = run_cli("ckpt", "latest", "r1", "--store", durable_store_url)
    assert r.returncode == 3 and "no pointer" in r.stderr and "Traceback" not in r.stderr
    open_store(durable_store_url).write_bytes(f"{ROOT}/LATEST", b"../../etc\n")
    r = run_cli("ckpt", "latest", "r1", "--store", durable_store_url)
    assert r.returncode == 5 and "outside its folder" in r.stderr
    r = run_cli("ckpt", "ls", "../evil", "--store", durable_store_url, "--layout", "tinyllm")
    assert r.returncode == 2 and "run_id" in r.stderr
