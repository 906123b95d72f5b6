"""The main job end to end: ``registry quickstart`` on the embedded default (local
folder + SQLite) and on the S3 test server + Postgres, checked against the store."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from registry.refs.alias_history import read_head
from registry.store import open_store
from registry.protocol.verify import verify_directory
from tests.conftest import run_cli


def check_outcome(store_url: str, work: Path, stdout: str) -> None:
    store = open_store(store_url)
    for prefix in ("models/tiny-lm/1.0", "models/tiny-lm/1.1", "models/all-minilm-l6-v2/1"):
        assert verify_directory(store, prefix, full=True).ok, prefix
    assert read_head(store, "tiny-lm", "prod").version == "1.1"
    assert store.exists("ledger/revocations/synth-b.json")
    for model in ("tiny-lm", "all-minilm-l6-v2"):
        served = work / "serving" / model
        r = run_cli("verify", str(served), "--full")
        assert r.returncode == 0, r.stdout
    assert "SIGKILLed the trainer" in stdout and "resumed from step" in stdout
    assert "passing versions of tiny-lm now: ['1.1']" in stdout
    if importlib.util.find_spec("model_signing") is not None:
        # signed releases, pulled only with the trusted public key
        pub = work / "keys" / "release.pub"
        fingerprint = hashlib.sha256(pub.read_bytes()).hexdigest()
        for prefix in ("models/tiny-lm/1.1", "models/all-minilm-l6-v2/1"):
            assert store.exists(f"{prefix}/model.sig"), prefix
        for model in ("tiny-lm", "all-minilm-l6-v2"):
            assert (work / "serving" / model / "model.sig").exists()
        assert stdout.count(f"signed by {fingerprint[:16]}") == 2, stdout
    # it ends with `registry cache ls` of the serving host's cache: the command, its output
    lines = stdout.rstrip().splitlines()
    cache = work.resolve() / "cache"
    at = lines.index(f"$ registry cache ls --cache {cache}")
    assert lines[at - 2].startswith("see it all in a browser (read-only): registry serve")
    r = run_cli("cache", "ls", "--cache", str(cache))

    def same(out: list[str]) -> list[str]:  # the free space moves between two readings
        return [ln for ln in out if not ln.startswith("disk: ")]
    assert r.returncode == 0 and same(lines[at + 1:]) == same(r.stdout.rstrip().splitlines())
    assert lines[-2].startswith("disk: ") and " free of " in lines[-2]
    assert [ln.split()[:2] for ln in lines[at + 2:-2]] == [["all-minilm-l6-v2", "1"],
                                                          ["tiny-lm", "1.1"]]
    assert lines[-1].startswith("total: 2 models, 2 versions, ")


def test_quickstart_embedded_default(tmp_path: Path) -> None:
    r = run_cli("quickstart", cwd=tmp_path, env={"REGISTRY_STORE": "", "REGISTRY_DB": ""})
    assert r.returncode == 0, r.stderr + r.stdout
    assert (tmp_path / "registry.db").exists()
    check_outcome(str(tmp_path / "artifacts"), tmp_path / "quickstart", r.stdout)
    # the defaults: no options; the web extra is installed here, so no hint to install it
    assert "registry serve, then open http://127.0.0.1:8080/" in r.stdout
    assert "needs the web extra" not in r.stdout


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_quickstart_s3_and_postgres(tmp_path: Path, s3_bucket: str, db_url: str) -> None:
    store = f"s3://{s3_bucket}/registry"
    r = run_cli("quickstart", "--store", store, "--db", db_url, "--workdir", str(tmp_path / "q"),
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    check_outcome(store, tmp_path / "q", r.stdout)
    assert f"registry serve --store {store} --db {db_url}" in r.stdout
    r = run_cli("query", "tiny-lm", "--passing", "--json", "--store", store, "--db", db_url)
    assert [v["version"] for v in json.loads(r.stdout)] == ["1.1"]


def test_browse_line_names_the_web_extra_only_when_missing() -> None:
    from registry.examples.quickstart import browse_line, missing_web_module

    assert missing_web_module() is None  # the test lock installs the web extra
    assert "extra" not in browse_line("registry serve", None)
    line = browse_line("registry serve", "uvicorn")
    assert "needs the web extra (uvicorn is missing): pip install 'modeldir-registry[web]'" in line
