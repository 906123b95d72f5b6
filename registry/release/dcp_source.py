"""Releasing a LoongSage ``dist_ckpt/`` step directly (issue 27 item 2; seed 003
sections 2 and 4.3): the torch DCP shards consolidated, streaming, into the
release's Hugging Face safetensors shards.

The mapping is the HF export's (``save_hf``,
:mod:`registry.checkpoint.loongsage_hf`): DCP entry ``model.<name>`` is the HF
tensor ``<name>``, in its full (global) shape and saved dtype; the other
entries (``optimizer.*``, ``common``, ``rng.rank<r>``) are not part of a
release. A DCP entry that cannot be mapped is refused with one line naming
it and the rule (:class:`~registry.errors.CheckpointError`): a tree with no
``model.`` tensor (another DCP program's keys, e.g. Megatron's
``decoder.layers.0...``), a ``model.`` entry that is not a tensor, a dtype
safetensors has no name for, a chunk stored with a transform, a chunk whose
file is not a ``dist_ckpt/`` file of the step's MANIFEST.json, or chunks that
do not tile their tensor exactly.

Reading: ``dist_ckpt/.metadata`` is read bounded
(:data:`registry.rules.limits.MAX_DCP_METADATA_BYTES`), checked against the step
manifest's sha256 and unpickled only by the restricted loader
(:func:`registry.checkpoint.dcp_safe.load_metadata`); each chunk is read from
its ``*.distcp`` file by byte range and loaded with
``torch.load(weights_only=True)``. Each ``*.distcp`` file is read through a
:class:`~registry.release.source_check.HashedSource`, so every byte used is
hashed in file order and the whole file's sha256 is compared with the step
manifest before the release commits.

Memory: one tensor at a time (the full tensor being assembled, the chunk's
bytes and the chunk loaded from them: about three times the largest tensor,
never the model); shards are written as they fill
(:class:`registry.release.shards.ShardPlan`'s packing and writer).

Needs PyTorch (the ``[torch]`` extra); :mod:`registry.release.model_release`
imports this module only for a ``dist_ckpt`` release.
"""

from __future__ import annotations

import hashlib
import io
from contextlib import ExitStack
from typing import Any

import ml_dtypes
import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from registry.checkpoint.dcp_safe import load_metadata
from registry.checkpoint.loongsage_format import DIST
from registry.errors import CheckpointError, IntegrityError
from registry.rules import limits
from registry.protocol.manifest import Manifest
from registry.release.shards import ShardPlan
from registry.release.source_check import HashedSource
from registry.formats.safetensors_format import SafetensorsHeader, TensorInfo
from registry.store import Store, join
from registry.store.ranges import SeekableRaw

__all__ = ["DcpWeights", "MODEL_KEY"]

MODEL_KEY = "model."
METADATA = ".metadata"
#: torch.save's archive around a chunk's bytes: zip entries and a small pickle.
_CHUNK_OVERHEAD = 1 << 20

_SAFETENSORS = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def _numpy(t: torch.Tensor) -> np.ndarray:
    """``t`` (CPU, contiguous) as numpy without a copy; bf16/fp8 through ml_dtypes."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    if t.dtype == torch.float8_e5m2:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e5m2)
    return t.numpy()


def _well_formed(md: Any) -> bool:
    """A tensor record of plain DCP types (a store writer's pickle may hold others)."""
    def dims(v: Any) -> bool:
        return isinstance(v, torch.Size) and all(isinstance(d, int) for d in v)
    props = getattr(md, "properties", None)
    chunks = getattr(md, "chunks", None)
    return (dims(getattr(md, "size", None)) and isinstance(getattr(props, "dtype", None),
                                                           torch.dtype)
            and isinstance(chunks, list) and all(
                isinstance(c, ChunkStorageMetadata) and dims(getattr(c, "offsets", None))
                and dims(getattr(c, "sizes", None)) for c in chunks))


class _Window(SeekableRaw):
    """Bytes ``[offset, offset + length)`` of ``src`` as a file of their own
    (what torch.load reads a chunk's record from, without a copy of it)."""

    clamp = True

    def __init__(self, src: HashedSource, offset: int, length: int, *, where: str) -> None:
        super().__init__(length)
        self._src, self._off, self._where = src, offset, where

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")[:self._size - self._pos]
        if not len(view):
            return 0
        self._src.seek(self._off + self._pos)
        got = 0
        while got < len(view):
            n = self._src.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{self._src.path}: ends before byte "
                                      f"{self._off + self._size} ({self._where})")
            got += n
        self._pos += got
        return got


