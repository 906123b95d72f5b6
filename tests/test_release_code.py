"""Code inside releases is visible and gateable (issue 30, item 7): pickle
files and remote code (``*.py``, ``auto_map``) are listed by ``show``, its
``--json``, the API and the web page; ``publish --forbid-code`` and the
policy's ``forbid_code`` refuse them at publish, alias moves and
``pull --require-passing``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from registry.api import Registry
from registry.errors import GateFailedError
from registry.release.code import code_files
from registry.web import create_app
from tests.release_util import ledger_row, summary
from tests.test_cli_contract import _run as run_batch
from tests.test_signing import MODEL, _safetensors

AUTO_MAP = {"AutoModel": "modeling_evil.EvilModel"}


def _dir(root: Path, name: str, *, code: bool) -> Path:
    d = root / name
    d.mkdir()
    (d / "model.safetensors").write_bytes(_safetensors(1))
    config = {"hidden_size": 8, **({"auto_map": AUTO_MAP} if code else {})}
    (d / "config.json").write_text(json.dumps(config))
    if code:
        (d / "modeling_evil.py").write_text("import os\nos.system('id')\n")
        (d / "training_args.bin").write_bytes(b"\x80\x04K\x01.")
    return d


def _publish(reg: Registry, src: Path, version: str, **kw: object) -> None:
    reg.publish(src, MODEL, version, ledger=[ledger_row()], eval_summary=summary(), **kw)


def test_code_files_rules() -> None:
    found = code_files(["a/model.PT", "w.safetensors", "x.py", "tokenizer_config.json",
                        "n.npy", "config.json"],
                       lambda n: json.dumps({"auto_map": {"A": "m.B"}} if n == "config.json"
                                            else {}).encode())
    assert found == {"pickle": ["a/model.PT", "n.npy"], "remote_code": ["x.py"],
                     "auto_map": {"config.json": {"A": "m.B"}}}
    assert code_files(["config.json"], lambda n: b"not json")["auto_map"] == {}


def test_code_is_listed_and_refused_where_the_policy_forbids_it(tmp_path: Path) -> None:
    store, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    with Registry(store, db) as reg:
        _publish(reg, _dir(tmp_path, "code", code=True), "1")
        _publish(reg, _dir(tmp_path, "clean", code=False), "2")
        doc = reg.show(MODEL, "1")
        assert doc["code"] == {"pickle": ["training_args.bin"],
                               "remote_code": ["modeling_evil.py"],
                               "auto_map": {"config.json": AUTO_MAP}}
        assert reg.show(MODEL, "2")["code"] == {"pickle": [], "remote_code": [],
                                                "auto_map": {}}
        with pytest.raises(GateFailedError) as e:
            _publish(reg, _dir(tmp_path, "code3", code=True), "3", forbid_code=True)
        assert any(r.name == "code" and not r.passed for r in e.value.results)
        assert not (Path(store) / "models" / MODEL / "3").exists()
        reg.set_alias(MODEL, "prod", "1")  # no policy yet: allowed
        reg.set_policy(MODEL, [], forbid_code=True)
        with pytest.raises(GateFailedError, match="code"):
            reg.set_alias(MODEL, "prod", "1")
        reg.set_alias(MODEL, "prod", "2")
        gates = {g["gate"]: g for g in reg.show(MODEL, "1")["gates"]}
        assert not gates["code"]["passed"] and "modeling_evil.py" in gates["code"]["reason"]
        assert [r["version"] for r in reg.passing(MODEL)] == ["2"]
        with pytest.raises(GateFailedError):
            _publish(reg, _dir(tmp_path, "code4", code=True), "4")  # the policy alone
        with TestClient(create_app(reg), base_url="http://localhost") as c:
            page = c.get(f"/models/{MODEL}/1").text
            assert "runs code when loaded" in page and "modeling_evil.py" in page
            assert c.get(f"/api/v1/releases/{MODEL}/1").json()["code"]["remote_code"] == \
                ["modeling_evil.py"]
    s = ["--store", store]
    argvs = [["pull", f"{MODEL}@1", "--require-passing", "--to", str(tmp_path / "o1"),
              "--cache", str(tmp_path / "c"), *s],
             ["pull", f"{MODEL}@2", "--require-passing", "--to", str(tmp_path / "o2"),
              "--cache", str(tmp_path / "c"), *s],
             ["show", f"{MODEL}@1", *s, "--db", db],
             ["publish", str(_dir(tmp_path, "code5", code=True)), "--model-id", "other",
              "--version", "1", "--forbid-code", "--ledger", str(_write(tmp_path, "l.json",
                                                                      [ledger_row()])),
              "--evals", str(_write(tmp_path, "s.json", summary())), *s, "--db", db]]
    (c1, _, e1), (c2, _, e2), (c3, o3, _), (c5, _, e5) = run_batch(tmp_path, argvs)
    assert c1 == 1 and "code" in e1 and not (tmp_path / "o1").exists(), e1
    assert c2 == 0, e2
    assert c3 in (0, 1) and "code: pickle files training_args.bin; remote code " \
        "modeling_evil.py; auto_map in config.json" in o3, o3
    assert c5 == 1 and "code" in e5 and not (Path(store) / "models" / "other").exists(), e5


def _write(root: Path, name: str, doc: object) -> Path:
    p = root / name
    p.write_text(json.dumps(doc))
    return p
