"""Streaming safetensors reader with a strict header check; the one import point
for the safetensors helpers (writer, format types, optimizer state rules).

The format is drawn in :mod:`registry.formats.safetensors_format` (DESIGN
section 4, "Safetensors conventions"; the reference is huggingface/safetensors).
A reader here must reject a hostile header before allocating anything it
announces, which the reference library does not promise. The format's types and
dtypes are :mod:`registry.formats.safetensors_format`, the writer
:mod:`registry.formats.safetensors_write`, the optimizer state rules
:mod:`registry.formats.optimizer_state`; their public names are importable from here.

numpy has no bfloat16 or float8: those come from ``ml_dtypes``. Hosts are
assumed little-endian (as numpy's in-memory dtypes here are native).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from registry.rules import limits
from registry.errors import SafetensorsError
from registry.formats.optimizer_state import check_optimizer_state
from registry.formats.safetensors_format import (
    ITEMSIZES,
    MAX_HEADER_BYTES,
    LazyTensor,
    SafetensorsHeader,
    SeekableReader,
    TensorInfo,
    Writer,
)
from registry.formats.safetensors_write import write_safetensors

if TYPE_CHECKING:  # numpy loads where arrays are built (read_tensor), not to read a header
    import numpy as np

    from registry.formats.safetensors_format import DTYPE_NAMES, DTYPES

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


_LFS_POINTER = b"version https://git-lfs"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


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
    if text.count('"data_offsets"') > limits.MAX_TENSORS:
        # counted before parsing: millions of tiny entries inside the 100 MB
        # header would cost gigabytes of Python objects
        raise SafetensorsError(path, f"header lists more than {limits.MAX_TENSORS} tensors "
                                     "(REGISTRY_MAX_TENSORS)")
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
        expected = _nbytes(info.shape, ITEMSIZES[info.dtype])
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
    if not isinstance(dtype, str) or dtype not in ITEMSIZES:
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
    import numpy as np

    from registry.formats.safetensors_format import DTYPES

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




def __getattr__(name: str) -> Any:
    """``DTYPES`` and ``DTYPE_NAMES`` (numpy dtypes), re-exported on first use."""
    if name in ("DTYPES", "DTYPE_NAMES"):
        from registry.formats import safetensors_format

        return getattr(safetensors_format, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
