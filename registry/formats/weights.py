"""The weights of a model directory: one ``model.safetensors``, or an index and its shards.

Seed 000 names ``model.safetensors``; DESIGN section 1 ("Weights of a model
directory") extends it the way Hugging Face exports ship large models::

    model.safetensors                         the single form, or
    model.safetensors.index.json              the sharded form:
        {"metadata": {"total_size": <bytes of tensor data>, ...},
         "weight_map": {"<tensor>": "model-00001-of-00004.safetensors", ...}}
    model-00001-of-00004.safetensors ...      exactly the shards weight_map names

The rule, checked by :func:`load_weights` before any tensor is read (each
refusal is a :class:`~registry.errors.DocumentError` naming the file and the
rule):

- one form only: ``model.safetensors`` and the index together are refused;
  neither is refused (the weights are missing);
- the index is a JSON object of at most :data:`MAX_INDEX_BYTES` with a
  non-empty ``weight_map`` of tensor name -> shard file name (a plain
  ``*.safetensors`` name beside the index: no ``/``, not the single file's
  name); ``metadata``, when present, is an object whose ``total_size``, when
  present, is a non-negative integer;
- every shard the index names exists; no other top-level ``*.safetensors``
  file is there (a stale shard), except ``optimizer.safetensors`` (a
  checkpoint's optimizer state, seed 000), in either form;
- every shard's header passes the strict check of
  :func:`registry.formats.safetensors_io.read_header` (100 MB header limit, offsets);
- every tensor is in exactly one shard, the one ``weight_map`` says, and every
  ``weight_map`` entry is in its shard;
- ``metadata.total_size``, when present, equals the tensor bytes of all shards.

Other engineers' code reads a model directory's weights only through this
module: :func:`load_weights` (the checked :class:`ModelWeights`),
:func:`open_tensors` / :func:`iter_tensors` (shard by shard, one tensor at a
time), :func:`shard_name` and :func:`index_bytes` (to write the sharded form).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from registry.rules import limits, numbers
from registry.errors import DocumentError
from registry.formats.safetensors_io import SafetensorsHeader, TensorInfo, read_header, read_tensor
from registry.store import Store, join

if TYPE_CHECKING:  # numpy loads where tensors are read, not to read the headers
    import numpy as np

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "INDEX",
    "MAX_INDEX_BYTES",
    "OPTIMIZER",
    "SINGLE",
    "ModelWeights",
    "Shard",
    "index_bytes",
    "is_weights_name",
    "iter_tensors",
    "load_weights",
    "open_tensors",
    "parse_size",
    "read_index",
    "shard_name",
    "weights_names",
]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
#: a checkpoint's optimizer state (seed 000): a safetensors file that is not a shard.
OPTIMIZER = "optimizer.safetensors"
#: the index is read whole: refuse one larger than this many bytes before reading it
#: (the same limit as a safetensors header; a 1T-parameter model's index is ~10 MB).
MAX_INDEX_BYTES = 100_000_000
#: transformers' ``save_pretrained`` default ``max_shard_size`` ("5GB"), in bytes.
DEFAULT_MAX_SHARD_SIZE = 5_000_000_000
#: header reads in flight at once (S3 latency dominates for many shards).
_HEADER_THREADS = 8

_SHARD_NAME = re.compile(r"[^/\\\x00]+\.safetensors")


@dataclass(frozen=True, slots=True)
class Shard:
    """One weights file of a model directory, its header validated.

    Attributes:
        path: the file name, relative to the model directory
            (``model.safetensors`` in the single form).
        size: the file size in bytes.
        header: its validated header (tensors in file order, ``__metadata__``).
    """

    path: str
    size: int
    header: SafetensorsHeader


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """The checked weights of one model directory (see the module docstring).

    Attributes:
        shards: the weights files in name order (one, ``model.safetensors``, in
            the single form; the index's shards in the sharded form).
        index: the parsed index document (sharded form), else None.
        index_size: the index file's size in bytes (0 in the single form).
    """

    shards: tuple[Shard, ...]
    index: dict[str, Any] | None = None
    index_size: int = 0
    _tensors: dict[str, tuple[Shard, TensorInfo]] = field(default_factory=dict, repr=False)

    @property
    def sharded(self) -> bool:
        """True in the sharded form (an index and its shards)."""
        return self.index is not None

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the weights, relative: the index first, then the shards."""
        return ((INDEX,) if self.sharded else ()) + tuple(s.path for s in self.shards)

    @property
    def tensors(self) -> dict[str, tuple[Shard, TensorInfo]]:
        """tensor name -> (its shard, its header entry), shard by shard in file order."""
        return self._tensors

    @property
    def described(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """tensor name -> (safetensors dtype, shape), for :func:`weights_groups`."""
        return {n: (i.dtype, tuple(i.shape)) for n, (_, i) in self._tensors.items()}

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` of the first shard (transformers writes the same
        ``{"format": "pt"}`` into every shard; conversions here do too)."""
        return dict(self.shards[0].header.metadata)

    @property
    def total_size(self) -> int:
        """Bytes of tensor data of all shards (the index's ``metadata.total_size``)."""
        return sum(i.nbytes for _, i in self._tensors.values())

    @property
    def parameter_count(self) -> int:
        """Scalars stored, over all shards (an int4 ``.qweight`` byte counts once)."""
        return sum(math.prod(i.shape) for _, i in self._tensors.values())

    @property
    def size(self) -> int:
        """Bytes of every weights file, the index included."""
        return self.index_size + sum(s.size for s in self.shards)


def is_weights_name(name: str) -> bool:
    """Whether a relative file name is a weights file of either form: the single
    file, the index, or a top-level ``*.safetensors`` other than the optimizer's."""
    return name == INDEX or ("/" not in name and name.endswith(".safetensors")
                             and name != OPTIMIZER)


def weights_names(names: Iterable[str]) -> list[str]:
    """The weights files among ``names`` (see :func:`is_weights_name`), sorted."""
    return sorted(n for n in names if is_weights_name(n))


def shard_name(number: int, count: int) -> str:
    """transformers' shard file name: ``shard_name(1, 4) == "model-00001-of-00004.safetensors"``."""
    return f"model-{number:05d}-of-{count:05d}.safetensors"


def index_bytes(weight_map: Mapping[str, str], *, total_size: int,
                metadata: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of ``model.safetensors.index.json`` as transformers writes it:
    ``{"metadata": {**metadata, "total_size": total_size}, "weight_map": ...}``,
    weight_map sorted by tensor name, indented by 2, a final newline."""
    doc = {"metadata": {**dict(metadata or {}), "total_size": int(total_size)},
           "weight_map": dict(sorted(weight_map.items()))}
    return (numbers.dumps(doc, indent=2) + "\n").encode()


def parse_size(value: int | str) -> int:
    """A shard size in bytes from an int or transformers' notation: ``"5GB"`` is
    5 * 10**9, ``"500MiB"`` 500 * 2**20, ``"1000"`` 1000 bytes.

    Raises:
        UsageError: not a positive size.
    """
    from registry.errors import UsageError

    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise UsageError(f"shard size {value}: must be a positive number of bytes")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(value), re.IGNORECASE)
    if match is None:
        raise UsageError(f"shard size {value!r}: expected bytes or a number with KB, MB, "
                         "GB, KiB, MiB or GiB (5GB = 5*10**9 bytes, as transformers reads it)")
    unit = (match.group(2) or "B").upper()
    scale = 1 if unit == "B" else (1024 if "I" in unit else 1000) ** ("KMGT".index(unit[0]) + 1)
    size = int(float(match.group(1)) * scale)
    if size <= 0:
        raise UsageError(f"shard size {value!r}: must be positive")
    return size


def read_index(data: bytes, *, path: str) -> dict[str, Any]:
    """Parse and check ``model.safetensors.index.json`` (the index rules of the
    module docstring; the shards themselves are not looked at).

    Returns:
        The document: ``weight_map`` (tensor -> shard name) and ``metadata``.

    Raises:
        DocumentError: naming ``path`` and the rule broken.
    """
    if len(data) > MAX_INDEX_BYTES:
        raise DocumentError(path, f"index is {len(data)} bytes, over the "
                                  f"{MAX_INDEX_BYTES}-byte limit")
    if limits.json_values_at_most(data) > 2 * limits.MAX_TENSORS + 1000:
        raise DocumentError(path, f"index names more than {limits.MAX_TENSORS} tensors "
                                  "(REGISTRY_MAX_TENSORS)")
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates(path))
    except UnicodeDecodeError:
        raise DocumentError(path, "index is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise DocumentError(path, f"index is not JSON: {e.msg} at character {e.pos}") from None
    except RecursionError:
        raise DocumentError(path, "index JSON is nested too deeply") from None
    if not isinstance(doc, dict):
        raise DocumentError(path, "index must be a JSON object")
    wmap = doc.get("weight_map")
    if not isinstance(wmap, dict) or not wmap:
        raise DocumentError(path, "index needs a non-empty \"weight_map\" object "
                                  "(tensor name -> shard file)")
    for tensor, shard in wmap.items():
        if not isinstance(shard, str) or not _SHARD_NAME.fullmatch(shard) or shard in (
                ".safetensors", SINGLE, OPTIMIZER):
            raise DocumentError(path, f"weight_map[{tensor!r}] = {shard!r}: a shard is a "
                                      "*.safetensors file beside the index (no '/', not "
                                      f"{SINGLE} or {OPTIMIZER})")
    meta = doc.get("metadata", {})
    if not isinstance(meta, dict):
        raise DocumentError(path, "index \"metadata\" must be a JSON object")
    total = meta.get("total_size")
    if total is not None and (type(total) is not int or total < 0):
        raise DocumentError(path, f"index metadata.total_size {total!r}: must be a "
                                  "non-negative integer (bytes of tensor data)")
    return doc


def load_weights(store: Store, prefix: str = "", *, files: Mapping[str, int] | None = None,
                 where: str | None = None) -> ModelWeights:
    """Find, read and check the weights of the model directory at ``prefix``.

    Reads the index (sharded form) and every shard's header, never tensor
    data; headers of several shards are read in parallel.

    Args:
        store: the store holding the directory (a local folder opened as a
            store, an S3 prefix, a release's store).
        prefix: the directory's key in ``store`` (``""`` for the store root).
        files: the directory's files, relative name -> size in bytes (a
            manifest's entries, or ``store.walk_files(prefix)``, which is
            what None means). Sizes bound the header reads.
        where: names the directory in errors (default ``store.url_of(prefix)``).

    Returns:
        The :class:`ModelWeights`.

    Raises:
        DocumentError: a rule of the module docstring is broken; the message
            names the file (the index, a shard, or the directory) and the rule.
        SafetensorsError: a shard's header is invalid (a DocumentError too).
        StorageError: the store fails.

    Notes:
        Pure reads: nothing is written. A caller that then copies the files
        should hash what it copies: this check does not pin their bytes.
    """
    if files is None:
        files = store.walk_files(prefix)
    where = where if where is not None else store.url_of(prefix)
    names = set(files)
    has_single, has_index = SINGLE in names, INDEX in names
    if has_single and has_index:
        raise DocumentError(f"{where}/{INDEX}", f"beside {SINGLE}: a model directory holds "
                                                "one form of weights, the single file or the "
                                                "index and its shards, never both")
    if not has_single and not has_index:
        raise DocumentError(f"{where}/{SINGLE}", f"missing: a model directory needs it (or "
                                                 f"{INDEX} and the shards it names)")
    index, wanted = None, [SINGLE]
    if has_index:
        index_path = f"{where}/{INDEX}"
        if files[INDEX] > MAX_INDEX_BYTES:
            raise DocumentError(index_path, f"index is {files[INDEX]} bytes, over the "
                                            f"{MAX_INDEX_BYTES}-byte limit")
        index = read_index(store.read_bytes(join(prefix, INDEX)), path=index_path)
        wanted = sorted(set(index["weight_map"].values()))
        for shard in wanted:
            if shard not in names:
                raise DocumentError(f"{where}/{shard}", f"missing: {INDEX} names it in "
                                                        "weight_map")
    for name in sorted(names):
        if is_weights_name(name) and name != INDEX and name not in wanted:
            rule = (f"a shard {INDEX}'s weight_map does not name (stale weights ship beside "
                    "the index): remove it" if index is not None else
                    f"a second weights file beside {SINGLE} (no index names it): remove it")
            raise DocumentError(f"{where}/{name}", rule)

    def header(name: str) -> Shard:
        key = join(prefix, name)
        with store.open_read(key) as f:
            return Shard(name, files[name], read_header(f, path=f"{where}/{name}",
                                                        file_size=files[name]))

    if len(wanted) == 1:
        shards = [header(wanted[0])]
    else:
        with ThreadPoolExecutor(min(_HEADER_THREADS, len(wanted))) as pool:
            shards = list(pool.map(header, wanted))
    tensors: dict[str, tuple[Shard, TensorInfo]] = {}
    for shard in shards:
        for name, info in shard.header.tensors.items():
            if name in tensors:
                raise DocumentError(f"{where}/{tensors[name][0].path}",
                                    f"tensor {name!r} is also in {shard.path}: a tensor is "
                                    "in exactly one shard")
            tensors[name] = (shard, info)
    for name, (shard, _) in tensors.items():
        if index is not None and index["weight_map"].get(name) != shard.path:
            said = index["weight_map"].get(name)
            rule = (f"the index maps it to {said}" if said is not None
                    else "the index's weight_map does not name it")
            raise DocumentError(f"{where}/{shard.path}", f"tensor {name!r} is here, but {rule}")
    weights = ModelWeights(tuple(shards), index, files[INDEX] if has_index else 0, tensors)
    if index is not None:
        for name, shard_path in sorted(index["weight_map"].items()):
            if name not in tensors:
                raise DocumentError(f"{where}/{INDEX}", f"weight_map maps tensor {name!r} to "
                                                        f"{shard_path}, which does not hold it")
        total = index.get("metadata", {}).get("total_size")
        if total is not None and total != weights.total_size:
            raise DocumentError(f"{where}/{INDEX}", f"metadata.total_size is {total} bytes, "
                                                    f"the shards hold {weights.total_size} "
                                                    "bytes of tensor data")
    return weights


def open_tensors(store: Store, prefix: str, shard: Shard, *,
                 where: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(name, array)`` of one shard in file order, one tensor at a time
    (the file stays open while the iterator runs; drop each array to keep
    memory at about one tensor).

    Raises:
        SafetensorsError: the file ends before a tensor does (it changed since
            :func:`load_weights` read its header).
    """
    key = join(prefix, shard.path)
    path = f"{where if where is not None else store.url_of(prefix)}/{shard.path}"
    with store.open_read(key) as f:
        for name in shard.header.tensors:
            yield name, read_tensor(f, shard.header, name, path=path)


def iter_tensors(store: Store, prefix: str, weights: ModelWeights, *,
                 where: str | None = None) -> Iterator[tuple[Shard, str, np.ndarray]]:
    """Yield ``(shard, name, array)`` for every tensor, shard by shard (name
    order), each shard in file order: sequential reads, one tensor in memory.

    Raises:
        SafetensorsError: as :func:`open_tensors`.
    """
    for shard in weights.shards:
        for name, array in open_tensors(store, prefix, shard, where=where):
            yield shard, name, array


def _no_duplicates(path: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:  # json keeps the last silently: two readers could disagree
                raise DocumentError(path, f"index has the key {key!r} twice")
            out[key] = value
        return out
    return hook
