"""A model directory holds one set of weights (issue 47).

Another weight format beside ``model.safetensors`` is what an engine that
prefers it would serve, stale or not, whatever the safetensors and the card
say. Publish refuses it (DocumentError, exit 5, naming the file; nothing
written), as is and under ``--dtype bf16``, unless ``--include`` names it;
then the card, ``show`` (CLI and API) and the ``--json`` record list every
set. Inputs (not the ones the issue names): Meta's ``original/consolidated.00.pth``,
``onnx/model.onnx`` with its ``model.onnx_data``, a TFLite ``model.tflite``
and an ``openvino_model.xml``/``.bin`` pair; a stray ``data/a.bin`` and
``training_args.bin`` are not weights. Stores: local disk and S3 (moto).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.api import Registry
from registry.errors import DocumentError
from registry.formats.modeldir import other_weights
from tests.conftest import make_store_url, run_cli
from tests.release_util import ledger_row, summary
from tests.test_pull import _safetensors

OTHERS = {
    "pth": {"original/consolidated.00.pth": b"\x80\x04stale"},
    "onnx": {"onnx/model.onnx": b"onnx", "onnx/model.onnx_data": b"w" * 64},
    "tflite": {"model.tflite": b"TFL3"},
    "openvino": {"openvino_model.xml": b"<net/>", "openvino_model.bin": b"\0" * 32},
}


def _src(tmp_path: Path, extra: dict[str, bytes]) -> Path:
    src = tmp_path / "src"
    files = {"model.safetensors": _safetensors(), "config.json": b'{"hidden_size": 8}\n',
             "data/a.bin": b"not weights", "training_args.bin": b"\x80\x04K\x01.", **extra}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return make_store_url(request.param, request, tmp_path)


def test_other_weights_are_recognised_by_format() -> None:
    names = ["model.safetensors", "data/a.bin", "training_args.bin", "vocab.txt",
             *[n for files in OTHERS.values() for n in files],
             "pytorch_model-00001-of-00002.bin", "sub/model.safetensors", "q4.ggml"]
    found = other_weights(names)
    assert found == {"pytorch": ["original/consolidated.00.pth",
                                 "pytorch_model-00001-of-00002.bin"],
                     "onnx": ["onnx/model.onnx", "onnx/model.onnx_data"],
                     "tensorflow": ["model.tflite"],
                     "openvino": ["openvino_model.bin", "openvino_model.xml"],
                     "safetensors": ["sub/model.safetensors"], "gguf": ["q4.ggml"]}


@pytest.mark.parametrize(("kind", "dtype"), [("pth", None), ("onnx", "bf16"),
                                             ("tflite", "bf16"), ("openvino", None)])
def test_publish_refuses_another_set_unless_included(store_url: str, tmp_path: Path,
                                                     kind: str, dtype: str | None) -> None:
    src = _src(tmp_path, OTHERS[kind])
    first = sorted(OTHERS[kind])[0]
    with Registry(store_url, f"sqlite:///{tmp_path / 'i.db'}") as reg:
        with pytest.raises(DocumentError, match=f"{first}: .*beside the safetensors"):
            reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(),
                        dtype=dtype)
        assert not reg.store.exists("models/m/1/MANIFEST.json")
        assert reg.store.walk_files("models/m") == {}
        result = reg.publish(src, "m", "1", ledger=[ledger_row()], eval_summary=summary(),
                             dtype=dtype, include=list(OTHERS[kind]))
        listed = {e.path for e in result.manifest.files}
        assert set(OTHERS[kind]) <= listed
        fmt = next(iter(other_weights(OTHERS[kind])))
        assert result.to_dict()["other_weights"] == {fmt: sorted(OTHERS[kind])}
        assert reg.show("m", "1")["other_weights"] == {fmt: sorted(OTHERS[kind])}
        card = reg.store.read_bytes("models/m/1/MODEL_CARD.md").decode()
        assert "## Other weights" in card and f"`{first}`" in card


def test_cli_refuses_with_exit_5_and_lists_included_sets(store_url: str,
                                                         tmp_path: Path) -> None:
    src = _src(tmp_path, {**OTHERS["pth"], **OTHERS["tflite"]})
    ledger, evals = tmp_path / "l.json", tmp_path / "e.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    db = f"sqlite:///{tmp_path / 'i.db'}"
    base = ["publish", str(src), "--model-id", "m", "--version", "1", "--ledger", str(ledger),
            "--evals", str(evals), "--store", store_url, "--db", db]
    p = run_cli(*base)
    assert p.returncode == 5, p.stderr
    assert "src/model.tflite: tensorflow weights" in p.stderr and "--include" in p.stderr
    assert "Traceback" not in p.stderr
    p = run_cli(*base, "--include", "*.tflite")  # one set named, the other not
    assert p.returncode == 5 and "src/original/consolidated.00.pth: pytorch" in p.stderr
    p = run_cli(*base, "--include", "original/*.pth", "--include", "*.tflite", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["other_weights"] == {
        "pytorch": ["original/consolidated.00.pth"], "tensorflow": ["model.tflite"]}
    p = run_cli("show", "m@1", "--store", store_url, "--db", db)
    assert p.returncode == 0, p.stderr
    assert "other weights (pytorch" in p.stdout and "model.tflite" in p.stdout
