"""Reading torch.distributed.checkpoint (DCP) files without running their pickles.

A DCP directory is pickles: ``.metadata`` is one (``pickle.load`` in DCP's
reader) and every non-tensor entry of a ``*.distcp`` shard is ``torch.save``
bytes that DCP's default planner loads with ``weights_only=False``. Checkpoints
are not signed, so a store writer who rewrites ``dist_ckpt/.metadata`` and the
step's MANIFEST.json would run code on every host that resumes the step.

Here both go through restricted loaders:

* ``.metadata``: :class:`MetadataUnpickler`, a ``pickle.Unpickler`` whose
  ``find_class`` admits only the classes DCP's metadata is made of (the
  standard way to restrict unpickling, Python's ``pickle`` docs, "Restricting
  Globals"), and only up to :data:`registry.rules.limits.MAX_DCP_METADATA_BYTES`;
* byte entries: :class:`SafeLoadPlanner` loads them with
  ``torch.load(weights_only=True)`` (tensors and plain Python values, the
  values this registry saves: JSON bytes);
* tensors: DCP's reader already uses ``weights_only=True``.

A refused load raises :class:`UnsafeCheckpointError` naming the file and the
class it met; nothing of the pickle ran.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta

from registry.errors import CheckpointError
from registry.rules import limits

_DCP_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata",
        "TensorProperties", "StorageMeta", "MetadataIndex", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}


class UnsafeCheckpointError(CheckpointError):
    """A DCP file of a checkpoint asked for something the restricted loader
    does not admit (a class outside the allow-list, a size above the cap).

    Attributes:
        path: the file (store URL).
        found: the class (``module.name``) or the rule it broke.
    """

    def __init__(self, path: str, found: str, rule: str) -> None:
        super().__init__(f"{path}: {rule} {found}; refused, nothing of it was run")
        self.path = path
        self.found = found


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP ``.metadata``: the classes of
    ``torch.distributed.checkpoint.metadata`` and the few values they hold
    (``torch.Size``, dtypes, layouts, memory formats, paths); any other
    global raises :class:`UnsafeCheckpointError` before it is imported."""

    def __init__(self, file: Any, *, path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _DCP_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None),
                                            torch.dtype | torch.memory_format | torch.layout):
            return getattr(torch, name)
        raise UnsafeCheckpointError(self._path, f"{module}.{name}",
                                    "a pickle class outside the DCP metadata allow-list:")


def load_metadata(stream: Any, *, path: str, limit: int | None = None) -> Any:
    """The DCP ``Metadata`` pickled in ``stream`` (a binary file), through
    :class:`MetadataUnpickler`, reading at most ``limit`` bytes (default:
    :data:`registry.rules.limits.MAX_DCP_METADATA_BYTES`, read now).

    Raises:
        UnsafeCheckpointError: a class outside the allow-list; more than
            ``limit`` bytes; the pickle is not a DCP ``Metadata``.
        CheckpointError: the bytes are not a pickle.
    """
    if limit is None:
        limit = limits.MAX_DCP_METADATA_BYTES
    data = limits.read_at_most(stream, limit)
    if len(data) > limit:
        raise UnsafeCheckpointError(path, f"{limit} bytes", "larger than the cap of")
    try:
        meta = MetadataUnpickler(io.BytesIO(data), path=path).load()
    except UnsafeCheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - every broken pickle is a bad checkpoint
        raise CheckpointError(f"{path}: not a readable torch_dist (torch.distributed."
                              f"checkpoint) metadata file: {type(e).__name__}: {e}") from None
    from torch.distributed.checkpoint.metadata import Metadata
    if not isinstance(meta, Metadata):
        raise UnsafeCheckpointError(path, type(meta).__name__,
                                    "not a DCP Metadata object but")
    return meta


class _SafeMetadata:
    """``read_metadata`` of DCP's readers, through :func:`load_metadata`."""

    path: Any
    fs: Any
    load_id: Any
    #: the DCP directory as errors name it (a store URL), else its file path
    where: str | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = self._get_metadata_path(kwargs.get("rank"))  # type: ignore[attr-defined]
        shown = f"{self.where}/{os.path.basename(str(path))}" if self.where else str(path)
        with self.fs.create_stream(path, "rb") as f:
            meta = load_metadata(f, path=shown)
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafeFileSystemReader(_SafeMetadata, FileSystemReader):
    """DCP's local-disk reader with the restricted ``.metadata`` loader."""


class SafeFsspecReader(_SafeMetadata, FsspecReader):
    """DCP's fsspec reader with the restricted ``.metadata`` loader."""


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that byte entries are loaded with
    ``torch.load(weights_only=True)`` (DCP's own uses ``weights_only=False``).

    Args:
        where: the DCP directory as errors name it (a store URL).

    Raises (from :func:`safe_load`):
        UnsafeCheckpointError: an entry needs a class weights_only refuses
            (the message names the shard file, the entry and the class).
    """

    def __init__(self, *, where: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.where = where

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError:
            info = (self.metadata.storage_data or {}).get(read_item.storage_index) \
                if self.metadata is not None else None
            name = getattr(info, "relative_path", "?")
            value.seek(0)
            try:
                found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(value))
            except Exception:  # noqa: BLE001 - not even a torch.save archive
                found = "a pickle that is not torch.save data"
            raise UnsafeCheckpointError(f"{self.where}/{name} (entry {fqn!r})",
                                        found or "an unsupported opcode",
                                        "weights_only=True refuses") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def safe_load(state_dict: dict[str, Any], reader: Any, **kwargs: Any) -> None:
    """``torch.distributed.checkpoint.load`` of ``state_dict`` from ``reader``
    (one of :func:`registry.checkpoint.dist.storage_reader`'s) through
    :class:`SafeLoadPlanner`; ``kwargs`` go to ``dcp.load``.

    Raises:
        UnsafeCheckpointError: a file needed a class outside the allow-lists
            (also when DCP wrapped it in its CheckpointException).
        CheckpointException: DCP's other failures, as DCP raises them.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state_dict, storage_reader=reader,
                 planner=SafeLoadPlanner(where=getattr(reader, "where", "") or ""), **kwargs)
    except CheckpointException as e:
        for exc, _tb in e.failures.values():
            if isinstance(exc, UnsafeCheckpointError):
                raise exc from None
        raise
