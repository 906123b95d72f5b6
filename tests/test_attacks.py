"""Attacks on the registry by the parties of the threat model (a store writer,
another party on the wire, a web page), each through real processes and real
files; every test here failed before the fix it names.

Rooms: tests only.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.lifecycle.yank import yank  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.store import open_store  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.test_signing import keypair, model_dir  # noqa: E402
from tests.web_util import serve  # noqa: E402


def _hub_error(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, str(e.headers.get("X-Error-Message"))


def test_removed_yank_through_serve_is_a_rollback_not_a_signature(tmp_path: Path) -> None:
    """A store writer removes a yank record that `registry serve` saw: the Hub
    routes (and a `pull --from` through them) refuse it as the rollback it is,
    not as "signature not accepted" (RollbackError is a SignatureError)."""
    store = open_store(str(tmp_path / "s"))
    (tmp_path / "keys").mkdir()
    key, pub = keypair(tmp_path, "rel")
    ModelRelease(store).publish(model_dir(tmp_path, "a"), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary(), sign_key=key)
    env = {"REGISTRY_CACHE": str(tmp_path / "servecache")}
    with serve(store.url, f"sqlite:///{tmp_path / 'i.db'}", "--trusted-key", str(pub),
               env=env) as base:
        url = f"{base}/api/models/registry/m/revision/1"
        assert _hub_error(url)[0] == 200
        yank(store, "m", "1", "broken")
        code, why = _hub_error(url)
        assert code == 403 and "yanked" in why, why
        store.delete("ledger/yanks/m/1.json")  # the store writer's rollback
        code, why = _hub_error(url)
        assert code == 403 and "never taken as lifted" in why, why
        assert "signature not accepted" not in why, why
        r = run_cli("pull", "m@1", "--from", base, "--to", str(tmp_path / "out"),
                    "--cache", str(tmp_path / "c"), "--trusted-key", str(pub))
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "never taken as lifted" in r.stderr and "signature not accepted" not in r.stderr
        assert not (tmp_path / "out").exists()
    doc = json.loads((tmp_path / "s/models/m/1/MANIFEST.json").read_text())
    assert doc["version"] == "1"


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_publish_failing_manifest_check_takes_no_sequence(kind: str, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    """A publish whose manifest breaks a bound (here REGISTRY_MAX_MANIFEST_FILES)
    fails before it takes the model's sequence number: it used to leave
    models/<id>/.sequence behind, and index rebuild then showed a model with
    0 releases."""
    from tests.conftest import make_store_url

    url = make_store_url(kind, request, tmp_path)
    (tmp_path / "l.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "e.json").write_text(json.dumps(summary()))
    src = model_dir(tmp_path, "a")
    db = f"sqlite:///{tmp_path / 'i.db'}"
    r = run_cli("publish", str(src), "--model-id", "lim", "--version", "1", "--ledger",
                str(tmp_path / "l.json"), "--evals", str(tmp_path / "e.json"),
                "--store", url, "--db", db, env={"REGISTRY_MAX_MANIFEST_FILES": "2"})
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "REGISTRY_MAX_MANIFEST_FILES" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    store = open_store(url)
    assert not store.exists("models/lim/.sequence")
    assert store.walk_files("models") == {}
    assert run_cli("index", "rebuild", "--store", url, "--db", db).returncode == 0
    if kind == "s3":  # no folders: nothing of the model is left at all
        listed = run_cli("ls", "--json", "--store", url, "--db", db)
        assert "lim" not in listed.stdout, listed.stdout
