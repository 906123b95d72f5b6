"""What a converted release's ``config.json`` says about its weights (issue 26, items 3-4).

Engines size their tensors from ``config.json``, not from the files: transformers
(``torch_dtype="auto"``, 4.57 reads ``dtype`` and the older ``torch_dtype``) and
vLLM load a bf16 release as float32 when the config still says float32. So a
converted release of a Hugging Face config (one with ``model_type``,
``architectures``, ``torch_dtype`` or ``dtype``) gets both keys set to the
released dtype; every other key, and its order, is kept. A tinyllm config (the
train spec, seed 000, none of those keys) is carried verbatim.

int4 (seed 000: ``<name>.qweight`` + ``<name>.scales``) is a format no
transformers quantizer reads: loaded as is, the quantized layers would be
re-initialized at random with exit 0. The release's config therefore carries a
``quantization_config`` that names the scheme and has no ``quant_method``:
transformers (``AutoHfQuantizer.supports_quant_method``) and with it
sentence-transformers then refuse to load the model with a ValueError (an
*unknown* ``quant_method`` would only warn and load garbage). tinyllm's loader
reads the tensors as the seed says and ignores the key. docs/sharded-weights.md
states this for users.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from registry.rules import numbers

__all__ = ["INT4_SCHEME", "TORCH_DTYPES", "is_hf_config", "released_config"]

#: safetensors dtype -> the torch dtype name transformers writes in config.json
TORCH_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
#: the ``quantization_config.format`` of an int4 release
INT4_SCHEME = "tinyllm-int4"
_HF_KEYS = ("model_type", "architectures", "torch_dtype", "dtype")


def is_hf_config(config: Mapping[str, Any]) -> bool:
    """Whether engines read this config (it names a model type, architectures or a dtype)."""
    return any(key in config for key in _HF_KEYS)


def base_dtype(groups: Sequence[Mapping[str, Any]]) -> str | None:
    """The torch dtype of the stored float tensors that are not int4 (the one
    holding the most parameters), e.g. ``"bfloat16"``; None when there is none."""
    floats = [g for g in groups if g["stored"] in TORCH_DTYPES]
    if not floats:
        return None
    return TORCH_DTYPES[max(floats, key=lambda g: g["parameters"])["stored"]]


def released_config(config: Mapping[str, Any], *, dtype: str | None,
                    groups: Sequence[Mapping[str, Any]], group_size: int) -> bytes | None:
    """The bytes of the released ``config.json``, or None to carry the source's.

    Args:
        config: the source config.json (a JSON object).
        dtype: the conversion (``f32``, ``bf16``, ``int4``), None for none.
        groups: the stored weights' groups (:func:`weights_groups`).
        group_size: int4 columns per scale.

    Returns:
        None when nothing changes (no conversion, or a config no engine reads);
        else the config with ``torch_dtype`` and ``dtype`` set to the stored
        base dtype and, for int4, ``quantization_config`` (the scheme, its
        group size and packing, the quantized tensor count; no ``quant_method``).
    """
    if dtype is None or not is_hf_config(config):
        return None
    doc = dict(config)
    torch_dtype = base_dtype(groups)
    if torch_dtype is not None:
        doc["torch_dtype"] = torch_dtype
        doc["dtype"] = torch_dtype
    if dtype == "int4":
        quantized = next((g for g in groups if g["stored"] == "int4"), None)
        doc["quantization_config"] = {
            "format": INT4_SCHEME,
            "bits": 4,
            "group_size": group_size,
            "symmetric": True,
            "packing": ("<name>.qweight U8 [rows, cols/2], two signed 4-bit values per byte, "
                        "low nibble = even column; <name>.scales F32 [rows, cols/group_size]; "
                        "w = q * scale per group"),
            "quantized_tensors": len(quantized["tensors"]) if quantized else 0,
            "note": ("no transformers, sentence-transformers or vLLM quantizer reads this "
                     "format, so this config names no quant_method and they refuse to "
                     "load it; the registry's tinyllm loader reads it (seed 000), and a "
                     "--dtype bf16 release serves in every engine"),
        }
    else:
        doc.pop("quantization_config", None)
    return (numbers.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()
