"""safetensors dtype names -> torch dtypes (imported only where torch is wanted)."""

from __future__ import annotations

import torch

#: every dtype of registry.formats.safetensors_format.DTYPES that torch has.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
    "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
    "U8": torch.uint8, "BOOL": torch.bool,
}

__all__ = ["TORCH_DTYPES"]
