"""Rules of a model directory (seed 000, first paragraph; DESIGN sections 1 and 4).

A model directory holds its weights (``model.safetensors``, or
``model.safetensors.index.json`` and exactly the shards it names: the rule
and its checks are :mod:`registry.weights`), ``config.json``, and
``tokenizer.json`` when config.json says ``"tl_tokenizer": "file"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from registry.errors import DocumentError

#: config keys that hold the width of a model's embeddings, most specific first:
#: Hugging Face (BERT/Llama ``hidden_size``, T5/BART/MPT ``d_model``, GPT-2/GPT-J
#: ``n_embd``, Bloom ``n_embed``, DistilBERT ``dim``, CLIP ``embed_dim``), the
#: example trainer this registry ships (``d_embed``; its ``d_hidden`` is the
#: MLP width, not the embeddings'), and ``hidden_dim`` last (DistilBERT's
#: ``hidden_dim`` is its FFN width, so ``dim`` must win there).
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "n_embed", "dim", "embed_dim", "d_embed",
               "hidden_dim")
#: sub-configs of composite models whose text tower carries the size (LLaVA, Gemma 3...).
_NESTED = ("text_config",)


def hidden_size(config: dict[str, Any]) -> int | None:
    """The model's hidden size (the width of its embeddings) from its config:
    the first of HIDDEN_KEYS holding a positive integer, at the top level or in
    ``text_config``; None when there is none."""
    for key in HIDDEN_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for sub in _NESTED:
        if isinstance(config.get(sub), dict):
            found = hidden_size(config[sub])
            if found is not None:
                return found
    return None


def check_files(names: Iterable[str], config: dict[str, Any], *, where: str,
                release: str | None = None) -> None:
    """Raise DocumentError, naming the file (and the ``release`` being made,
    ``MODEL_ID@VERSION``), when config.json, or tokenizer.json that config.json
    asks for, is missing. The weights have their own rule and checks:
    :func:`registry.weights.load_weights`."""
    present = set(names)
    for_release = f" (releasing {release})" if release else ""
    if "config.json" not in present:
        raise DocumentError(f"{where}/config.json",
                            f"missing: a model directory needs it{for_release}")
    if config.get("tl_tokenizer") == "file" and "tokenizer.json" not in present:
        raise DocumentError(f"{where}/tokenizer.json",
                            f"missing: config.json says \"tl_tokenizer\": \"file\"{for_release}")
