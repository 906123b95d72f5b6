"""ModelRelease and gates on memory, local disk and S3: the seed's files, conversion,
every gate and its refusal, aliases, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from registry.refs.alias_history import read_head
from registry.refs.aliases import list_aliases, resolve, set_alias
from registry.checkpoint import CheckpointManager
from registry.errors import (
    GateFailedError,
    InvalidNameError,
    NotCommittedError,
    PointerConflictError,
    SchemaValidationError,
    VersionExistsError,
)
from registry.gating.ledger import revoke
from registry.release import ModelRelease, dequantize_int4
from registry.release.policy import set_policy
from registry.formats.safetensors_io import read_safetensors
from registry.store import Store
from registry.protocol.verify import read_manifest, verify_directory
from tests.ckpt_util import save
from tests.conftest import run_cli
from tests.release_util import head, ledger_row, summary

W = np.random.default_rng(7).standard_normal((8, 256), dtype=np.float32)


def checkpoint(store: Store) -> str:
    with CheckpointManager(store, "r1", keep_ckpts=0) as m:
        save(m, 10, params={"w": W, "b": np.linspace(-1, 1, 8, dtype=np.float32)},
             generation_config={"max_new_tokens": 8})
    return read_manifest(store, "runs/r1/ckpt/step-000010").digest


def release(store: Store, version: str = "1", **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("ledger", [ledger_row()])
    kw.setdefault("eval_summary", summary())
    return ModelRelease(store).create("r1", 10, "tiny", version, **kw)  # type: ignore[arg-type]


def weights(store: Store, version: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    key = f"models/tiny/{version}/model.safetensors"
    with store.open_read(key) as f:
        return read_safetensors(f, path=key, file_size=store.info(key).size)


def test_release_has_the_seed_files(store: Store) -> None:
    digest = checkpoint(store)
    r = release(store, heads=[head(input_dim=8)], tokenizer_config={"chat_template": "{{x}}"},
                card_fields={"intended_use": "unit tests"})
    prefix = "models/tiny/1"
    assert sorted(store.walk_files(prefix)) == [
        "MANIFEST.json", "MODEL_CARD.md", "config.json", "evals/summary.json",
        "generation_config.json", "heads/sentiment.json", "ledger.json", "model.safetensors",
        "tokenizer_config.json"]
    m = read_manifest(store, prefix)
    assert m.kind == "release" and m.meta["model_id"] == "tiny" and m.meta["version"] == "1"
    assert m.meta["source"] == {"run_id": "r1", "step": 10, "manifest_sha256": digest}
    assert r.manifest.digest == m.digest and verify_directory(store, prefix, full=True).ok
    card = store.read_bytes(f"{prefix}/MODEL_CARD.md").decode()
    for fact in ("tiny", "run `r1`, step 10", digest, "unit tests", "copy | accuracy", "wiki",
                 "2,056"):
        assert fact in card
    assert json.loads(store.read_bytes(f"{prefix}/ledger.json")) == [ledger_row()]
    tensors, meta = weights(store, "1")
    np.testing.assert_array_equal(tensors["w"], W)
    # a checkpoint's weights become a file engines load: format "pt", facts under tinyllm.*
    assert meta == {"format": "pt", "tinyllm.dtype": "f32"}


def test_bf16_rounds_to_nearest_even(store: Store) -> None:
    checkpoint(store)
    release(store, "bf16", dtype="bf16")
    tensors, _ = weights(store, "bf16")
    assert tensors["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(tensors["w"].view(np.uint16),
                                  W.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_int4_within_half_a_step(store: Store) -> None:
    checkpoint(store)
    release(store, "int4", dtype="int4", group_size=64)
    tensors, meta = weights(store, "int4")
    assert meta == {"format": "pt", "tinyllm.dtype": "int4", "quant": "int4", "group_size": "64",
                    "tinyllm.quantized": "w"}
    assert tensors["w.qweight"].shape == (8, 128) and tensors["w.qweight"].dtype == np.uint8
    assert tensors["w.scales"].shape == (8, 4)
    assert "b" in tensors and tensors["b"].dtype == np.float32  # 1-D stays F32
    deq = dequantize_int4(tensors["w.qweight"], tensors["w.scales"], 64)
    step = np.repeat(tensors["w.scales"], 64, axis=1)
    assert np.all(np.abs(deq - W) <= step / 2 + 1e-6)


def test_existing_version_is_refused(store: Store) -> None:
    checkpoint(store)
    release(store)
    before = store.walk_files("models/tiny/1")
    with pytest.raises(VersionExistsError, match="version exists"):
        release(store, dtype="bf16")
    assert store.walk_files("models/tiny/1") == before
    assert verify_directory(store, "models/tiny/1", full=True).ok


@pytest.mark.parametrize(("kw", "gate", "reason"), [
    ({"ledger": [ledger_row(allowed_uses=["eval"])]}, "ledger", "does not allow train"),
    ({"ledger": [ledger_row(revoked=True, revoked_at="2026-01-01T00:00:00Z",
                            revocation_reason="takedown")]}, "ledger", "revoked in ledger.json"),
    ({"eval_summary": summary(0.2)}, "evals", "copy/accuracy=0.2"),
    ({"require": ["accuracy>=0.95"]}, "policy:accuracy>=0.95", "required >= 0.95"),
    ({"require": ["f1>=0.5"]}, "policy:f1>=0.5", "not in the eval summary"),
])
def test_failing_gate_commits_nothing(store: Store, kw: dict[str, object], gate: str,
                                      reason: str) -> None:
    checkpoint(store)
    with pytest.raises(GateFailedError) as e:
        release(store, **kw)
    failing = {r.name: r.reason for r in e.value.results if not r.passed}
    assert gate in failing and reason in failing[gate]
    assert store.walk_files("models") == {}


@pytest.mark.parametrize(("kw", "rule"), [
    ({"ledger": [{"source_id": "x"}]}, "required"),
    ({"ledger": {"source_id": "x"}}, "array"),
    ({"eval_summary": {"suite": "s"}}, "required"),
    ({"eval_summary": []}, "object"),
])
def test_invalid_input_document_is_refused_before_the_gates(store: Store, kw: dict[str, object],
                                                            rule: str) -> None:
    """An invalid ledger or summary given to a release is the caller's input error
    (SchemaValidationError), not a failing gate: no gate runs, nothing is written."""
    checkpoint(store)
    with pytest.raises(SchemaValidationError, match=rule):
        release(store, **kw)
    assert store.walk_files("models") == {}


def test_live_revocation_and_policy_block_release(store: Store) -> None:
    checkpoint(store)
    revoke(store, "wiki", "license withdrawn")
    with pytest.raises(GateFailedError, match="revoked in the live ledger"):
        release(store)
    set_policy(store, "tiny", ["accuracy>=0.99"])
    with pytest.raises(GateFailedError, match="policy:accuracy>=0.99"):
        release(store, ledger=[ledger_row("books")])
    assert not store.exists("models/tiny/1/MANIFEST.json")


def test_gate_check_sees_later_revocation(store: Store) -> None:
    checkpoint(store)
    release(store)
    rel = ModelRelease(store)
    assert all(r.passed for r in rel.check("tiny", "1"))
    revoke(store, "wiki", "takedown request")
    results = {r.name: r for r in rel.check("tiny", "1")}
    assert not results["ledger"].passed and "takedown request" in results["ledger"].reason


@pytest.mark.parametrize("bad", ["../x", "a/b/c", "a//b", "", "refs", "..", ".hidden", "x" * 129])
def test_bad_names_are_refused(store: Store, bad: str) -> None:
    """Refused as a model id and as a version (``a/b`` is a namespaced model id
    since issue 44, never a version: see the next test)."""
    checkpoint(store)
    with pytest.raises(InvalidNameError):
        ModelRelease(store).create("r1", 10, bad, "1", ledger=[ledger_row()],
                                   eval_summary=summary())
    with pytest.raises(InvalidNameError):
        ModelRelease(store).create("r1", 10, "tiny", bad, ledger=[ledger_row()],
                                   eval_summary=summary())
    assert store.walk_files("models") == {}


def test_a_slash_is_refused_in_a_version(store: Store) -> None:
    checkpoint(store)
    with pytest.raises(InvalidNameError):
        ModelRelease(store).create("r1", 10, "tiny", "a/b", ledger=[ledger_row()],
                                   eval_summary=summary())
    assert store.walk_files("models") == {}


def test_head_with_wrong_input_dim_is_refused(store: Store) -> None:
    checkpoint(store)
    with pytest.raises(SchemaValidationError, match="differs from the model's hidden size 8"):
        release(store, heads=[head(input_dim=16)])
    assert store.walk_files("models") == {}


def test_aliases(store: Store) -> None:
    checkpoint(store)
    release(store, "1")
    release(store, "2")
    assert set_alias(store, "tiny", "prod", "1") is None
    assert set_alias(store, "tiny", "prod", "2") == "1"
    assert list_aliases(store, "tiny") == {"prod": "2"}
    assert resolve(store, "tiny", "prod") == "2" and resolve(store, "tiny", "1") == "1"
    with pytest.raises(NotCommittedError):
        set_alias(store, "tiny", "prod", "3")
    with pytest.raises(NotCommittedError):
        resolve(store, "tiny", "staging")
    from registry.protocol.pointer import move_pointer
    with pytest.raises(PointerConflictError):
        move_pointer(store, "models/tiny/refs/prod", "1", expected="1", check_expected=True)


def test_cli_release_gate_alias(durable_store_url: str, tmp_path: Path) -> None:
    from registry.store import open_store
    store = open_store(durable_store_url)
    checkpoint(store)
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals = tmp_path / "summary.json"
    evals.write_text(json.dumps(summary()))
    s = ["--store", durable_store_url]
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "1", "--dtype", "bf16", "--ledger", str(ledger), "--evals",
                str(evals), "--json", *s)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"]["step"] == 10
    assert verify_directory(store, "models/tiny/1", full=True).ok
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "1", "--ledger", str(ledger), "--evals", str(evals), *s)
    assert r.returncode == 4 and "version exists" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([ledger_row(allowed_uses=["eval"])]))
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                "--version", "2", "--ledger", str(bad), "--evals", str(evals), *s)
    assert r.returncode == 1
    assert "FAIL ledger: source wiki does not allow train" in r.stdout
    assert "PASS evals" in r.stdout and not store.exists("models/tiny/2/MANIFEST.json")
    assert run_cli("gate", "check", "tiny@1", *s).returncode == 0
    r = run_cli("alias", "set", "tiny", "prod", "1", *s)
    assert r.returncode == 0 and read_head(store, "tiny", "prod").version == "1"
    assert run_cli("gate", "check", "tiny@prod", *s).returncode == 0
    revoke(store, "wiki", "withdrawn")
    r = run_cli("gate", "check", "tiny@prod", "--json", *s)
    assert r.returncode == 1 and json.loads(r.stdout)["passed"] is False
    r = run_cli("alias", "set", "tiny", "stable", "1", *s)
    assert r.returncode == 1 and "fails the release gates" in r.stderr
    assert run_cli("alias", "set", "tiny", "stable", "1", "--force", *s).returncode == 0
    assert json.loads(run_cli("alias", "ls", "tiny", "--json", *s).stdout) == {
        "prod": "1", "stable": "1"}
