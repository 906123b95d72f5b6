"""What a release's weights are, read from their headers alone (no tensor
data, no numpy): the groups of stored tensors (:func:`weights_groups`), their
short label (:func:`dtype_label`) and ``registry show``'s summary of a
committed release (:func:`stored_summary`). Split from
:mod:`registry.release.convert`, which re-exports them, so that ``registry
show`` starts without numpy (issue 44 item 6).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from registry.rules.words import count

_FLOAT = {"F64", "F32", "F16", "BF16"}


def weights_groups(tensors: Mapping[str, tuple[str, tuple[int, ...]]],
                   metadata: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The stored weights by group, for the card, ``registry show`` and the index.

    Args:
        tensors: stored name -> (safetensors dtype, shape), e.g. a header's
            tensors or a conversion plan's.
        metadata: the file's ``__metadata__`` (int4: ``group_size``).

    Returns:
        One group per stored form, int4 first, then dtypes by name:
        ``{"stored": "int4" | "F32" | "BF16" | "F16" | "I64" ..., "tensors":
        [names, sorted], "parameters": scalar count}``; an int4 group lists
        the quantized tensors by their base name and adds ``group_size``.
    """
    q = sorted(n[:-len(".qweight")] for n in tensors if n.endswith(".qweight")
               and f"{n[:-len('.qweight')]}.scales" in tensors)
    groups: list[dict[str, Any]] = []
    if q:
        params = sum(tensors[f"{b}.qweight"][1][0] * tensors[f"{b}.qweight"][1][1] * 2
                     for b in q)
        groups.append({"stored": "int4", "tensors": q, "parameters": int(params),
                       "group_size": (metadata or {}).get("group_size")})
    packed = {f"{b}.qweight" for b in q} | {f"{b}.scales" for b in q}
    by_dtype: dict[str, list[str]] = {}
    for name, (dtype, _shape) in tensors.items():
        if name not in packed:
            by_dtype.setdefault(dtype, []).append(name)
    for dtype in sorted(by_dtype):
        names = sorted(by_dtype[dtype])
        groups.append({"stored": dtype, "tensors": names, "parameters": int(sum(
            math.prod(tensors[n][1]) for n in names))})
    return groups


def dtype_label(groups: list[dict[str, Any]]) -> str:
    """A short honest label: ``int4 (40 of 104 tensors)``, ``bf16+i64``, ``f16``..."""
    total = sum(len(g["tensors"]) for g in groups)
    q = next((g for g in groups if g["stored"] == "int4"), None)
    if q is not None:
        return f"int4 ({len(q['tensors'])} of {count(total, 'tensor')})"
    floats = [g["stored"].lower() for g in groups if g["stored"] in _FLOAT]
    return "+".join(floats) or "+".join(g["stored"].lower() for g in groups) or "none"


def stored_summary(store: Any, model_id: str, version: str,
                   files: Mapping[str, int] | None = None) -> dict[str, Any]:
    """What ``registry show`` and the web page say of a release's weights.

    Args:
        files: the release's files, name -> size in bytes (its manifest's);
            None lists them from the store.

    Returns:
        ``{"groups": weights_groups(...), "files": [{"path", "bytes" (file
        size), "tensors", "parameters"}] (the index first, then each shard),
        "parameters": scalars stored in all shards, "config_dtype": what
        config.json says engines load it as (``"bfloat16"``) or None}``;
        empty groups and files when the release has no weights.

    Raises:
        DocumentError: the stored weights break a rule of :mod:`registry.formats.weights`.
    """
    from registry.protocol.layout import release_prefix
    from registry.formats.weights import INDEX, SINGLE, load_weights

    prefix = release_prefix(model_id, version)
    if files is None:
        files = store.walk_files(prefix)
    if SINGLE not in files and INDEX not in files:
        return {"groups": [], "files": [], "parameters": 0, "config_dtype": None}
    weights = load_weights(store, prefix, files=files)
    listing = [{"path": INDEX, "bytes": weights.index_size, "tensors": len(weights.tensors),
                "parameters": weights.parameter_count}] if weights.sharded else []
    listing += [{"path": s.path, "bytes": s.size, "tensors": len(s.header.tensors),
                 "parameters": sum(math.prod(i.shape)
                                   for i in s.header.tensors.values())}
                for s in weights.shards]
    return {"groups": weights_groups(weights.described, weights.metadata), "files": listing,
            "parameters": weights.parameter_count,
            "config_dtype": _config_dtype(store, prefix, files)}


def _config_dtype(store: Any, prefix: str, files: Mapping[str, int]) -> str | None:
    """What the release's config.json tells engines to load it as (``dtype``,
    else ``torch_dtype``); None when it says nothing or cannot be read."""
    from registry.formats.modeldir import stored_config

    doc = stored_config(store, prefix, files, at_most=1 << 20)
    value = doc.get("dtype", doc.get("torch_dtype")) if doc is not None else None
    return value if isinstance(value, str) else None


__all__ = ["dtype_label", "stored_summary", "weights_groups"]
