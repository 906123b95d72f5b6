"""The safetensors format: dtypes, the header's value types, and the I/O protocols
shared by :mod:`registry.formats.safetensors_io` (reading) and
:mod:`registry.formats.safetensors_write` (writing).

The format (DESIGN section 4, "Safetensors conventions"; the reference is
huggingface/safetensors)::

    [8 bytes]  N, the header length in bytes, unsigned little-endian
    [N bytes]  UTF-8 JSON object, padded with spaces to a multiple of 8 bytes:
               {"__metadata__": {str: str}?,
                "<name>": {"dtype": "F32", "shape": [rows, cols],
                           "data_offsets": [begin, end]}, ...}
    [rest]     tensor bytes, little-endian, C order; offsets are relative to
               the end of the header and tile the rest of the file exactly

numpy has no bfloat16 or float8: those come from ``ml_dtypes``. Hosts are
assumed little-endian (as numpy's in-memory dtypes here are native).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol


from registry.errors import SafetensorsError

#: The reference parser's limit on the header length N, in bytes.
MAX_HEADER_BYTES = 100_000_000


#: safetensors dtype name -> item size in bytes (sub-byte F4/F6 types are not
#: supported): what reading and checking a header needs, without numpy.
ITEMSIZES: Mapping[str, int] = MappingProxyType({
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
})


def _numpy_tables() -> dict[str, Any]:
    """:data:`DTYPES`, :data:`DTYPE_NAMES` and the by-name table, built on
    first use: numpy (and ml_dtypes) load only where arrays are built, not to
    read a header (``registry show``; issue 44 item 6)."""
    import ml_dtypes
    import numpy as np

    dtypes: Mapping[str, np.dtype[Any]] = MappingProxyType({
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
    assert {n: d.itemsize for n, d in dtypes.items()} == dict(ITEMSIZES)
    tables = {
        #: safetensors dtype name -> numpy dtype
        "DTYPES": dtypes,
        #: numpy dtype (native byte order) -> safetensors dtype name
        "DTYPE_NAMES": MappingProxyType({dtype: name for name, dtype in dtypes.items()}),
        # Looked up by numpy's dtype *name* so that big-endian arrays ('>f4' is
        # still "float32") find their safetensors name too.
        "_BY_NUMPY_NAME": {dtype.name: name for name, dtype in dtypes.items()},
    }
    globals().update(tables)
    return tables


if TYPE_CHECKING:  # built on first use by _numpy_tables (module __getattr__)
    import numpy as np

    DTYPES: Mapping[str, np.dtype[Any]]
    DTYPE_NAMES: Mapping[np.dtype[Any], str]
    _BY_NUMPY_NAME: dict[str, str]


def __getattr__(name: str) -> Any:
    """``DTYPES``, ``DTYPE_NAMES`` (numpy dtypes): built on first use."""
    if name in ("DTYPES", "DTYPE_NAMES", "_BY_NUMPY_NAME"):
        return _numpy_tables()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def _describe(tensor: Any, name: str, path: str) -> tuple[str, tuple[int, ...]]:
    """Return (safetensors dtype, shape) without materializing lazy or torch data."""
    if isinstance(tensor, LazyTensor):
        dtype: str | None = tensor.dtype if tensor.dtype in ITEMSIZES else None
        shape = tuple(tensor.shape)
        found = tensor.dtype
    elif type(tensor).__module__.startswith("torch"):
        found = str(tensor.dtype)
        dtype, shape = _TORCH_DTYPES.get(found), tuple(tensor.shape)
    else:
        import numpy as np

        array = tensor if isinstance(tensor, np.ndarray) else np.asarray(tensor)
        found = array.dtype.name
        dtype, shape = _numpy_tables()["_BY_NUMPY_NAME"].get(found), array.shape
    if dtype is None:
        raise SafetensorsError(path, f"tensor {name!r}: dtype {found} has no safetensors "
                                     "equivalent")
    return dtype, tuple(int(d) for d in shape)
