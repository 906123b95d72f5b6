"""Streaming safetensors reader and writer with a strict header check.

The format (DESIGN section 4, "Safetensors conventions"; the reference is
huggingface/safetensors)::

    [8 bytes]  N, the header length in bytes, unsigned little-endian
    [N bytes]  UTF-8 JSON object, padded with spaces to a multiple of 8 bytes:
               {"__metadata__": {str: str}?,
                "<name>": {"dtype": "F32", "shape": [rows, cols],
                           "data_offsets": [begin, end]}, ...}
    [rest]     tensor bytes, little-endian, C order; offsets are relative to
               the end of the header and tile the rest of the file exactly

Why not the reference library: its writer needs every tensor in memory and a
file name or a ``bytes`` result, while checkpoints and releases are streamed to
S3 uploads and hashing wrappers one tensor at a time; and a reader here must
reject a hostile header before allocating anything it announces.

numpy has no bfloat16 or float8: those come from ``ml_dtypes``. Hosts are
assumed little-endian (as numpy's in-memory dtypes here are native).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from registry.errors import SafetensorsError

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "MAX_HEADER_BYTES",
    "LazyTensor",
    "SafetensorsHeader",
    "SeekableReader",
    "TensorInfo",
    "Writer",
    "check_optimizer_state",
    "iter_tensors",
    "read_header",
    "read_safetensors",
    "read_tensor",
    "write_safetensors",
]

#: The reference parser's limit on the header length N, in bytes.
MAX_HEADER_BYTES = 100_000_000

#: safetensors dtype name -> numpy dtype (sub-byte F4/F6 types are not supported).
DTYPES: Mapping[str, np.dtype[Any]] = MappingProxyType({
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "C64": np.dtype(np.complex64),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
})

#: numpy dtype (native byte order) -> safetensors dtype name.
DTYPE_NAMES: Mapping[np.dtype[Any], str] = MappingProxyType(
    {dtype: name for name, dtype in DTYPES.items()})

# Looked up by numpy's dtype *name* so that big-endian arrays ('>f4' is still
# "float32") find their safetensors name too.
_BY_NUMPY_NAME = {dtype.name: name for name, dtype in DTYPES.items()}

_TORCH_DTYPES = {
    "torch.float64": "F64", "torch.float32": "F32", "torch.float16": "F16",
    "torch.bfloat16": "BF16", "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2", "torch.complex64": "C64",
    "torch.int64": "I64", "torch.int32": "I32", "torch.int16": "I16", "torch.int8": "I8",
    "torch.uint64": "U64", "torch.uint32": "U32", "torch.uint16": "U16",
    "torch.uint8": "U8", "torch.bool": "BOOL",
}

# The reference writer orders tensors by its Dtype enum, descending, then by
# name. Largest items first keeps every tensor aligned to its item size (the
# header is padded to 8); copying the exact order makes our bytes identical.
_WRITE_RANK = {name: rank for rank, name in enumerate((
    "U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
    "F8_E4M3", "F8_E5M2", "I8", "U8", "BOOL"))}

_LFS_POINTER = b"version https://git-lfs"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


class Writer(Protocol):
    """Any binary sink with ``write``: a file, an S3 upload stream, a hashing wrapper."""

    def write(self, data: memoryview | bytes, /) -> int | None: ...


class SeekableReader(Protocol):
    """A seekable binary file object (local file, fsspec file, ``BytesIO``).

    ``readinto`` is used when present, so a tensor is read straight into its array.
    """

    def read(self, size: int = ..., /) -> bytes: ...

    def seek(self, offset: int, whence: int = ..., /) -> int: ...


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One header entry.

    Attributes:
        name: the tensor name.
        dtype: the safetensors dtype name, a key of :data:`DTYPES`.
        shape: the tensor shape, e.g. ``(rows, cols)``; ``()`` for a scalar.
        begin, end: the byte span, *relative to the start of the data section*
            (exactly the file's ``data_offsets``); absolute position in the
            file is ``header.data_start + begin``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor data in bytes."""
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    """A validated safetensors header.

    Attributes:
        tensors: name -> :class:`TensorInfo`, in file (offset) order.
        metadata: the ``__metadata__`` object; empty when the file has none.
        data_start: absolute offset in bytes of the data section (8 + N).
    """

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """name -> shape, e.g. the ``model_shapes`` of :func:`check_optimizer_state`."""
        return {name: info.shape for name, info in self.tensors.items()}


