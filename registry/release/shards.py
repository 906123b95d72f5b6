"""Converting the weights of a model directory into a release, shard by shard.

DESIGN section 1 ("Weights of a model directory") and section 4: the source is
a :class:`registry.formats.weights.ModelWeights` (one ``model.safetensors`` or an index
and its shards); the release gets its tensors converted (``f32``, ``bf16``,
``int4``; None keeps each dtype and only fixes the metadata) and packed into
shards of at most ``max_shard_size`` bytes of tensor data, transformers'
convention: tensors in source order, a new shard when the next one would tip
it over, a tensor larger than the limit alone in its own shard (an int4
tensor's ``.qweight`` and ``.scales`` stay together). One shard is written as
``model.safetensors`` with no index; several as ``model-0000i-of-0000N`` plus
``model.safetensors.index.json`` (``weight_map``, ``metadata.total_size``,
the source index's other metadata such as ``total_parameters`` kept).

Memory: the writer computes one output tensor at a time from a read of its
source tensor (:class:`registry.formats.safetensors_io.LazyTensor`), so the peak is
about one source tensor and its converted form, never one shard.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

from registry.protocol.commit import DirectoryWriter
from registry.errors import UsageError
from registry.release.convert import _column_counts, plan, weights_groups
from registry.release.source_check import (
    HashedSource,
    object_before,
    stream_sha256,
    verify_object,
)
from registry.formats.safetensors_io import DTYPES, LazyTensor, SafetensorsHeader, write_safetensors
from registry.host.sourcecheck import SourceHashes
from registry.store import Store, join
from registry.formats.weights import INDEX, SINGLE, ModelWeights, index_bytes, shard_name

__all__ = ["ShardPlan", "merged_header", "weight_files"]

_Pack = list[tuple[str, LazyTensor]]


def merged_header(weights: ModelWeights) -> SafetensorsHeader:
    """One header naming every tensor of every shard (offsets are each shard's
    own): for planning a conversion and counting, never for reading data."""
    return SafetensorsHeader(tensors={n: i for n, (_, i) in weights.tensors.items()},
                             metadata=weights.metadata, data_start=0)


def weight_files(weights: ModelWeights) -> list[dict[str, Any]]:
    """The card's per-file listing of stored weights: ``[{"path", "tensors":
    count, "bytes": bytes of tensor data (None for the index)}]``, the index first."""
    out: list[dict[str, Any]] = [{"path": INDEX, "tensors": len(weights.tensors),
                                  "bytes": None}] if weights.sharded else []
    return out + [{"path": s.path, "tensors": len(s.header.tensors),
                   "bytes": sum(i.nbytes for i in s.header.tensors.values())}
                  for s in weights.shards]


class _LazyFile:
    """A source shard opened (and hashed) on its first read."""

    def __init__(self, opener: Callable[[], HashedSource]) -> None:
        self._opener, self.source = opener, None

    def _get(self) -> HashedSource:
        if self.source is None:
            self.source = self._opener()
        return self.source

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._get().seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        return self._get().read(size)

    def readinto(self, buffer: Any) -> int:
        return self._get().readinto(buffer)


class ShardPlan:
    """The converted weights of a release, planned from headers alone.

    Args:
        store, prefix: where the source directory is.
        weights: its checked weights (:func:`registry.formats.weights.load_weights`).
        dtype: ``"f32"``, ``"bf16"``, ``"int4"``, or None (dtypes kept).
        group_size: int4 columns per scale.
        max_shard_size: bytes of tensor data per output shard, at most (a single
            tensor, or an int4 pair, larger than this is a shard of its own).
        where: names the source in errors.

    Attributes:
        names: the output shard names (``[model.safetensors]`` for one).
        groups: :func:`registry.release.convert.weights_groups` of the output.

    Raises:
        UsageError: a bad dtype or group size; int4 with no tensor to quantize
            in the whole model (naming the weights file: the single file or
            the index).
    """

    def __init__(self, store: Store, prefix: str, weights: ModelWeights, *, dtype: str | None,
                 group_size: int, max_shard_size: int, where: str | None = None) -> None:
        self.store, self.prefix, self.weights = store, prefix, weights
        self.where = where if where is not None else store.url_of(prefix)
        self._stack: ExitStack | None = None
        self._files: dict[str, _LazyFile] = {}
        units: list[_Pack] = []
        base: dict[str, str] | None = None
        for shard in weights.shards:
            path = f"{self.where}/{shard.path}"
            self._files[shard.path] = _LazyFile(
                lambda key=join(prefix, shard.path), path=path, size=shard.size:
                self._open(key, path, size))
            tensors, meta = plan(shard.header, self._files[shard.path], dtype=dtype,  # type: ignore[arg-type]
                                 group_size=group_size, path=path, require_quantized=False)
            base = meta if base is None else base
            units.extend(_units(tensors))
        assert base is not None
        self._sources: Any = None
        self._setup(units, base, dtype=dtype, group_size=group_size,
                    max_shard_size=max_shard_size, first=weights.files[0],
                    header=merged_header(weights))

    @classmethod
    def from_tensors(cls, header: SafetensorsHeader, reader: Callable[[str], Any], *,
                     dtype: str | None, group_size: int, max_shard_size: int, where: str,
                     sources: Any) -> ShardPlan:
        """A plan over tensors that are not read from safetensors files (a DCP
        checkpoint, :mod:`registry.release.dcp_source`): ``header`` declares
        their dtypes and shapes in order, ``reader(name)`` returns one
        tensor's data; ``sources.opened(stack)`` is called when writing
        starts and ``sources.check()`` (verifying what was read, raising
        IntegrityError) before :meth:`write` returns. Raises as the
        constructor."""
        self = cls.__new__(cls)
        self.store, self.prefix, self.weights, self.where = None, "", None, where
        self._stack, self._files, self._sources = None, {}, sources
        tensors, meta = plan(header, None, dtype=dtype, group_size=group_size,  # type: ignore[arg-type]
                             path=where, require_quantized=False, reader=reader)
        self._setup(_units(tensors), meta, dtype=dtype, group_size=group_size,
                    max_shard_size=max_shard_size, first="", header=header)
        return self

    def _setup(self, units: list[_Pack], base: dict[str, str], *, dtype: str | None,
               group_size: int, max_shard_size: int, first: str,
               header: SafetensorsHeader) -> None:
        self._meta = {k: v for k, v in base.items() if k != "tinyllm.quantized"}
        self.packs = _pack(units, max_shard_size)
        declared = {n: (t.dtype, tuple(t.shape)) for p in self.packs for n, t in p}
        if dtype == "int4" and not any(n.endswith(".qweight") for n in declared):
            raise UsageError(
                f"{self.where}{'/' + first if first else ''}: --dtype int4 would quantize no "
                f"tensor: none is a 2-D float matrix whose columns divide by group size "
                f"{group_size} (columns: {_column_counts(header)}); pick a group size that "
                "divides them, or another --dtype")
        self.groups = weights_groups(declared, self._meta)
        self.names = [SINGLE] if len(self.packs) == 1 else [
            shard_name(i + 1, len(self.packs)) for i in range(len(self.packs))]

    def _open(self, key: str, path: str, size: int) -> HashedSource:
        assert self._stack is not None, "source read outside ShardPlan.write"
        before = object_before(self.store, key)  # S3: taken before the first byte is read
        src = HashedSource(self._stack.enter_context(self.store.open_read(key)), size,
                           path=path, also=SourceHashes(before) if before else None)
        src.before = before
        return src

    @property
    def files(self) -> list[dict[str, Any]]:
        """The planned output files as :func:`weight_files` lists them."""
        sizes = [sum(_nbytes(t) for _, t in pack) for pack in self.packs]
        out = [{"path": INDEX, "tensors": sum(len(p) for p in self.packs), "bytes": None}
               ] if len(self.names) > 1 else []
        return out + [{"path": n, "tensors": len(p), "bytes": b}
                      for n, p, b in zip(self.names, self.packs, sizes)]

    def write(self, w: DirectoryWriter, digests: Mapping[str, str] | None = None,
              checks: dict[str, str] | None = None) -> list[str]:
        """Write the planned weights into ``w`` (shards, then the index).

        Args:
            w: the release being written.
            digests: source file name -> sha256 (a checkpoint's manifest); a
                source without one is checked against the server's checksums
                (S3) or hashed by a separate streamed read
                (registry.release.source_check.verify_object).
            checks: gets ``{source shard: means}`` for an S3 source without one.

        Returns:
            The weights files written, relative.

        Raises:
            IntegrityError: the bytes read from a source shard differ from its
                sha256 (every shard is checked before this returns; the caller
                must not commit after an exception).
            SourceChangedError: an S3 source shard changed while read, or its
                bytes are not what the server holds.
            SafetensorsError: a source shard ends early.
        """
        weight_map: dict[str, str] = {}
        total = 0
        with ExitStack() as self._stack:
            if self._sources is not None:
                self._sources.opened(self._stack)
            for name, pack in zip(self.names, self.packs):
                meta = dict(self._meta)
                quantized = [n[:-len(".qweight")] for n, _ in pack if n.endswith(".qweight")]
                if quantized:
                    meta["tinyllm.quantized"] = ",".join(quantized)
                with w.open(name) as out:
                    write_safetensors(out, pack, metadata=meta, path=name)
                for tensor, lazy in pack:
                    weight_map[tensor] = name
                    total += _nbytes(lazy)
            if self._sources is not None:
                self._sources.check()
            for shard in (self.weights.shards if self.weights is not None else ()):
                key = join(self.prefix, shard.path)
                lazy_file = self._files[shard.path]
                source = lazy_file.source or self._open(key, f"{self.where}/{shard.path}",
                                                        shard.size)
                expected = (digests or {}).get(shard.path)
                if expected is None and source.before is not None:
                    assert source.also is not None
                    means = verify_object(self.store, key, source.before, source.also,
                                          source.sha256())
                    if checks is not None:
                        checks[shard.path] = means
                    continue
                source.check(expected or stream_sha256(self.store, key))
        self._stack = None
        if len(self.names) == 1:
            return list(self.names)
        index = self.weights.index if self.weights is not None else None
        kept = {k: v for k, v in ((index or {}).get("metadata") or {}).items()
                if k != "total_size"}
        w.write_bytes(INDEX, index_bytes(weight_map, total_size=total, metadata=kept))
        return [INDEX, *self.names]


def _units(tensors: _Pack) -> list[_Pack]:
    """Group an int4 tensor's ``.qweight`` with its ``.scales`` (they follow
    each other in a plan); every other tensor is a unit of its own."""
    units: list[_Pack] = []
    for item in tensors:
        name = item[0]
        if (name.endswith(".scales") and units
                and units[-1][0][0] == name[:-len(".scales")] + ".qweight"):
            units[-1].append(item)
        else:
            units.append([item])
    return units


def _nbytes(lazy: LazyTensor) -> int:
    count = DTYPES[lazy.dtype].itemsize
    for dim in lazy.shape:
        count *= dim
    return count


def _pack(units: list[_Pack], max_size: int) -> list[_Pack]:
    """transformers' greedy split (huggingface_hub ``split_state_dict_into_shards``)."""
    packs: list[_Pack] = []
    current: _Pack = []
    size = 0
    for unit in units:
        nbytes = sum(_nbytes(lazy) for _, lazy in unit)
        if nbytes > max_size:
            packs.append(list(unit))
            continue
        if current and size + nbytes > max_size:
            packs.append(current)
            current, size = [], 0
        current.extend(unit)
        size += nbytes
    if current or not packs:
        packs.append(current)
    return packs
