"""Streaming dtype conversion of safetensors weights for releases (DESIGN section 4).

Conversion goes tensor by tensor: each output tensor is declared (dtype, shape)
up front and computed only when the writer reaches it, so peak memory is about
one source tensor plus its converted form, whatever the model size.

int4 (per DESIGN): a 2-D float tensor ``<name>`` of shape ``[rows, cols]`` with
``cols % group_size == 0`` becomes ``<name>.qweight`` (U8 ``[rows, cols/2]``, two
signed 4-bit values per byte, low nibble = even column) and ``<name>.scales``
(F32 ``[rows, cols/group_size]``); ``w = q * scale`` per group. Symmetric
round-to-nearest with ``scale = max|w| / 7`` never clips, so every dequantized
value is within half a quantization step (``scale / 2``) of the original.
Other tensors stay in their source dtype.

Metadata (DESIGN section 4): a weights file keeps a ``format`` value the
engines accept (``ENGINE_FORMATS``: transformers refuses anything else, e.g.
``"tinyllm"``), ``"pt"`` when the source had another or none, and every
other key of the source's metadata; the registry's own facts go under
``tinyllm.*`` keys (``tinyllm.dtype``, ``tinyllm.source_format``,
``tinyllm.quantized``) and the seed's ``quant`` / ``group_size``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

import ml_dtypes
import numpy as np

from registry.errors import UsageError
from registry.formats.safetensors_io import LazyTensor, SafetensorsHeader, TensorInfo, read_tensor
from registry.release.weights_summary import _FLOAT, dtype_label, stored_summary, weights_groups

RELEASE_DTYPES = ("f32", "bf16", "int4")
#: ``publish``'s default conversion (seed 000's release table: "F32 or BF16, or
#: int4"): F32 and BF16 tensors as they are, other floating-point ones (F16,
#: F64, F8) to F32; integer and boolean tensors as they are (see :func:`off_seed`).
AUTO = "auto"
#: safetensors dtypes a release stores unconverted under :data:`AUTO` (int4
#: is stored as U8 ``.qweight`` beside F32 ``.scales``: only --dtype int4 makes it).
SEED_DTYPES = frozenset({"F32", "BF16"})
#: ``__metadata__["format"]`` values transformers (4.x: modeling_utils) and
#: safetensors' framework loaders accept; a weights file keeps one of them.
ENGINE_FORMATS = ("pt", "tf", "flax", "mlx")
#: rows quantized per block, so temporaries stay small for huge matrices.
_BLOCK_BYTES = 64 * 1024 * 1024


def _scales(block: np.ndarray) -> np.ndarray:
    """Per-group scales of ``block`` ``[rows, groups, group_size]``: ``max|w| / 7``,
    nudged up where float rounding (subnormals) would leave ``max|w|/s > 7.5``."""
    amax = np.abs(block).max(axis=2)
    s = amax / np.float32(7.0)
    s[s == 0] = 1.0  # an all-zero group: any scale dequantizes to exact zeros
    for _ in range(4):
        low = amax / s > 7.5
        if not low.any():
            break
        s[low] = np.nextafter(s[low], np.float32(np.inf))
    return s


def int4_scales(w: np.ndarray, group_size: int) -> np.ndarray:
    """Only the scales of :func:`quantize_int4` (F32 ``[rows, cols/group_size]``)."""
    rows, cols = w.shape
    out = np.empty((rows, cols // group_size), dtype=np.float32)
    step = max(1, _BLOCK_BYTES // max(1, cols * 4))
    for r0 in range(0, rows, step):
        block = np.asarray(w[r0:r0 + step], dtype=np.float32).reshape(-1, cols // group_size,
                                                                      group_size)
        out[r0:r0 + step] = _scales(block)
    return out


def quantize_int4(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantize ``w`` ``[rows, cols]`` to (qweight U8 ``[rows, cols/2]``, scales F32
    ``[rows, cols/group_size]``). Requires ``cols % group_size == 0``, even group."""
    rows, cols = w.shape
    groups = cols // group_size
    qweight = np.empty((rows, cols // 2), dtype=np.uint8)
    scales = np.empty((rows, groups), dtype=np.float32)
    step = max(1, _BLOCK_BYTES // max(1, cols * 4))
    for r0 in range(0, rows, step):
        block = np.asarray(w[r0:r0 + step], dtype=np.float32).reshape(-1, groups, group_size)
        s = _scales(block)
        q = np.clip(np.rint(block / s[:, :, None]), -7, 7).astype(np.int8)
        q = q.reshape(block.shape[0], cols)
        u = q.view(np.uint8) & 0x0F
        qweight[r0:r0 + step] = u[:, 0::2] | (u[:, 1::2] << 4)
        scales[r0:r0 + step] = s
    return qweight, scales


def dequantize_int4(qweight: np.ndarray, scales: np.ndarray, group_size: int) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: F32 ``[rows, cols]``."""
    rows = qweight.shape[0]
    q = np.empty((rows, qweight.shape[1] * 2), dtype=np.int8)
    low = (qweight & 0x0F).astype(np.int8)
    high = (qweight >> 4).astype(np.int8)
    q[:, 0::2] = np.where(low > 7, low - 16, low)
    q[:, 1::2] = np.where(high > 7, high - 16, high)
    groups = scales.shape[1]
    return (q.reshape(rows, groups, group_size).astype(np.float32)
            * scales.astype(np.float32)[:, :, None]).reshape(rows, -1)


def _qualifies(info: TensorInfo, group_size: int) -> bool:
    return (info.dtype in _FLOAT and len(info.shape) == 2 and info.shape[1] > 0
            and info.shape[1] % group_size == 0)


def plan(header: SafetensorsHeader, f: IO[bytes], *, dtype: str | None, group_size: int,
         path: str, require_quantized: bool = True,
         reader: Callable[[str], np.ndarray] | None = None
         ) -> tuple[list[tuple[str, LazyTensor]], dict[str, str]]:
    """Declare the converted tensors of a source file, computed lazily from ``f``.

    Args:
        header: the validated source header.
        f: the open source file (read as the writer asks for each tensor).
        dtype: ``"f32"``, ``"bf16"``, ``"int4"``, ``"auto"`` (F32 and BF16
            as they are, other floats to F32: seed 000's release dtypes),
            or None: every tensor as is (only the metadata is rewritten, see
            :func:`weights_metadata`).
        group_size: int4 group length along columns (even, >= 2).
        require_quantized: int4 with no qualifying tensor is refused; False for
            one shard of several (the caller checks the whole model).
        reader: tensor name -> its data, in place of reading ``f`` at the
            header's offsets (a source that is not a safetensors file, such as
            a DCP checkpoint: ``header`` then only declares dtypes and shapes).

    Returns:
        ``(tensors, metadata)`` for :func:`registry.formats.safetensors_io.write_safetensors`.

    Raises:
        UsageError: unknown dtype or bad group size; int4 when no tensor
            qualifies (the release would be labelled int4 with none).
    """
    if dtype is not None and dtype not in (*RELEASE_DTYPES, AUTO):
        raise UsageError(f"dtype {dtype!r}: expected one of {', '.join(RELEASE_DTYPES)}")
    if dtype == "int4" and (group_size < 2 or group_size % 2):
        raise UsageError(f"group_size {group_size}: must be an even number >= 2")

    def load(name: str) -> Callable[[], np.ndarray]:
        if reader is not None:
            return lambda: reader(name)
        return lambda: read_tensor(f, header, name, path=path)

    out: list[tuple[str, LazyTensor]] = []
    for name, info in header.tensors.items():
        src = load(name)
        if dtype == AUTO:
            out.append((name, LazyTensor("F32", info.shape, _cast(src, np.float32))
                        if off_seed(info.dtype) else LazyTensor(info.dtype, info.shape, src)))
        elif info.dtype not in _FLOAT or dtype is None:
            out.append((name, LazyTensor(info.dtype, info.shape, src)))
        elif dtype == "f32":
            out.append((name, LazyTensor("F32", info.shape, _cast(src, np.float32))))
        elif dtype == "bf16":
            out.append((name, LazyTensor("BF16", info.shape, _cast(src, ml_dtypes.bfloat16))))
        elif _qualifies(info, group_size):
            rows, cols = info.shape
            out.append((f"{name}.qweight", LazyTensor(
                "U8", (rows, cols // 2), lambda s=src: quantize_int4(s(), group_size)[0])))
            out.append((f"{name}.scales", LazyTensor(
                "F32", (rows, cols // group_size), lambda s=src: int4_scales(s(), group_size))))
        else:
            out.append((name, LazyTensor(info.dtype, info.shape, src)))
    quantized = [n[:-len(".qweight")] for n, _ in out if n.endswith(".qweight")]
    if dtype == "int4" and not quantized and require_quantized:
        raise UsageError(
            f"{path}: --dtype int4 would quantize no tensor: none is a 2-D float matrix "
            f"whose columns divide by group size {group_size} (columns: "
            f"{_column_counts(header)}); pick a group size that divides them, or another "
            "--dtype")
    meta = weights_metadata(header.metadata, dtype=dtype)
    if dtype == "int4":
        meta.update({"quant": "int4", "group_size": str(group_size),
                     "tinyllm.quantized": ",".join(quantized)})
    return out, meta


def weights_metadata(source: Mapping[str, str] | None, *, dtype: str | None) -> dict[str, str]:
    """The ``__metadata__`` of a released weights file made from ``source``'s.

    Every key of the source is kept; ``format`` becomes ``"pt"`` unless it is
    one of ``ENGINE_FORMATS`` (the source's value then goes to
    ``tinyllm.source_format``); ``tinyllm.dtype`` records the conversion
    (``dtype``), when there was one. Stale registry facts of the source
    (``quant``, ``group_size``, ``tinyllm.*``) are dropped: the caller states
    the new ones.
    """
    meta = {k: v for k, v in (source or {}).items()
            if k not in ("quant", "group_size") and not k.startswith("tinyllm.")}
    fmt = meta.get("format")
    if fmt not in ENGINE_FORMATS:
        meta["format"] = "pt"
        if fmt is not None:
            meta["tinyllm.source_format"] = fmt
    if dtype is not None:
        meta["tinyllm.dtype"] = dtype
    return meta


def engines_accept(metadata: Mapping[str, str] | None) -> bool:
    """Whether engines load a weights file with this ``__metadata__`` (none at
    all, or a ``format`` in ENGINE_FORMATS)."""
    return not metadata or metadata.get("format") in ENGINE_FORMATS


def _column_counts(header: SafetensorsHeader) -> str:
    cols = sorted({i.shape[1] for i in header.tensors.values()
                   if i.dtype in _FLOAT and len(i.shape) == 2})
    return ", ".join(map(str, cols)) or "no 2-D float tensor"


def off_seed(dtype: str) -> bool:
    """Whether a floating-point safetensors dtype is not a seed release dtype
    (F16, F64, F8_*): :data:`AUTO` converts such tensors to F32. Integer and
    boolean tensors (position ids, masks: indices and buffers, not weights)
    are never converted."""
    return dtype.startswith("F") and dtype not in SEED_DTYPES


def needs_auto(dtypes: Iterable[str]) -> bool:
    """Whether a publish converts (``dtype`` :data:`AUTO`): some tensor is in
    a floating-point dtype that is not one of the seed's (:func:`off_seed`)."""
    return any(off_seed(d) for d in dtypes)


def _cast(src: Callable[[], np.ndarray], to: Any) -> Callable[[], np.ndarray]:
    # astype to ml_dtypes.bfloat16 rounds to nearest even.
    return lambda: src().astype(to, copy=False)


def planned_groups(header: SafetensorsHeader, *, dtype: str | None, group_size: int,
                   path: str = "model.safetensors") -> list[dict[str, Any]]:
    """:func:`weights_groups` of the file a conversion of ``header`` writes
    (computed from the plan, without reading a tensor)."""
    tensors, meta = plan(header, None, dtype=dtype, group_size=group_size,  # type: ignore[arg-type]
                         path=path)
    return weights_groups({n: (t.dtype, tuple(t.shape)) for n, t in tensors}, meta)


def parameter_count(header: SafetensorsHeader) -> int:
    """Number of scalar parameters in a (source) header."""
    return sum(int(np.prod(i.shape, dtype=np.int64)) for i in header.tensors.values())
