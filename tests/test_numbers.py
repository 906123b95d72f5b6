"""Numbers that JSON and the index can hold (issue 31 item 5): a float that is
not finite in binary64 (``1e400``, NaN, infinity) or an integer outside the
index's 64 bits (``10**400``) is refused where it enters, naming the file and
the field, with nothing committed; what the registry writes is strict JSON."""

from __future__ import annotations

import json
import re
import math
from pathlib import Path

import numpy as np
import pytest

from registry.rules import numbers
from registry.checkpoint import CheckpointManager
from registry.errors import DocumentError, UsageError
from registry.gating.gates import Threshold
from registry.release import ModelRelease
from registry.rules.schemas import load_json
from registry.store import Store, open_store
from tests.ckpt_util import adamw, model, save, trainer_state
from tests.conftest import run_cli
from tests.release_util import head, ledger_row, summary

BIG = 10**400


def _checkpoint(store: Store) -> None:
    with CheckpointManager(store, "r1", keep_ckpts=0) as m:
        save(m, 10, params={"w": np.ones((8, 8), dtype=np.float32)})


@pytest.mark.parametrize(("text", "field"), [
    (b'{"a": [1, {"b": 1e400}]}', "a[1].b"),
    (b'{"a": -1e400}', "a"),
    (b'{"n": ' + str(BIG).encode() + b"}", "n"),
    (b'{"n": 9223372036854775808}', "n"),
    (b'{"n": -9223372036854775809}', "n"),
])
def test_load_json_names_the_field(text: bytes, field: str) -> None:
    with pytest.raises(DocumentError, match=rf"^f\.json: {re.escape(field)}: .*64-bit") as e:
        load_json(text, path="f.json")
    assert len(str(e.value)) < 200  # never the whole 400-digit number


def test_the_edges_of_64_bits_are_kept() -> None:
    doc = load_json(b'{"a": 9223372036854775807, "b": -9223372036854775808, "c": 1.7e308}',
                    path="f.json")
    assert doc == {"a": 2**63 - 1, "b": -(2**63), "c": 1.7e308}


def test_written_json_is_strict() -> None:
    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError):
            numbers.dumps({"v": bad})


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e308 * 10, BIG, -BIG])
def test_api_release_refuses_the_number_and_commits_nothing(store: Store, value: object) -> None:
    _checkpoint(store)
    evals = summary()
    evals["results"][0]["value"] = value
    with pytest.raises(DocumentError, match=r"evals/summary\.json: results\[0\]\.value"):
        ModelRelease(store).create("r1", 10, "tiny", "1", ledger=[ledger_row()],
                                   eval_summary=evals)
    assert store.walk_files("models") == {}


def test_api_release_refuses_a_head_weight(store: Store) -> None:
    _checkpoint(store)
    h = head(input_dim=8)
    h["weight"][1][3] = math.inf
    with pytest.raises(DocumentError, match=r"weight\[1\]\[3\]"):
        ModelRelease(store).create("r1", 10, "tiny", "1", ledger=[ledger_row()],
                                   eval_summary=summary(), heads=[h])
    assert store.walk_files("models") == {}


@pytest.mark.parametrize("field", ["tokens_seen", "learning_rate"])
def test_trainer_state_refused_before_any_write(store: Store, field: str) -> None:
    with CheckpointManager(store, "r1", keep_ckpts=0) as m:
        state = trainer_state(10)
        state[field] = BIG if field == "tokens_seen" else math.inf
        params = model(10)
        with pytest.raises(DocumentError, match=rf"trainer_state\.json: {field}"):
            m.save(10, params, adamw(params), optimizer="adamw", config={"hidden_size": 8},
                   trainer_state=state)
    assert not any(k.endswith("MANIFEST.json") for k in store.walk_files("runs"))


@pytest.mark.parametrize("text", ["acc>=1e999", "acc<=-1e400", "acc>=nan", "acc>=inf"])
def test_thresholds_must_be_finite(text: str) -> None:
    with pytest.raises(UsageError, match="finite"):
        Threshold.parse(text)


def test_cli_publish_refuses_huge_numbers(durable_store_url: str, tmp_path: Path) -> None:
    """The CLI: exit 5 naming the file and the field, nothing in the store or
    the index, for 1e400 and a 400-digit integer; `--require` of 1e999 is a
    usage error (exit 2)."""
    store = open_store(durable_store_url)
    _checkpoint(store)
    ledger = tmp_path / "ledger.json"
    ledger.write_text(json.dumps([ledger_row()]))
    db = f"sqlite:///{tmp_path / 'index.db'}"
    for i, number in enumerate(["1e400", str(BIG)]):
        evals = tmp_path / f"summary{i}.json"
        evals.write_text(json.dumps(summary(value=0.75)).replace("0.75", number))
        r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", "tiny",
                    "--version", str(i), "--ledger", str(ledger), "--evals", str(evals),
                    "--store", durable_store_url, "--db", db)
        assert r.returncode == 5, r.stderr
        assert f"{evals}: results[0].value" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr) < 400
    assert store.walk_files("models") == {}
    r = run_cli("query", "tiny", "--passing", "--require", "accuracy>=1e999", "--db", db)
    assert r.returncode == 2 and "finite" in r.stderr, r.stderr