class DcpWeights:
    """The ``model.<name>`` tensors of a committed step's ``dist_ckpt/``, as
    the weights of a release (the part of :class:`registry.formats.weights.ModelWeights`
    a release uses: ``files``, ``parameter_count``, ``described``, ``metadata``).

    Args:
        store: the store holding the step.
        step_prefix: the step directory's key (``.../train_step_<N>``).
        manifest: the step's verified MANIFEST.json.

    Raises:
        CheckpointError: ``dist_ckpt/.metadata`` is not in the manifest, or an
            entry cannot be mapped to a Hugging Face tensor (see the module), or
            the model tensors claim more bytes than the step's chunk files hold.
        UnsafeCheckpointError: ``.metadata`` needs a class outside the DCP
            allow-list, or is larger than the cap.
        IntegrityError: the ``.metadata`` bytes read differ from the manifest.
    """

    files: tuple[str, ...] = ()
    metadata: dict[str, str] = {"format": "pt"}

    def __init__(self, store: Store, step_prefix: str, manifest: Manifest) -> None:
        self.store, self.prefix = store, join(step_prefix, DIST)
        self.where = store.url_of(self.prefix)
        self.manifest = manifest
        meta_entry = manifest.entry(f"{DIST}/{METADATA}")
        if meta_entry is None:
            raise CheckpointError(f"{self.where}/{METADATA}: not in the step's MANIFEST.json; "
                                  "the step has no torch DCP dist_ckpt to release (saved with "
                                  "save_checkpoint off?)")
        shown = f"{self.where}/{METADATA}"
        data = store.read_bytes(join(self.prefix, METADATA), limit=limits.MAX_DCP_METADATA_BYTES)
        digest = hashlib.sha256(data).hexdigest()
        if digest != meta_entry.sha256 or len(data) != meta_entry.size:
            raise IntegrityError(shown, expected_size=meta_entry.size, actual_size=len(data),
                                 expected_sha256=meta_entry.sha256, actual_sha256=digest,
                                 reason="the bytes read differ from the step's MANIFEST.json; "
                                        "nothing was committed")
        self.dcp = load_metadata(io.BytesIO(data), path=shown)
        if not isinstance(self.dcp.state_dict_metadata, dict) or not isinstance(
                self.dcp.storage_data, dict):
            raise CheckpointError(f"{shown}: not a DCP metadata file (its entries or storage "
                                  "records are not mappings)")
        self.tensors: dict[str, tuple[str, TensorStorageMetadata]] = {}
        for key, md in self.dcp.state_dict_metadata.items():
            if not isinstance(key, str) or not key.startswith(MODEL_KEY):
                continue
            name = key[len(MODEL_KEY):]
            if isinstance(md, BytesStorageMetadata) or not isinstance(md, TensorStorageMetadata):
                raise CheckpointError(f"{shown}: entry {key!r} is not a tensor; a release "
                                      "maps only model.<name> tensors to Hugging Face weights")
            if not name:
                raise CheckpointError(f"{shown}: entry {key!r} names no tensor")
            if not _well_formed(md):
                raise CheckpointError(f"{shown}: entry {key!r}: its size, dtype or chunks are "
                                      "not those of a DCP tensor record")
            if md.properties.dtype not in _SAFETENSORS:
                raise CheckpointError(f"{shown}: entry {key!r} has dtype {md.properties.dtype}, "
                                      "which safetensors cannot store")
            self._check_tiling(key, md, shown)
            self.tensors[name] = (key, md)
        if not self.tensors:
            sample = ", ".join(repr(k) for k in list(self.dcp.state_dict_metadata)[:3])
            raise CheckpointError(
                f"{shown}: no model.<name> tensor (entries: {sample or 'none'}); only the keys "
                "LoongSage saves (model.<name>, as save_hf exports them) map to Hugging Face "
                "names: export this tree with save_hf, or convert it outside the registry")
        offset = 0
        infos = {}
        for name, (_, md) in self.tensors.items():
            dtype = _SAFETENSORS[md.properties.dtype]
            nbytes = md.size.numel() * torch.empty((), dtype=md.properties.dtype).element_size()
            infos[name] = TensorInfo(name, dtype, tuple(int(d) for d in md.size), offset,
                                     offset + nbytes)
            offset += nbytes
        stored = sum(e.size for e in manifest.files if e.path.startswith(f"{DIST}/")
                     and "/" not in e.path[len(DIST) + 1:] and e.path != f"{DIST}/{METADATA}")
        if offset > stored:  # before any plan or buffer is sized by the claim
            raise CheckpointError(f"{shown}: its model tensors claim {offset} bytes, more tensor "
                                  f"data than the {stored} bytes of the step's chunk files "
                                  "(DCP stores tensors uncompressed)")
        self.header = SafetensorsHeader(tensors=infos, metadata=dict(self.metadata),
                                        data_start=0)
        self._sources: dict[str, HashedSource] = {}
        self._stack: ExitStack | None = None

    # -- the ModelWeights facts a release uses -----------------------------------

    @property
    def described(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {n: (i.dtype, i.shape) for n, i in self.header.tensors.items()}

    @property
    def parameter_count(self) -> int:
        return sum(int(np.prod(i.shape, dtype=np.int64)) for i in self.header.tensors.values())

    def plan(self, *, dtype: str | None, group_size: int, max_shard_size: int) -> ShardPlan:
        """The release's shards (:class:`~registry.release.shards.ShardPlan`
        over these tensors: ``dtype`` conversion, ``max_shard_size`` packing)."""
        return ShardPlan.from_tensors(self.header, self.load, dtype=dtype,
                                      group_size=group_size, max_shard_size=max_shard_size,
                                      where=self.where, sources=self)

    # -- reading -----------------------------------------------------------------

    @staticmethod
    def _check_tiling(key: str, md: TensorStorageMetadata, shown: str) -> None:
        """The chunks lie inside the tensor, do not overlap and cover it."""
        size = tuple(md.size)
        boxes = []
        for c in md.chunks:
            off, sz = tuple(c.offsets), tuple(c.sizes)
            if len(off) != len(size) or len(sz) != len(size) or any(
                    o < 0 or s < 0 or o + s > d for o, s, d in zip(off, sz, size)):
                raise CheckpointError(f"{shown}: entry {key!r}: a chunk at {list(off)} of "
                                      f"{list(sz)} lies outside the tensor's {list(size)}")
            boxes.append((off, sz))
        for i, (a_off, a_sz) in enumerate(boxes):
            for b_off, b_sz in boxes[:i]:
                if all(max(ao, bo) < min(ao + asz, bo + bsz)
                       for ao, asz, bo, bsz in zip(a_off, a_sz, b_off, b_sz)) and size:
                    raise CheckpointError(f"{shown}: entry {key!r}: chunks at {list(a_off)} and "
                                          f"{list(b_off)} overlap")
        covered = sum(int(np.prod(sz, dtype=np.int64)) for _, sz in boxes)
        if covered != int(np.prod(size, dtype=np.int64)) or (not size and len(boxes) != 1):
            raise CheckpointError(f"{shown}: entry {key!r}: its chunks cover {covered} of "
                                  f"{int(np.prod(size, dtype=np.int64))} elements")

    def _source(self, rel: str) -> HashedSource:
        if self._stack is None:
            raise AssertionError("DCP tensors read outside ShardPlan.write")
        src = self._sources.get(rel)
        if src is None:
            entry = self.manifest.entry(f"{DIST}/{rel}")
            if entry is None or "/" in rel or rel in ("", METADATA):
                raise CheckpointError(f"{self.where}/{METADATA}: names chunk file {rel!r}, not "
                                      "a dist_ckpt file of the step's MANIFEST.json")
            src = HashedSource(self._stack.enter_context(self.store.open_read(
                join(self.prefix, rel))), entry.size, path=f"{self.where}/{rel}")
            self._sources[rel] = src
        return src

    def load(self, name: str) -> np.ndarray:
        """Tensor ``name`` in full, assembled from its DCP chunks."""
        key, md = self.tensors[name]
        full = torch.empty(tuple(md.size) if len(md.chunks) > 1 else (0,),
                           dtype=md.properties.dtype)
        for c in md.chunks:
            info = self.dcp.storage_data.get(MetadataIndex(key, c.offsets))
            where = f"{self.where}/{METADATA}: entry {key!r} chunk {list(c.offsets)}"
            if info is None or not isinstance(getattr(info, "relative_path", None), str) \
                    or not all(isinstance(getattr(info, f, None), int)
                               for f in ("offset", "length")):
                raise CheckpointError(f"{where}: no storage record (file, offset, length)")
            if getattr(info, "transform_descriptors", None):
                raise CheckpointError(f"{where}: stored with transforms "
                                      f"{list(info.transform_descriptors)}, which a release "
                                      "does not undo")
            src = self._source(str(info.relative_path))
            nbytes = int(np.prod(tuple(c.sizes), dtype=np.int64)) * full.element_size()
            if info.length > nbytes + _CHUNK_OVERHEAD or info.offset < 0 or info.length < 0:
                raise CheckpointError(f"{where}: a record of {info.length} bytes for "
                                      f"{nbytes} bytes of tensor data")
            try:
                chunk = torch.load(_Window(src, info.offset, info.length, where=where),
                                   weights_only=True, map_location="cpu")
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - a bad chunk is a bad checkpoint
                raise CheckpointError(f"{src.path}: {where}: not a tensor torch.load "
                                      f"(weights_only) reads: {type(e).__name__}: {e}") from None
            if (not isinstance(chunk, torch.Tensor) or tuple(chunk.shape) != tuple(c.sizes)
                    or chunk.dtype != md.properties.dtype):
                raise CheckpointError(f"{src.path}: {where}: holds "
                                      f"{getattr(chunk, 'dtype', type(chunk).__name__)} "
                                      f"{list(getattr(chunk, 'shape', []))}, expected "
                                      f"{md.properties.dtype} {list(c.sizes)}")
            if len(md.chunks) == 1:
                return _numpy(chunk.contiguous())  # the whole tensor: no second buffer
            full[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))] = chunk
            del chunk
        return _numpy(full)

    def opened(self, stack: ExitStack) -> None:
        """Files opened from now on close with ``stack`` (ShardPlan.write's)."""
        self._stack = stack

    def check(self) -> None:
        """Hash the rest of every ``*.distcp`` file read and compare it with
        the step manifest (IntegrityError naming the file otherwise)."""
        for rel, src in self._sources.items():
            entry = self.manifest.entry(f"{DIST}/{rel}")
            assert entry is not None
            src.check(entry.sha256)
        self._stack = None
        self._sources = {}

