"""``publish`` follows seed 000's release table (issue 46 item 2): weights "F32
or BF16, or int4" by default (F16/F64/integer tensors converted to F32,
``--keep-dtype`` keeps them with a warning in the card), and MODEL_CARD.md
"from templates/MODEL_CARD.md" (``--card FILE`` is the rendered card's free
text; ``--card-verbatim`` stores the file as it is)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import safetensors.numpy

from registry.api import Registry
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import docs_args, ledger_row, summary
from tests.test_release_weights import model_dir

RNG = np.random.default_rng(7)


def test_publish_converts_f16_to_f32_by_default(tmp_path: Path) -> None:
    """F16 tensors become F32 (exactly), an I64 buffer stays I64 (not a
    weight); a model already F32 is copied byte for byte; --keep-dtype keeps
    F16 with a warning in the card."""
    f16 = RNG.standard_normal((4, 8)).astype(np.float16)
    ids = np.arange(8, dtype=np.int64)
    src = model_dir(tmp_path, "src", {"w": f16, "position_ids": ids,
                                      "b": np.ones(8, np.float32)}, {"format": "pt"})
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    reg = Registry(url, db=db)
    reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5))
    path = open_store(url).local_path("models/m/1/model.safetensors")
    out = safetensors.numpy.load_file(str(path))
    assert {k: v.dtype for k, v in out.items()} == {"w": np.float32, "position_ids": np.int64,
                                                    "b": np.float32}
    np.testing.assert_array_equal(out["w"], f16.astype(np.float32))
    np.testing.assert_array_equal(out["position_ids"], ids)
    card = open_store(url).read_bytes("models/m/1/MODEL_CARD.md").decode()
    assert "Warning" not in card and "| F32 | 2 |" in card

    same = model_dir(tmp_path, "f32", {"b": np.ones(8, np.float32), "i": ids}, {"format": "pt"})
    reg.publish(same, "m", "2", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5))
    assert open_store(url).read_bytes("models/m/2/model.safetensors") == \
        (same / "model.safetensors").read_bytes()

    p = run_cli("publish", str(src), "--model-id", "m", "--version", "3", "--keep-dtype",
                *docs_args(tmp_path), "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    assert open_store(url).read_bytes("models/m/3/model.safetensors") == \
        (src / "model.safetensors").read_bytes()
    card = open_store(url).read_bytes("models/m/3/MODEL_CARD.md").decode()
    assert "**Warning:** weights stored as F16, kept as published (`--keep-dtype`)" in card


def test_publish_card_file_is_the_templates_free_text(tmp_path: Path) -> None:
    src = model_dir(tmp_path, "src", {"b": np.ones(8, np.float32)}, {"format": "pt"})
    text = tmp_path / "card.md"
    text.write_text("A tiny model for the card test.\n\nTrained on nothing much.\n")
    url, db = str(tmp_path / "store"), f"sqlite:///{tmp_path / 'i.db'}"
    p = run_cli("publish", str(src), "--model-id", "m", "--version", "1", "--card", str(text),
                *docs_args(tmp_path), "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    card = open_store(url).read_bytes("models/m/1/MODEL_CARD.md").decode()
    assert card.startswith("# m 1\n\nA tiny model for the card test.\n\nTrained on nothing much.")
    assert "## Evaluation" in card and "## Training data" in card  # the template's facts
    assert json.loads(open_store(url).read_bytes("models/m/1/ledger.json"))
    p = run_cli("publish", str(src), "--model-id", "m", "--version", "2", "--card", str(text),
                "--card-verbatim", *docs_args(tmp_path), "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    assert open_store(url).read_bytes("models/m/2/MODEL_CARD.md") == text.read_bytes()