@dataclass(frozen=True, slots=True)
class LazyTensor:
    """A tensor whose dtype and shape are known up front and whose data is made on demand.

    :func:`write_safetensors` builds the header from ``dtype`` and ``shape`` and
    calls ``load()`` only when it writes this tensor, then drops the result; so
    converting a checkpoint tensor by tensor keeps about one tensor in memory::

        header = read_header(src, path=p, file_size=size)
        write_safetensors(out, {
            n: LazyTensor("BF16", i.shape,
                          lambda n=n: read_tensor(src, header, n, path=p).astype(ml_dtypes.bfloat16))
            for n, i in header.tensors.items()})

    Attributes:
        dtype: safetensors dtype name of the data ``load()`` returns.
        shape: shape of the data ``load()`` returns.
        load: returns the data (anything :func:`write_safetensors` accepts).
    """

    dtype: str
    shape: tuple[int, ...]
    load: Callable[[], Any]


# -- writing -------------------------------------------------------------------


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
        size = math.prod(shape) * DTYPES[dtype].itemsize
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
        got = (_BY_NUMPY_NAME.get(array.dtype.name), array.shape)
        if got != (dtype, shape):
            raise SafetensorsError(path, f"tensor {name!r}: data is {got[0]} {list(got[1])}, "
                                         f"declared {dtype} {list(shape)}")
        _write_all(fileobj, memoryview(_little_endian_bytes(array)))
        del array  # keep at most one tensor alive across iterations
    return 8 + len(encoded) + offset


def _describe(tensor: Any, name: str, path: str) -> tuple[str, tuple[int, ...]]:
    """Return (safetensors dtype, shape) without materializing lazy or torch data."""
    if isinstance(tensor, LazyTensor):
        dtype: str | None = tensor.dtype if tensor.dtype in DTYPES else None
        shape = tuple(tensor.shape)
        found = tensor.dtype
    elif type(tensor).__module__.startswith("torch"):
        found = str(tensor.dtype)
        dtype, shape = _TORCH_DTYPES.get(found), tuple(tensor.shape)
    else:
        array = tensor if isinstance(tensor, np.ndarray) else np.asarray(tensor)
        found = array.dtype.name
        dtype, shape = _BY_NUMPY_NAME.get(found), array.shape
    if dtype is None:
        raise SafetensorsError(path, f"tensor {name!r}: dtype {found} has no safetensors "
                                     "equivalent")
    return dtype, tuple(int(d) for d in shape)


def _to_numpy(tensor: Any) -> np.ndarray:
    if not type(tensor).__module__.startswith("torch"):
        return np.asarray(tensor)
    import torch  # only reached when the caller already uses torch

    tensor = tensor.detach().cpu()
    # torch cannot export dtypes numpy lacks: export the bits and relabel them.
    if str(tensor.dtype) == "torch.bfloat16":
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if str(tensor.dtype) in ("torch.float8_e4m3fn", "torch.float8_e5m2"):
        ml_dtype = DTYPES[_TORCH_DTYPES[str(tensor.dtype)]]
        return tensor.view(torch.uint8).numpy().view(ml_dtype)
    return tensor.numpy()


