"""The read path of ``registry ls`` / ``registry show`` without SQLAlchemy
(registry.index.lite, registry.facade.quick; issue 44 item 6) says what the
Registry says, document for document, and hands back (None) whatever it
cannot answer alone."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from registry.api import Registry
from registry.facade import quick
from registry.formats.safetensors_io import write_safetensors
from registry.index.lite import open_lite
from registry.rules import numbers

ROOT = Path(__file__).resolve().parent.parent


def _source(work: Path, name: str, accuracy: float, sources: list[str]) -> tuple[Path, list, dict]:
    src = work / name
    src.mkdir()
    with open(src / "model.safetensors", "wb") as f:
        write_safetensors(f, {"proj.weight": np.ones((4, 8), dtype=np.float32),
                              "proj.bias": np.zeros((8,), dtype=np.float16)},
                          metadata={"format": "pt"}, path="model.safetensors")
    (src / "config.json").write_text('{"hidden_size": 8, "torch_dtype": "float32"}')
    ledger = [{"source_id": s, "name": f"{s} corpus", "uri": f"s3://data/{s}",
               "license": "CC-BY-4.0", "allowed_uses": ["train", "eval"], "revoked": False,
               "revoked_at": None, "revocation_reason": None} for s in sources]
    results = [{"task": "copy", "metric": "accuracy", "value": accuracy, "n": 100,
                "threshold": 0.5, "higher_is_better": True, "passed": True},
               {"task": "copy", "metric": "loss", "value": 0.25, "n": 100,
                "threshold": 1.0, "higher_is_better": False, "passed": True}]
    evals = {"suite": "smoke", "suite_version": "1", "created_at": "2026-11-29T10:00:00Z",
             "results": results, "passed": True}
    return src, ledger, evals


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """m@1 (fails the policy), m@2 (yanked, tagged), m@3 (a revoked source),
    m@4 (passes; alias prod), acme/tiny@1 and acme/small@1 (pass)."""
    work = tmp_path_factory.mktemp("lite")
    store, db = str(work / "artifacts"), f"sqlite:///{work / 'registry.db'}"
    with Registry(store, db=db) as reg:
        for version, acc, sources in (("1", 0.9, ["wiki"]), ("2", 0.97, ["wiki"]),
                                      ("3", 0.98, ["wiki", "books"]), ("4", 0.96, ["wiki"])):
            src, ledger, evals = _source(work, f"m{version}", acc, sources)
            reg.publish(src, "m", version, ledger=ledger, eval_summary=evals)
        for model in ("acme/tiny", "acme/small"):
            src, ledger, evals = _source(work, model.replace("/", "-"), 0.99, ["wiki"])
            reg.publish(src, model, "1", ledger=ledger, eval_summary=evals)
        reg.set_policy("m", ["accuracy>=0.95"])
        reg.yank("m", "2", "bad tokenizer")
        reg.set_tags("m", "2", {"team": "nlp", "stage": "dev"})
        reg.revoke("books", "licence withdrawn")
        reg.set_alias("m", "prod", "4")
    return store, db


def _same(a: object, b: object) -> None:
    assert numbers.dumps(a, sort_keys=True, default=str) == numbers.dumps(b, sort_keys=True,
                                                                           default=str)


@pytest.mark.parametrize("model_id", [None, "m", "acme/", "acme/tiny"])
def test_ls_says_what_the_registry_says(world: tuple[str, str], model_id: str | None) -> None:
    store, db = world
    rows = quick.ls(store, db, model_id)
    assert rows is not None
    with Registry(store, db=db) as reg:
        _same(rows, reg.ls(model_id))
    if model_id == "m":  # the cases are there: each gate's way to fail
        assert [(r["version"], r["passing"], r["yanked"]) for r in rows] == [
            ("4", True, False), ("3", False, False), ("2", False, True), ("1", False, False)]
        assert rows[0]["aliases"] == ["prod"] and rows[2]["tags"] == {"stage": "dev",
                                                                       "team": "nlp"}
    if model_id is None:
        assert [(r["model_id"], r["newest_passing"]) for r in rows] == [
            ("acme/small", "1"), ("acme/tiny", "1"), ("m", "4")]


@pytest.mark.parametrize("ref", ["m@1", "m@2", "m@3", "m@4", "acme/tiny@1"])
def test_show_says_what_the_registry_says(world: tuple[str, str], ref: str) -> None:
    store, db = world
    doc = quick.show(store, db, ref)
    assert doc is not None
    with Registry(store, db=db) as reg:
        _same(doc, reg.show(*reg.resolve(ref)))
    assert doc["weights"] and doc["config_dtype"] == "float32"


@pytest.mark.parametrize("ref", ["m@prod", "m@9", "nobody@1", "m", "m@", "M@1"])
def test_show_leaves_aliases_and_errors_to_the_registry(world: tuple[str, str], ref: str) -> None:
    store, db = world
    assert quick.show(store, db, ref) is None


@pytest.mark.parametrize("model_id", ["nobody", "Bad Name", "nobody/"])
def test_ls_leaves_unknown_models_to_the_registry(world: tuple[str, str], model_id: str) -> None:
    store, db = world
    assert quick.ls(store, db, model_id) is None


def test_only_a_sqlite_file_at_the_schema_head_is_read(world: tuple[str, str],
                                                       tmp_path: Path) -> None:
    """Postgres, a missing file, an older schema, a file that is no database:
    the full path answers (creates, refuses or reports)."""
    store, db = world
    assert open_lite("postgresql+psycopg://u@127.0.0.1:1/x") is None
    assert open_lite(f"sqlite:///{tmp_path / 'missing.db'}") is None
    assert not (tmp_path / "missing.db").exists()
    old = tmp_path / "old.db"
    shutil.copy(db.removeprefix("sqlite:///"), old)
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0005'")
    assert open_lite(f"sqlite:///{old}") is None
    assert quick.ls(store, f"sqlite:///{old}") is None
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    assert open_lite(f"sqlite:///{tmp_path / 'junk.db'}") is None
    lite = open_lite(db)
    assert lite is not None and lite.model_ids() == ["acme/small", "acme/tiny", "m"]
    lite.close()


def test_a_policy_the_store_decides_goes_to_the_registry(world: tuple[str, str],
                                                         tmp_path: Path) -> None:
    """A model whose policy forbids code (or lists signing keys) is answered
    by the Registry, which reads those gates from the store."""
    store, db = world
    copy_store, copy_db = tmp_path / "artifacts", tmp_path / "registry.db"
    shutil.copytree(store, copy_store)
    shutil.copy(db.removeprefix("sqlite:///"), copy_db)
    with Registry(str(copy_store), db=f"sqlite:///{copy_db}") as reg:
        reg.set_policy("acme/tiny", [], forbid_code=True)
    assert quick.ls(str(copy_store), f"sqlite:///{copy_db}", "acme/tiny") is None
    assert quick.ls(str(copy_store), f"sqlite:///{copy_db}") is None
    assert quick.show(str(copy_store), f"sqlite:///{copy_db}", "acme/tiny@1") is None
    assert quick.ls(str(copy_store), f"sqlite:///{copy_db}", "m") is not None


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from registry.cli import main; main()", *args],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [
    ["ls"], ["ls", "m"], ["ls", "acme/"], ["ls", "--json"], ["ls", "m", "--json"],
    ["show", "m@3"], ["show", "m@prod"], ["show", "m@2", "--json"], ["show", "acme/tiny@1"],
    ["show", "--db=DB", "m@4"], ["show", "m@9"], ["show", "nobody@1", "--json"],
    ["ls", "nobody"], ["ls", "m", "x"], ["show"], ["ls", "--store"],
    ["show", "m@1", "--bogus"]])
def test_a_plain_line_prints_what_typer_prints(world: tuple[str, str], tmp_path: Path,
                                               args: list[str]) -> None:
    """A line answered before typer loads (registry.cli.reads.run) prints the
    same bytes and exits alike as through the Typer app (taken when a root
    option's environment variable is set: REGISTRY_LOG_FORMAT=text changes no
    output); the store comes from the profile, the index from the environment
    or the flag."""
    store, db = world
    config = tmp_path / "registry.toml"
    config.write_text(f'default_profile = "here"\n[profile.here]\nstore = "{store}"\n')
    os.chmod(config, 0o600)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REGISTRY_CONFIG": str(config),
           "REGISTRY_DB": db, "COLUMNS": "200"}
    for var in ("REGISTRY_STORE", "REGISTRY_PROFILE", "REGISTRY_LOG_FORMAT"):
        env.pop(var, None)
    args = [a.replace("DB", db) for a in args]
    fast = _cli(args, env, tmp_path)
    typed = _cli(args, {**env, "REGISTRY_LOG_FORMAT": "text"}, tmp_path)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        typed.returncode, typed.stdout, typed.stderr)
    if args in (["ls"], ["show", "m@3"]):
        assert fast.returncode == 0 and fast.stdout.startswith(("acme/small\t", "m@3  "))
