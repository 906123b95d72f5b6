"""Rules of a model directory (seed 000, first paragraph; DESIGN sections 1 and 4).

A model directory holds its weights (``model.safetensors``, or
``model.safetensors.index.json`` and exactly the shards it names: the rule
and its checks are :mod:`registry.formats.weights`), ``config.json``, and
``tokenizer.json`` when config.json says ``"tl_tokenizer": "file"``, and no
other set of weights (``pytorch_model.bin``, ``tf_model.h5``, ``*.gguf``...:
:data:`OTHER_WEIGHTS`) unless the publisher names it (issue 47).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
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
    :func:`registry.formats.weights.load_weights`."""
    present = set(names)
    for_release = f" (releasing {release})" if release else ""
    if "config.json" not in present:
        raise DocumentError(f"{where}/config.json",
                            f"missing: a model directory needs it{for_release}")
    if config.get("tl_tokenizer") == "file" and "tokenizer.json" not in present:
        raise DocumentError(f"{where}/tokenizer.json",
                            f"missing: config.json says \"tl_tokenizer\": \"file\"{for_release}")


#: Weight formats other than safetensors that an engine may load instead of
#: the safetensors weights (transformers, vLLM and llama.cpp each prefer some
#: over others): ``(format, pattern)`` matched against each relative path
#: (lower-cased). ``*.bin`` counts only under transformers' weight names: a
#: model directory ships other binary data.
OTHER_WEIGHTS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (fmt, re.compile(pattern)) for fmt, pattern in (
        ("pytorch", r"(^|/)(pytorch_model|adapter_model|model|consolidated)"
                    r"([-.][^/]*)?\.bin(\.index\.json)?$"),
        ("pytorch", r"\.(pt|pth|ckpt|pkl|pickle|joblib|nemo)$"),
        ("pytorch", r"\.distcp$"),
        ("tensorflow", r"\.(h5|keras|tflite)(\.index\.json)?$"),
        ("tensorflow", r"(^|/)saved_model\.pb(txt)?$"),
        ("flax", r"\.msgpack(\.index\.json)?$"),
        ("gguf", r"\.(gguf|ggml|ggjt|llamafile)$"),
        ("onnx", r"\.(onnx|onnx_data|onnx\.data|ort)$"),
        ("coreml", r"\.(mlmodel|mlpackage/.*)$"),
        ("openvino", r"(^|/)openvino_model\.(xml|bin)$"),
        ("tensorrt", r"\.(engine|plan)$"),
        ("safetensors", r"/[^/]*\.safetensors(\.index\.json)?$"),
    ))


def other_weights(names: Iterable[str]) -> dict[str, list[str]]:
    """The files among ``names`` (relative POSIX paths) that hold weights in a
    format other than the directory's safetensors (:data:`OTHER_WEIGHTS`; a
    ``*.safetensors`` inside a sub-folder counts too), grouped by format:
    ``{"pytorch": ["pytorch_model.bin"], ...}``, each list sorted."""
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        low = name.lower()
        for fmt, pattern in OTHER_WEIGHTS:
            if pattern.search(low):
                found.setdefault(fmt, []).append(name)
                break
    return found


def check_other_weights(names: Iterable[str], include: Iterable[str], *, where: str) -> \
        dict[str, list[str]]:
    """Refuse a second set of weights beside the safetensors (issue 47).

    An engine that prefers another format (transformers loads
    ``pytorch_model.bin`` when asked for it, llama.cpp a ``*.gguf``, TF and Flax
    their own files) would serve those weights, stale or not, whatever the
    safetensors and the card say. Each such file must be named by ``include``
    (a path or an ``fnmatch`` pattern, e.g. ``pytorch_model*.bin``).

    Returns:
        The other weights kept, ``{format: [paths]}`` (for the card and ``show``).

    Raises:
        DocumentError: naming the first file no ``include`` names, its format
            and the rule.
    """
    patterns = list(include)
    found = other_weights(names)
    for fmt, paths in found.items():
        for path in paths:
            if not any(path == p or fnmatch.fnmatchcase(path, p) for p in patterns):
                raise DocumentError(
                    f"{where}/{path}",
                    f"{fmt} weights beside the safetensors: a model directory holds one set "
                    "of weights, and an engine that prefers this format would serve it "
                    "instead; remove it, or name it with --include to release both sets")
    return found


def stored_config(store: Any, prefix: str, files: Mapping[str, int], *,
                  at_most: int) -> dict[str, Any] | None:
    """The ``config.json`` of the directory at ``prefix`` in ``store`` (``files``:
    its sizes by path) for a hint that may be missing (an architecture, a
    dtype); None when there is none, it is over ``at_most`` bytes, or it is not
    a readable JSON object."""
    from registry.rules import limits, schemas
    from registry.errors import RegistryError
    from registry.store import join

    if files.get("config.json", 1 << 30) > at_most:
        return None
    try:
        doc = schemas.load_json(store.read_bytes(join(prefix, "config.json"),
                                                 limit=limits.MAX_JSON_BYTES),
                                path="config.json")
    except RegistryError:
        return None
    return doc if isinstance(doc, dict) else None
