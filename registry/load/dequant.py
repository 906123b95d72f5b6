"""An int4 release's ``.qweight`` / ``.scales`` pairs as dense F32 tensors
(``WeightsReader.state_dict(dequantize=True)``), for engines that load dense
weights."""

from __future__ import annotations

from typing import Any

import numpy as np


def dequantized(tensors: dict[str, Any], metadata: dict[str, str], framework: str) -> dict[str, Any]:
    """``<name>.qweight`` + ``<name>.scales`` -> F32 ``<name>`` where the
    metadata says ``quant: int4``; other tensors as they are."""
    if metadata.get("quant") != "int4":
        return tensors
    from registry.release.convert import dequantize_int4

    group = int(metadata.get("group_size", "0") or 0)
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if name.endswith(".scales") and name[:-7] + ".qweight" in tensors:
            continue
        if name.endswith(".qweight") and name[:-8] + ".scales" in tensors:
            base = name[:-8]
            q, s = t, tensors[base + ".scales"]
            if framework == "pt":
                import torch

                q = q.numpy()
                s = s.float().numpy()
                out[base] = torch.from_numpy(dequantize_int4(q, s, group))
            else:
                out[base] = dequantize_int4(q, s.astype(np.float32), group)
            continue
        out[name] = t
    return out


__all__ = ["dequantized"]
