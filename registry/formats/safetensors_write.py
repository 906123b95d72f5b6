"""Streaming safetensors writer (the format: :mod:`registry.formats.safetensors_format`).

Why not the reference library: its writer needs every tensor in memory and a
file name or a ``bytes`` result, while checkpoints and releases are streamed to
S3 uploads and hashing wrappers one tensor at a time. :func:`write_safetensors`
is also importable from :mod:`registry.formats.safetensors_io`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from registry.errors import SafetensorsError
from registry.formats.safetensors_format import (
    _TORCH_DTYPES,
    _WRITE_RANK,
    ITEMSIZES,
    MAX_HEADER_BYTES,
    LazyTensor,
    Writer,
    _describe,
    _numpy_tables,
)

if TYPE_CHECKING:  # numpy loads where a tensor is written, not with this module
    import numpy as np


def write_safetensors(fileobj: Writer,
                      tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                      metadata: Mapping[str, str] | None = None,
                      path: str = "<memory>") -> int:
    """Write a standard safetensors file to ``fileobj``, streaming one tensor at a time.

    Only ``fileobj.write`` is used (no seek or tell). The header is computed from
    dtypes and shapes first, then written with its 8-byte length, then each
    tensor's bytes in header order; tensors are never concatenated. The output
    is byte-identical to ``safetensors.serialize`` for the same input, except
    that ``__metadata__`` keys are sorted (the reference emits them in hash
    order) and that input the reference turns into a corrupt file is refused.

    Args:
        fileobj: binary sink; partial writes (a returned count below the size)
            are continued.
        tensors: name -> tensor, or an iterable of ``(name, tensor)`` pairs. A
            tensor is a numpy array, anything with ``__array__``, a torch tensor
            (moved to CPU; torch is never imported by this module otherwise), or
            a :class:`LazyTensor`. Non-contiguous and big-endian arrays are
            copied to contiguous little-endian ones, one tensor at a time.
        metadata: written as ``__metadata__`` (string to string) when not None.
        path: names the destination in error messages.

    Returns:
        The number of bytes written (8 + header length + data length).

    Raises:
        SafetensorsError: before anything is written, when a name is not a
            non-empty string, is ``__metadata__`` or repeats; a metadata key or
            value is not a string; a dtype has no safetensors name; a string
            is not encodable as UTF-8; or the header exceeds
            :data:`MAX_HEADER_BYTES`. After the header is written, when a
            :class:`LazyTensor` loads data of another dtype or shape than it
            declared: the output is then incomplete and must be discarded.

    Notes:
        The caller owns atomicity: on any exception the sink holds a partial
        file, so an upload must be aborted rather than completed.
    """
    pairs = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    plan: list[tuple[str, str, tuple[int, ...], Any]] = []
    seen: set[str] = set()
    for name, tensor in pairs:
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise SafetensorsError(path, f"tensor name {name!r} must be a non-empty "
                                         "string other than '__metadata__'")
        if name in seen:
            raise SafetensorsError(path, f"tensor name {name!r} occurs twice")
        seen.add(name)
        dtype, shape = _describe(tensor, name, path)
        plan.append((name, dtype, shape, tensor))
    plan.sort(key=lambda item: (_WRITE_RANK[item[1]], item[0]))

    header: dict[str, Any] = {}
    if metadata is not None:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SafetensorsError(path, f"metadata {key!r}: {value!r}: keys and "
                                             "values must be strings")
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, dtype, shape, _ in plan:
        size = math.prod(shape) * ITEMSIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    try:
        encoded = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError as exc:
        raise SafetensorsError(path, f"header is not encodable as UTF-8: {exc.reason}") from None
    encoded += b" " * (-len(encoded) % 8)
    if len(encoded) > MAX_HEADER_BYTES:
        raise SafetensorsError(path, f"header length {len(encoded)} bytes exceeds the "
                                     f"{MAX_HEADER_BYTES}-byte limit")

    _write_all(fileobj, len(encoded).to_bytes(8, "little") + encoded)
    for name, dtype, shape, tensor in plan:
        array = _to_numpy(tensor.load() if isinstance(tensor, LazyTensor) else tensor)
        got = (_numpy_tables()["_BY_NUMPY_NAME"].get(array.dtype.name), array.shape)
        if got != (dtype, shape):
            raise SafetensorsError(path, f"tensor {name!r}: data is {got[0]} {list(got[1])}, "
                                         f"declared {dtype} {list(shape)}")
        _write_all(fileobj, memoryview(_little_endian_bytes(array)))
        del array  # keep at most one tensor alive across iterations
    return 8 + len(encoded) + offset


def _to_numpy(tensor: Any) -> np.ndarray:
    import ml_dtypes
    import numpy as np

    if not type(tensor).__module__.startswith("torch"):
        return np.asarray(tensor)
    import torch  # only reached when the caller already uses torch

    tensor = tensor.detach().cpu()
    # torch cannot export dtypes numpy lacks: export the bits and relabel them.
    if str(tensor.dtype) == "torch.bfloat16":
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if str(tensor.dtype) in ("torch.float8_e4m3fn", "torch.float8_e5m2"):
        ml_dtype = _numpy_tables()["DTYPES"][_TORCH_DTYPES[str(tensor.dtype)]]
        return tensor.view(torch.uint8).numpy().view(ml_dtype)
    return tensor.numpy()


def _little_endian_bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a 1-D uint8 array, C order, little-endian.

    A uint8 view rather than ``memoryview(array).cast("B")``: the buffer
    protocol refuses ml_dtypes types such as bfloat16.
    """
    import numpy as np

    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _write_all(fileobj: Writer, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        written = fileobj.write(view)
        if written is None or written >= len(view):
            return
        view = view[written:]
