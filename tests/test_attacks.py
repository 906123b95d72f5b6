"""Attacks on the registry by the parties of the threat model (a store writer,
another party on the wire, a web page), each through real processes and real
files; every test here failed before the fix it names.

Rooms: tests only.
"""

from __future__ import annotations

import json
import os
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
        req = urllib.request.Request(f"{base}/v2/m/manifests/1", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json"})
        with pytest.raises(urllib.error.HTTPError) as oci:
            urllib.request.urlopen(req, timeout=60)
        with oci.value:
            body = oci.value.read().decode()
        assert oci.value.code == 403 and "never taken as lifted" in body, body
        assert "signature not accepted" not in body
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


def test_kserve_rerun_is_admitted_by_the_trust_function(tmp_path: Path) -> None:
    """KServe's storage initializer run again on a DEST that holds the release
    (an init container restarted, its emptyDir kept) accepted it after the
    gates alone: a key revoked on the host since, or a yank under
    REGISTRY_ALLOW_FAILING=1, was refused by a fresh DEST (and by pull) but
    accepted by the re-run, exit 0. Both now go through the trust function."""
    import subprocess
    import sys

    from registry.trust.keys import generate

    script = Path(sys.executable).parent / "registry-storage-initializer"
    store_url = str(tmp_path / "store")
    keys = tmp_path / "trusted"
    keys.mkdir(mode=0o755)
    priv, pub, _ = generate(tmp_path / "release.pem", public_path=keys / "release.pub")
    src = model_dir(tmp_path, "a")
    for v in ("1", "2"):
        ModelRelease(store_url).publish(src, "m", v, ledger=[ledger_row()],
                                        eval_summary=summary(), sign_key=str(priv))

    def init(version: str, dest: Path, **env: str) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, "REGISTRY_STORE": store_url, "REGISTRY_TRUSTED_KEYS": str(keys),
                "REGISTRY_TERMINATION_LOG": str(tmp_path / "term"), **env}
        full.pop("REGISTRY_CACHE", None)
        return subprocess.run([str(script), f"registry://m@{version}", str(dest)],
                              capture_output=True, text=True, env=full, timeout=300)

    d1, d2 = tmp_path / "d1", tmp_path / "d2"
    assert init("1", d1).returncode == 0 and init("2", d2).returncode == 0
    # a yank, with failing gates allowed: a fresh DEST refuses it, so must a re-run
    yank(open_store(store_url), "m", "2", "broken")
    fresh = init("2", tmp_path / "d2b", REGISTRY_ALLOW_FAILING="1")
    assert fresh.returncode == 1 and "yank" in fresh.stderr, fresh.stderr
    again = init("2", d2, REGISTRY_ALLOW_FAILING="1")
    assert again.returncode == 1 and "yank" in again.stderr, again.stderr
    assert again.stderr.startswith("error: ") and again.stderr.count("\n") == 1
    # the signing key revoked on this host: a fresh DEST refuses m@1, so must a re-run
    r = run_cli("keys", "revoke", str(keys / "release.pub"), "--reason", "stolen",
                "--trusted-keys", str(keys))
    assert r.returncode == 0, r.stderr
    fresh = init("1", tmp_path / "d1b")
    assert fresh.returncode == 1 and "revoked" in fresh.stderr, fresh.stderr
    again = init("1", d1)
    assert again.returncode == 1 and "revoked" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr


def test_a_bad_manifest_entry_is_named_by_its_own_index(tmp_path: Path) -> None:
    """A store writer breaks the fourth entry of a MANIFEST.json: every door's
    one-line error names files[3], the entry broken (entries that pass the fast
    check were dropped before the schema ran, so it said files[0])."""
    store = open_store(str(tmp_path / "s"))
    ModelRelease(store).publish(model_dir(tmp_path, "a"), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    path = tmp_path / "s/models/m/1/MANIFEST.json"
    doc = json.loads(path.read_text())
    assert len(doc["files"]) > 4
    doc["files"][3]["size"] = -1
    path.write_text(json.dumps(doc))
    for args in (["pull", "m@1", "--to", str(tmp_path / "out"), "--store", store.url,
                  "--cache", str(tmp_path / "c")],
                 ["verify", str(tmp_path / "s/models/m/1")]):
        r = run_cli(*args)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "files[3].size: -1 is less than the minimum of 0" in r.stderr, r.stderr
        assert "files[0]" not in r.stderr


@pytest.mark.parametrize("text,rule", [('{"a":', "not valid JSON"),
                                       ('{"temperature": -5}', "temperature: -5 is less than")])
def test_publish_refuses_a_carried_generation_config_that_breaks_its_schema(
        text: str, rule: str, tmp_path: Path) -> None:
    """A directory's own generation_config.json is held to the schema a given
    one is (DESIGN section 4): it was carried verbatim, so `{"a":` was released."""
    src = model_dir(tmp_path, "a")
    (src / "generation_config.json").write_text(text)
    (tmp_path / "l.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "e.json").write_text(json.dumps(summary()))
    url = str(tmp_path / "s")
    r = run_cli("publish", str(src), "--model-id", "g", "--version", "1", "--ledger",
                str(tmp_path / "l.json"), "--evals", str(tmp_path / "e.json"), "--store", url,
                "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
    assert f"{src / 'generation_config.json'}: {rule}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s/models/g/1").exists()
    (src / "generation_config.json").write_text('{"max_new_tokens": 8, "x_custom": [1]}')
    ok = run_cli("publish", str(src), "--model-id", "g", "--version", "1", "--ledger",
                 str(tmp_path / "l.json"), "--evals", str(tmp_path / "e.json"), "--store", url,
                 "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "s/models/g/1/generation_config.json").read_text() == \
        '{"max_new_tokens": 8, "x_custom": [1]}'


def test_a_release_copied_under_another_version_is_refused_without_keys(tmp_path: Path) -> None:
    """A store writer (or a careless `cp -r`) puts m@1's directory, manifest
    and all, at models/m/7: index rebuild calls it damaged, but pull and load
    (every door of the trust function) handed out m@1's bytes as m@7. Now the
    manifest's own model id and version must be the ones asked for."""
    import shutil

    store = open_store(str(tmp_path / "s"))
    ModelRelease(store).publish(model_dir(tmp_path, "a"), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    shutil.copytree(tmp_path / "s/models/m/1", tmp_path / "s/models/m/7")
    for args in (["pull", "m@7", "--to", str(tmp_path / "out")], ["load", "m@7", "--check"]):
        r = run_cli(*args, "--store", store.url, "--cache", str(tmp_path / "c"))
        assert r.returncode == 5 and "Traceback" not in r.stderr, r.stderr
        assert "is the manifest of m@1, not m@7" in r.stderr
    assert not (tmp_path / "out").exists()
    ok = run_cli("pull", "m@1", "--to", str(tmp_path / "ok"), "--store", store.url,
                 "--cache", str(tmp_path / "c"))
    assert ok.returncode == 0, ok.stderr
