"""What a release says about its weights (issue 14, items 7 and 9; item 2's
metadata rule on the paths that do not convert).

* int4 that would quantize no tensor (the group size is larger than every
  row) is refused before a byte is written (exit 2 from the CLI); a partial
  int4 release lists the quantized tensors in its card, in ``registry show``
  and in the index's dtype label (``int4 (1 of 2 tensors)``).
* ``publish --keep-dtype`` keeps F16 weights and says so: the card's
  "Stored weights" table, ``registry show`` (text and JSON) and ``registry
  ls`` state the stored dtype of every tensor group.
* A source whose ``format`` engines refuse is rewritten with ``"pt"`` (the
  source's value kept under ``tinyllm.source_format``, tensors bit for bit);
  one engines accept is copied byte for byte with its other metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

from registry.api import Registry
from registry.errors import UsageError
from registry.formats.safetensors_io import write_safetensors
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import docs_args, ledger_row, summary

RNG = np.random.default_rng(5)
TENSORS = {"proj.weight": RNG.standard_normal((4, 96), dtype=np.float32),  # cols 96
           "norm.bias": RNG.standard_normal(96, dtype=np.float32)}


def model_dir(tmp_path: Path, name: str, tensors: dict, metadata: dict | None) -> Path:
    d = tmp_path / name
    d.mkdir()
    with open(d / "model.safetensors", "wb") as f:
        write_safetensors(f, tensors, metadata=metadata, path="model.safetensors")
    (d / "config.json").write_text('{"hidden_size": 96}')
    return d


def test_int4_with_no_int4_tensor_is_refused(tmp_path: Path) -> None:
    src = model_dir(tmp_path, "src", TENSORS, {"format": "pt"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(url, db=db)
    with pytest.raises(UsageError, match="would quantize no tensor"):
        reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5),
                    dtype="int4", group_size=128)  # 96 columns: no group of 128 fits
    p = run_cli("publish", str(src), "--model-id", "m", "--version", "1", "--dtype", "int4",
                "--group-size", "256", *docs_args(tmp_path), "--store", url, "--db", db)
    assert p.returncode == 2 and "would quantize no tensor" in p.stderr, p.stderr
    assert str(src / "model.safetensors") in p.stderr and "96" in p.stderr
    assert not open_store(url).exists("models/m/1/MANIFEST.json")


def test_partial_int4_says_which_tensors(tmp_path: Path) -> None:
    src = model_dir(tmp_path, "src", TENSORS, {"format": "pt"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(url, db=db)
    reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5),
                dtype="int4", group_size=32)
    card = open_store(url).read_bytes("models/m/1/MODEL_CARD.md").decode()
    assert "int4 (1 of 2 tensors)" in card
    assert "| int4 (group size 32, F32 scales) | 1 | 384 | `proj.weight` |" in card
    assert "| F32 | 1 | 96 | `norm.bias` |" in card
    doc = reg.show("m", "1")
    assert doc["dtype"] == "int4 (1 of 2 tensors)"
    assert doc["weights"][0] == {"stored": "int4", "tensors": ["proj.weight"],
                                 "parameters": 384, "group_size": "32"}
    ls = run_cli("ls", "m", "--json", "--store", url, "--db", db)
    assert json.loads(ls.stdout)[0]["dtype"] == "int4 (1 of 2 tensors)", ls.stdout


def test_publish_keep_dtype_states_f16(tmp_path: Path) -> None:
    f16 = {k: v.astype(np.float16) for k, v in TENSORS.items()}
    src = model_dir(tmp_path, "src", f16, {"format": "pt", "producer": "a trainer"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(url, db=db)
    reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5),
                keep_dtype=True)
    store = open_store(url)
    assert store.read_bytes("models/m/1/model.safetensors") == \
        (src / "model.safetensors").read_bytes()  # as is, foreign metadata included
    card = store.read_bytes("models/m/1/MODEL_CARD.md").decode()
    assert "| Weights dtype | f16 (as published: not converted) |" in card
    assert "| F16 | 2 | 480 | `norm.bias`, `proj.weight` |" in card
    assert "**Warning:** weights stored as F16, kept as published (`--keep-dtype`)" in card
    p = run_cli("show", "m@1", "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    assert "weights F16: 2 tensors, 480 parameters (norm.bias, proj.weight)" in p.stdout
    assert "dtype f16" in p.stdout


def test_a_format_engines_refuse_is_rewritten_as_pt(tmp_path: Path) -> None:
    src = model_dir(tmp_path, "src", TENSORS, {"format": "tinyllm", "note": "kept"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    Registry(url, db=db).publish(src, "m", "1", ledger=[ledger_row()],
                                 eval_summary=summary(0.9, 0.5))
    path = Path(open_store(url).local_path("models/m/1/model.safetensors"))
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "note": "kept",
                                "tinyllm.source_format": "tinyllm"}
    out = safetensors.numpy.load_file(str(path))
    for k, v in TENSORS.items():
        np.testing.assert_array_equal(out[k], v)


def test_card_names_a_local_source_by_its_folder_name_only(tmp_path: Path) -> None:
    """The card is inside an immutable release: it must not carry the
    publisher's absolute path (their home, their working directory)."""
    src = model_dir(tmp_path, "my-model", TENSORS, {"format": "pt"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    Registry(url, db=db).publish(src, "m", "1", ledger=[ledger_row()],
                                 eval_summary=summary(0.9, 0.5))
    card = open_store(url).read_bytes("models/m/1/MODEL_CARD.md").decode()
    assert "| Source | imported from a local folder named `my-model` |" in card
    assert str(tmp_path) not in card


def test_card_source_keeps_remote_uris_and_checkpoints() -> None:
    from registry.release.card import card_source

    assert card_source({"uri": "s3://b/models/x"}) == {"uri": "s3://b/models/x"}
    assert card_source({"uri": "file:///home/al/x/"}) == {"uri": "x", "local": True}
    assert card_source({"uri": "/home/al/x"}) == {"uri": "x", "local": True}
    ckpt = {"run_id": "r1", "step": 10, "manifest_sha256": "ab"}
    assert card_source(ckpt) == ckpt
