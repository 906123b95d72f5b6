"""``registry verify`` on local disk and S3: exit codes, failing files, extras.

Each bad input gets a clear line naming the file and the rule, exit code 1,
and the store is left exactly as it was.
"""

from __future__ import annotations

import json

import pytest

from registry.protocol.commit import DirectoryWriter
from registry.protocol.manifest import MANIFEST
from registry.store import Store, open_store
from tests.conftest import run_cli

PREFIX = "runs/r1/ckpt/step-000007"


def committed(url: str) -> Store:
    store = open_store(url)
    with DirectoryWriter(store, PREFIX, kind="checkpoint", meta={"run_id": "r1", "step": 7}) as w:
        w.write_bytes("model.safetensors", bytes(range(200)) * 50)
        w.write_json("config.json", {"hidden_size": 8})
        w.write_bytes("trainer_state.json", b"{}")
        w.commit()
    return store


def snapshot(store: Store) -> dict[str, bytes]:
    return {k: store.read_bytes(f"{PREFIX}/{k}") for k in store.walk_files(PREFIX)}


def test_verify_ok(durable_store_url: str) -> None:
    store = committed(durable_store_url)
    url = store.url_of(PREFIX)
    for args, mode in (([], "sha256"), (["--full"], "sha256"), (["--quick"], "sizes")):
        r = run_cli("verify", url, *args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("OK ") and "3 files" in r.stdout
        assert f"{mode} verified" in r.stdout
    r = run_cli("verify", url, "--full", "--quick")
    assert r.returncode == 2 and "--quick" in r.stderr
    r = run_cli("verify", url, "--full", "--json")
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["files"] == 3 and doc["problems"] == []


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped"])
def test_verify_reports_each_failing_file(durable_store_url: str, damage: str) -> None:
    store = committed(durable_store_url)
    key = f"{PREFIX}/model.safetensors"
    data = store.read_bytes(key)
    if damage == "missing":
        store.delete(key)
    elif damage == "truncated":
        store.write_bytes(key, data[:-10])
    else:
        store.write_bytes(key, data[:100] + bytes([data[100] ^ 1]) + data[101:])
    before = snapshot(store)
    full = run_cli("verify", store.url_of(PREFIX), "--full")
    assert full.returncode == 1
    assert "FAIL model.safetensors:" in full.stdout
    expected = {"missing": "missing", "truncated": "size 9990 bytes, expected 10000",
                "flipped": "sha256 "}[damage]
    assert expected in full.stdout
    default = run_cli("verify", store.url_of(PREFIX))  # every byte by default (issue 44)
    assert default.returncode == 1 and expected in default.stdout
    sizes_only = run_cli("verify", store.url_of(PREFIX), "--quick")
    assert sizes_only.returncode == (0 if damage == "flipped" else 1)
    doc = json.loads(run_cli("verify", store.url_of(PREFIX), "--full", "--json").stdout)
    assert [p["path"] for p in doc["problems"]] == ["model.safetensors"]
    assert snapshot(store) == before


def test_extra_file_is_reported_not_failed(durable_store_url: str) -> None:
    store = committed(durable_store_url)
    store.write_bytes(f"{PREFIX}/notes.txt", b"unlisted")
    r = run_cli("verify", store.url_of(PREFIX), "--full")
    assert r.returncode == 0
    assert "EXTRA notes.txt: not listed in MANIFEST.json" in r.stdout


@pytest.mark.parametrize(("manifest", "rule"), [
    (None, "not committed"),
    (b"{not json", "not valid JSON"),
    (b'{"format": "tinyllm-manifest"}', "MANIFEST.json: "),
    (b'{"format":"tinyllm-manifest","format_version":1,"kind":"checkpoint",'
     b'"created_at":"2026-01-01T00:00:00Z","run_id":"r1","step":7,'
     b'"files":[{"path":"../../x","size":1,"sha256":"' + b"a" * 64 + b'"}]}', "'..' segment"),
])
def test_bad_manifest_is_not_committed(durable_store_url: str, manifest: bytes | None,
                                       rule: str) -> None:
    store = committed(durable_store_url)
    if manifest is None:
        store.delete(f"{PREFIX}/{MANIFEST}")
    else:
        store.write_bytes(f"{PREFIX}/{MANIFEST}", manifest)
    before = snapshot(store)
    r = run_cli("verify", store.url_of(PREFIX), "--full")
    assert r.returncode == 1
    assert rule in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    assert snapshot(store) == before


def test_verify_bad_url_is_a_clean_error() -> None:
    r = run_cli("verify", "gopher://x/y")
    assert r.returncode == 2
    assert r.stderr.startswith("error: gopher://x/y: unsupported store protocol")
    assert "Traceback" not in r.stderr