def _little_endian_bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a 1-D uint8 array, C order, little-endian.

    A uint8 view rather than ``memoryview(array).cast("B")``: the buffer
    protocol refuses ml_dtypes types such as bfloat16.
    """
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


# -- reading -------------------------------------------------------------------


def read_header(fileobj: SeekableReader, *, path: str, file_size: int) -> SafetensorsHeader:
    """Read and validate the header of a safetensors file, touching no tensor data.

    The rules are the reference parser's, checked in this order, each before
    anything it would make us allocate: the file has at least 8 bytes; the
    header length N is within the file (8 + N <= ``file_size``) and at most
    :data:`MAX_HEADER_BYTES`; the header is UTF-8, starts with ``{`` and is one
    JSON object (no duplicate keys, no NaN); every dtype is known; every shape
    is a list of non-negative integers; every ``data_offsets`` is two integers
    with begin <= end; sorted by begin, the spans tile the data from 0 with no
    gap or overlap; each span is prod(shape) x item size bytes; the last end
    is ``file_size - 8 - N``; ``__metadata__``, if present, maps strings to
    strings. Stricter than the reference: entries may not carry keys other
    than ``dtype``, ``shape``, ``data_offsets``.

    Args:
        fileobj: seekable binary file object; read from offset 0, at most
            8 + N bytes.
        path: names the file in error messages.
        file_size: size of the whole file in bytes (from a stat or the manifest).

    Returns:
        The validated :class:`SafetensorsHeader`.

    Raises:
        SafetensorsError: when any rule above is broken, when the file is a
            Git LFS pointer, or when fewer header bytes can be read than
            announced. ``rule`` is one line naming the rule and the values.
    """
    if file_size < 8:
        raise SafetensorsError(path, f"file is {file_size} bytes, shorter than the "
                                     "8-byte header length")
    fileobj.seek(0)
    prefix = _read_exact(fileobj, 8, path)
    if prefix == _LFS_POINTER[:8] and prefix + fileobj.read(len(_LFS_POINTER) - 8) == _LFS_POINTER:
        raise SafetensorsError(path, "file is a Git LFS pointer, not safetensors weights "
                                     "(fetch the object with git lfs pull)")
    length = int.from_bytes(prefix, "little")
    if 8 + length > file_size:
        raise SafetensorsError(path, f"header length {length} bytes exceeds the file "
                                     f"({file_size} bytes)")
    if length > MAX_HEADER_BYTES:
        raise SafetensorsError(path, f"header length {length} bytes exceeds the "
                                     f"{MAX_HEADER_BYTES}-byte limit")
    fileobj.seek(8)
    raw = _read_exact(fileobj, length, path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(path, f"header is not valid UTF-8 (byte {8 + exc.start})") from None
    if not text.startswith("{"):
        raise SafetensorsError(path, "header is not a JSON object (does not start with '{')")
    document = _parse_json(text, path)

    metadata = document.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise SafetensorsError(path, f"__metadata__ must be an object, got {_show(metadata)}")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise SafetensorsError(path, f"__metadata__ {_show(key)}: value {_show(value)} "
                                         "is not a string")
    infos = sorted((_tensor_info(name, entry, path) for name, entry in document.items()),
                   key=lambda info: (info.begin, info.end))

    position, previous = 0, None
    for info in infos:
        if info.begin < position:
            raise SafetensorsError(path, f"tensor {info.name!r}: data_offsets "
                                         f"[{info.begin}, {info.end}] overlap tensor "
                                         f"{previous!r} ending at {position}")
        if info.begin > position:
            where = f"tensor {previous!r} ending at {position}" if previous else "the data start"
            raise SafetensorsError(path, f"tensor {info.name!r}: data_offsets "
                                         f"[{info.begin}, {info.end}] leave a gap of "
                                         f"{info.begin - position} bytes after {where}")
        expected = _nbytes(info.shape, DTYPES[info.dtype].itemsize)
        if expected is None:
            raise SafetensorsError(path, f"tensor {info.name!r}: shape "
                                         f"{_show(list(info.shape))} overflows 64 bits")
        if info.nbytes != expected:
            raise SafetensorsError(path, f"tensor {info.name!r}: data_offsets span "
                                         f"{info.nbytes} bytes but {info.dtype} "
                                         f"{list(info.shape)} needs {expected}")
        position, previous = info.end, info.name

    available = file_size - 8 - length
    if position != available:
        problem = "is truncated" if position > available else "has trailing bytes"
        raise SafetensorsError(path, f"file {problem}: tensors need {position} bytes of "
                                     f"data, the file has {available} after the header")
    return SafetensorsHeader(tensors={info.name: info for info in infos},
                             metadata=metadata, data_start=8 + length)


def _parse_json(text: str, path: str) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json keeps the last of duplicate keys silently; two readers could
        # then disagree on which entry is the tensor.
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise SafetensorsError(path, f"header has the key {_show(key)} twice")
            result[key] = value
        return result

    def no_constant(name: str) -> None:
        raise SafetensorsError(path, f"header contains {name}, which is not JSON")

    try:
        document = json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise SafetensorsError(path, f"header is not valid JSON: {exc.msg} at character "
                                     f"{exc.pos}") from None
    except RecursionError:
        raise SafetensorsError(path, "header JSON is nested too deeply") from None
    return document  # a dict: the text starts with '{' and parsed as one value


def _tensor_info(name: str, entry: Any, path: str) -> TensorInfo:
    def fail(rule: str) -> SafetensorsError:
        return SafetensorsError(path, f"tensor {name!r}: {rule}")

    if not isinstance(entry, dict):
        raise fail("entry is not a JSON object")
    if entry.keys() != _ENTRY_KEYS:
        missing = sorted(_ENTRY_KEYS - entry.keys())
        raise fail(f"entry lacks {missing}" if missing else
                   f"entry has unknown keys {sorted(entry.keys() - _ENTRY_KEYS)}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise fail(f"unknown dtype {_show(dtype)}")
    if not _non_negative_ints(shape):
        raise fail(f"shape must be a list of non-negative integers, got {_show(shape)}")
    if not _non_negative_ints(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise fail("data_offsets must be [begin, end] with 0 <= begin <= end, got "
                   f"{_show(offsets)}")
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape),
                      begin=offsets[0], end=offsets[1])


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int | None:
    """prod(shape) x itemsize, or None past 2**64 as the reference's checked multiply.

    Stopping early also keeps a hostile shape from building huge Python ints.
    """
    total = itemsize
    for dim in shape:
        total *= dim
        if dim >= 2**64 or total >= 2**64:
            return None
    return total


def _show(value: Any) -> str:
    """JSON text of a header value, cut short: a rule is one line."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _non_negative_ints(value: Any) -> bool:
    # bool is an int subclass in Python; JSON true is not a dimension.
    return isinstance(value, list) and all(
        type(item) is int and item >= 0 for item in value)


def read_tensor(fileobj: SeekableReader, header: SafetensorsHeader, name: str, *,
                path: str) -> np.ndarray:
    """Read one tensor: seek to it and read exactly its bytes into a new array.

    Args:
        fileobj: the seekable file ``header`` was read from.
        header: from :func:`read_header`.
        name: the tensor name.
        path: names the file in error messages.

    Returns:
        A writable array of dtype ``DTYPES[info.dtype]`` and shape ``info.shape``
        (``()`` for a scalar, a zero-size array for an empty tensor).

    Raises:
        SafetensorsError: when the header has no tensor ``name``, or the file
            ends before the tensor does (it shrank, or ``file_size`` was wrong).
    """
    info = header.tensors.get(name)
    if info is None:
        raise SafetensorsError(path, f"no tensor named {name!r}")
    buffer = np.empty(info.nbytes, dtype=np.uint8)
    fileobj.seek(header.data_start + info.begin)
    _readinto_exact(fileobj, memoryview(buffer), path)
    return buffer.view(DTYPES[info.dtype]).reshape(info.shape)


def iter_tensors(fileobj: SeekableReader, *, path: str, file_size: int,
                 header: SafetensorsHeader | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Validate the header now, then yield ``(name, array)`` one tensor at a time.

    Tensors come in file order, so reads are sequential. Only the tensor just
    yielded is held here: a consumer that drops each array keeps memory at
    about one tensor (plus the header).

    Args:
        fileobj: seekable binary file object.
        path: names the file in error messages.
        file_size: size of the whole file in bytes.
        header: an already validated header of this file, to skip re-reading it.

    Returns:
        An iterator of ``(name, array)`` pairs, arrays as from :func:`read_tensor`.

    Raises:
        SafetensorsError: at call time for a bad header (see :func:`read_header`);
            while iterating, when the file ends early (see :func:`read_tensor`).
    """
    if header is None:
        header = read_header(fileobj, path=path, file_size=file_size)
    return ((name, read_tensor(fileobj, header, name, path=path)) for name in header.tensors)


def read_safetensors(fileobj: SeekableReader, *, path: str,
                     file_size: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Validate the header, then read every tensor.

    Args:
        fileobj: seekable binary file object.
        path: names the file in error messages.
        file_size: size of the whole file in bytes.

    Returns:
        ``(tensors, metadata)``: name -> array in file order, and ``__metadata__``
        (empty when absent).

    Raises:
        SafetensorsError: as :func:`read_header` and :func:`read_tensor`.
    """
    header = read_header(fileobj, path=path, file_size=file_size)
    return dict(iter_tensors(fileobj, path=path, file_size=file_size, header=header)), \
        dict(header.metadata)


def _read_exact(fileobj: SeekableReader, size: int, path: str) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = fileobj.read(remaining)
        if not chunk:
            raise SafetensorsError(path, f"file is truncated: expected {size} bytes, "
                                         f"read {size - remaining}")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _readinto_exact(fileobj: SeekableReader, view: memoryview, path: str) -> None:
    readinto = getattr(fileobj, "readinto", None)
    done = 0
    while done < len(view):
        if readinto is not None:
            count = readinto(view[done:])
        else:
            chunk = fileobj.read(len(view) - done)
            count = len(chunk)
            view[done:done + count] = chunk
        if not count:
            raise SafetensorsError(path, f"file is truncated: tensor needs {len(view)} "
                                         f"bytes, read {done}")
        done += count


# -- optimizer state -----------------------------------------------------------

_OPTIMIZER_STATES = {
    "adamw": ("exp_avg", "exp_avg_sq"),
    "sgd": ("momentum_buffer",),
    "muon": ("momentum_buffer",),
}


def check_optimizer_state(optimizer_state: SafetensorsHeader | Mapping[str, Any],
                          model_shapes: Mapping[str, Sequence[int]], *,
                          optimizer: str, path: str) -> None:
    """Check ``optimizer.safetensors`` against the model (DESIGN section 4).

    Every optimizer tensor must be named ``<param>.exp_avg`` or
    ``<param>.exp_avg_sq`` (adamw) or ``<param>.momentum_buffer`` (sgd, muon),
    where ``<param>`` is a model parameter; it must have that parameter's shape
    and be F32. The state must be complete (seed 000, "per parameter
    <name>"): AdamW has both ``exp_avg`` and ``exp_avg_sq`` for every
    parameter; SGD and Muon have ``momentum_buffer`` for every parameter, or
    (momentum not used) for none. Metadata is not checked here.

    Args:
        optimizer_state: the header of ``optimizer.safetensors`` (checked without
            reading tensor data) or name -> tensor (as for :func:`write_safetensors`).
        model_shapes: parameter name -> shape, e.g. ``read_header(model).shapes``.
        optimizer: ``"adamw"``, ``"sgd"`` or ``"muon"``.
        path: names the optimizer file in error messages.

    Raises:
        SafetensorsError: for an unknown optimizer, or for the first tensor (in
            name order) that breaks a rule; the rule names the tensor.
    """
    states = _OPTIMIZER_STATES.get(optimizer)
    if states is None:
        raise SafetensorsError(path, f"unknown optimizer {optimizer!r}, expected one of "
                                     f"{sorted(_OPTIMIZER_STATES)}")
    if isinstance(optimizer_state, SafetensorsHeader):
        described = {name: (info.dtype, info.shape)
                     for name, info in optimizer_state.tensors.items()}
    else:
        described = {name: _describe(tensor, name, path)
                     for name, tensor in optimizer_state.items()}
    for name in sorted(described):
        dtype, shape = described[name]
        param, _, suffix = name.rpartition(".")
        if not param or suffix not in states:
            expected = " or ".join(f"'<param>.{state}'" for state in states)
            raise SafetensorsError(path, f"optimizer tensor {name!r}: name must be "
                                         f"{expected} for {optimizer}")
        if param not in model_shapes:
            raise SafetensorsError(path, f"optimizer tensor {name!r}: the model has no "
                                         f"parameter {param!r}")
        if tuple(shape) != tuple(model_shapes[param]):
            raise SafetensorsError(path, f"optimizer tensor {name!r}: shape {list(shape)} "
                                         f"differs from parameter {param!r} shape "
                                         f"{list(model_shapes[param])}")
        if dtype != "F32":
            raise SafetensorsError(path, f"optimizer tensor {name!r}: dtype {dtype}, "
                                         "optimizer state must be F32")
    _check_complete(set(described), model_shapes, states, optimizer=optimizer, path=path)


def _check_complete(names: set[str], model_shapes: Mapping[str, Sequence[int]],
                    states: tuple[str, ...], *, optimizer: str, path: str) -> None:
    """Every parameter has every state tensor of ``optimizer`` (SGD/Muon: or
    no parameter has any: momentum not used)."""
    if optimizer in ("sgd", "muon") and not names:
        return
    for param in sorted(model_shapes):
        missing = [f"{param}.{state}" for state in states if f"{param}.{state}" not in names]
        if missing:
            have = f"{len(names)} optimizer tensors" if names else "no optimizer tensor"
            raise SafetensorsError(path, f"optimizer state incomplete: {missing[0]!r} is "
                                         f"missing ({optimizer} keeps "
                                         f"{' and '.join(states)} for every parameter; "
                                         f"the file has {have})")
