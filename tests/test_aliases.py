"""Versions and aliases never share a name (issue 14, item 4).

The field report: ``registry alias set m 2 1`` was accepted; once version 2
was published, ``m@2`` silently meant the version while ``alias ls`` still
showed ``2 -> 1``. The rule (registry.refs.aliases): alias names shaped like a
version (a digit first, or v + digit) are refused (exit 2); an alias cannot
take an existing version's name, nor a version an existing alias's (exit 4);
a legacy clash is refused when resolved (exit 2), never silently picked.
Checked through the CLI (real processes) and the Python API, on local disk
and S3.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from registry.refs.aliases import list_aliases, resolve
from registry.api import Registry
from registry.errors import AmbiguousRefError, InvalidNameError, NameTakenError
from registry.protocol.pointer import move_pointer
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import docs_args, ledger_row, summary
from tests.test_pull import release_files


def model_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    if not src.exists():
        for rel, data in release_files().items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
    return src


def publish_cli(url: str, db: str, tmp_path: Path, version: str) -> subprocess.CompletedProcess[str]:
    return run_cli("publish", str(model_dir(tmp_path)), "--model-id", "m", "--version", version,
                   *docs_args(tmp_path), "--store", url, "--db", db)


def assert_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def publish_api(reg: Registry, tmp_path: Path, version: str) -> None:
    reg.publish(model_dir(tmp_path), "m", version, ledger=[ledger_row()],
                eval_summary=summary(0.9, 0.5))


def test_version_shaped_alias_is_refused(durable_store_url: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(durable_store_url, db=db)
    publish_api(reg, tmp_path, "1")
    p = run_cli("alias", "set", "m", "2", "1", "--store", durable_store_url, "--db", db)
    assert_error(p, 2, "alias '2'", "looks like a version")
    for name in ("2", "1.0", "v3", "V10", "0-rc1"):
        with pytest.raises(InvalidNameError, match="looks like a version"):
            reg.set_alias("m", name, "1")
    assert list_aliases(open_store(durable_store_url), "m") == {}
    reg.set_alias("m", "v-next", "1")  # a letter, then no digit: an alias
    assert list_aliases(open_store(durable_store_url), "m") == {"v-next": "1"}


def test_alias_and_version_never_share_a_name(durable_store_url: str, tmp_path: Path) -> None:
    """Versions need not be numbers: ``beta`` may be a version or an alias,
    whichever came first."""
    db = f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(durable_store_url, db=db)
    publish_api(reg, tmp_path, "1")
    publish_api(reg, tmp_path, "beta")
    p = run_cli("alias", "set", "m", "beta", "1", "--store", durable_store_url, "--db", db)
    assert_error(p, 4, "a version named 'beta' exists")

    ok = run_cli("alias", "set", "m", "gamma", "1", "--store", durable_store_url, "--db", db)
    assert ok.returncode == 0, ok.stderr
    p = publish_cli(durable_store_url, db, tmp_path, "gamma")
    assert_error(p, 4, "an alias named 'gamma' exists")
    store = open_store(durable_store_url)
    assert not store.exists("models/m/gamma/MANIFEST.json")
    assert resolve(store, "m", "gamma") == "1"
    with pytest.raises(NameTakenError):
        publish_api(reg, tmp_path, "gamma")
    with pytest.raises(NameTakenError):
        reg.set_alias("m", "beta", "1")


def test_a_legacy_clash_is_refused_not_resolved(store_url_local: str, tmp_path: Path) -> None:
    """An alias ``2 -> 1`` written before the rule, then version 2 published
    by an older registry: ``m@2`` is refused, naming both, by pull and show."""
    db = f"sqlite:///{tmp_path / 'i.db'}"
    url = store_url_local
    reg = Registry(url, db=db)
    publish_api(reg, tmp_path, "1")
    publish_api(reg, tmp_path, "2")
    store = open_store(url)
    move_pointer(store, "models/m/refs/2", "1", expected=None, check_expected=True)
    with pytest.raises(AmbiguousRefError, match="both a version and an alias"):
        resolve(store, "m", "2")
    p = run_cli("pull", "m@2", "--to", str(tmp_path / "serve"), "--cache",
                str(tmp_path / "cache"), "--store", url)
    assert_error(p, 2, "m@2", "both a version and an alias are named '2'")
    assert not (tmp_path / "serve").exists()
    assert resolve(store, "m", "1") == "1"


@pytest.fixture
def store_url_local(tmp_path: Path) -> str:
    return str(tmp_path / "store")
