"""KServe's storage initializer for ``registry://`` URIs (issue 48, item 6).

Each case runs ``registry-storage-initializer URI DEST`` as KServe runs its
``ClusterStorageContainer``: a process with the two arguments, the store and
the trust in its environment, DEST an existing empty folder; the outcome is
the exit code, the files in DEST and the termination message.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.refs.aliases import set_alias
from registry.trust.keys import generate
from registry.lifecycle.yank import yank
from registry.store import open_store
from tests.hub_util import publish, release_files, tiny_bert

SCRIPT = Path(sys.executable).parent / "registry-storage-initializer"


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), 1)


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}/root"
    return str(tmp_path / "store")


def initializer(uri: str, dest: Path, store: str, **env: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), "the console script: pip install -e ."
    term = dest.parent / "termination-log"
    term.unlink(missing_ok=True)
    full = {**os.environ, "REGISTRY_STORE": store, "REGISTRY_TERMINATION_LOG": str(term),
            **env}
    full.pop("REGISTRY_CACHE", None)
    return subprocess.run([str(SCRIPT), uri, str(dest)], capture_output=True, text=True,
                          env=full, timeout=300)


def placed(dest: Path) -> dict[str, str]:
    return {str(p.relative_to(dest)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(dest.rglob("*")) if p.is_file()}


def termination(dest: Path) -> str:
    return (dest.parent / "termination-log").read_text()


def _prod(store_url: str, src: Path) -> None:
    publish(store_url, src, "tiny", "1")
    with open_store(store_url) as s:
        set_alias(s, "tiny", "prod", "1")


def test_an_alias_is_placed_verified_into_an_existing_folder(store_url: str, src: Path,
                                                             tmp_path: Path) -> None:
    _prod(store_url, src)
    dest = tmp_path / "mnt" / "models"
    dest.mkdir(parents=True)
    r = initializer("registry://tiny@prod", dest, store_url)
    assert r.returncode == 0, r.stderr
    # every file of the release and its MANIFEST.json, nothing else (no staging, no cache)
    assert placed(dest) == release_files(store_url, "tiny", "1")


def test_a_rerun_accepts_the_release_placed_and_refuses_other_bytes(src: Path,
                                                                   tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    _prod(store_url, src)
    dest = tmp_path / "models"
    assert initializer("registry://tiny@prod", dest, store_url).returncode == 0
    again = initializer("registry://tiny@prod", dest, store_url)
    assert again.returncode == 0, again.stderr  # an init container run again: accepted
    assert placed(dest) == release_files(store_url, "tiny", "1")
    (dest / "config.json").write_text("{}")
    bad = initializer("registry://tiny@prod", dest, store_url)
    assert bad.returncode == 4, bad.stderr
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1
    assert "must start empty" in termination(dest)


def test_a_yanked_release_is_refused_and_nothing_placed(s3_bucket: str, src: Path,
                                                        tmp_path: Path) -> None:
    store_url = f"s3://{s3_bucket}/root"
    publish(store_url, src, "tiny", "1")
    with open_store(store_url) as s:
        yank(s, "tiny", "1", "bad eval")
    dest = tmp_path / "models"
    dest.mkdir()
    r = initializer("registry://tiny@1", dest, store_url)
    assert r.returncode == 1, r.stderr
    assert list(dest.iterdir()) == []
    assert "yank" in termination(dest) and termination(dest).startswith("error: ")


def test_under_trusted_keys_an_unsigned_release_is_refused_a_signed_one_placed(
        src: Path, tmp_path: Path) -> None:
    store_url = str(tmp_path / "store")
    keys = tmp_path / "trusted"
    keys.mkdir(mode=0o755)
    priv, pub, _ = generate(tmp_path / "release.pem", public_path=keys / "release.pub")
    publish(store_url, src, "tiny", "1")
    publish(store_url, src, "tiny", "2", sign_key=str(priv))
    dest = tmp_path / "models"
    dest.mkdir()
    env = {"REGISTRY_TRUSTED_KEYS": str(keys)}
    r = initializer("registry://tiny@1", dest, store_url, **env)
    assert r.returncode == 1, r.stderr
    assert list(dest.iterdir()) == []
    assert "sign" in termination(dest)
    ok = initializer("registry://tiny@2", dest, store_url, **env)
    assert ok.returncode == 0, ok.stderr
    assert placed(dest) == release_files(store_url, "tiny", "2")


@pytest.mark.parametrize("uri,code", [("s3://bucket/model", 2), ("registry://nosuch@1", 3)])
def test_a_bad_uri_is_one_line_and_its_exit_code(uri: str, code: int, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    dest = tmp_path / "models"
    r = initializer(uri, dest, str(store))
    assert r.returncode == code, r.stderr
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
    assert termination(dest) == r.stderr


def test_the_python_api_places_a_release_and_raises_the_refusal(src: Path,
                                                                tmp_path: Path) -> None:
    from registry.cli.kserve import initialize
    from registry.errors import GateFailedError

    store_url = str(tmp_path / "store")
    publish(store_url, src, "tiny", "1")
    publish(store_url, src, "tiny", "2")
    with open_store(store_url) as s:
        yank(s, "tiny", "2", "bad eval")
    doc = initialize("registry://tiny@1", tmp_path / "ok", store=store_url)
    assert doc["placed"] and doc["version"] == "1"
    assert placed(tmp_path / "ok") == release_files(store_url, "tiny", "1")
    with pytest.raises(GateFailedError, match="yank"):
        initialize("registry://tiny@2", tmp_path / "no", store=store_url)
    assert list((tmp_path / "no").iterdir()) == []
