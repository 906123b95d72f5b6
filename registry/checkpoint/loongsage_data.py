"""Data source states and the fully_async pipeline buffer of a LoongSage step
(seed 003 sections 1, 3 and 4.3).

::

    train_step_<N>/data_source/global_dataset_state_dict_ds<i>.pt
        torch.save({"ds_idx": i, "prompt_data_path": str, "state": <cursor state>,
                    "prompt_buffer": [<prompts read but not yet consumed>]})
    train_step_<N>/data_source/pipeline_buf.pt          (fully_async saves only)
        torch.save({"step": N, "items": [<in-flight items of snapshot_pipeline_buf()>]})

On resume a source is matched by its stored ``prompt_data_path``, never by its
position ``i``. Every file is listed in the step's MANIFEST.json and verified
with it before it is read. ``.pt`` files are read with
``torch.load(weights_only=True)`` (no arbitrary pickles from a store), so
states hold tensors and plain Python values (dict, list, tuple, str, int,
float, bool, None); a save checks that its files load that way before
anything is written. Steps saved by earlier registry versions hold
``..._ds<i>.json`` files instead: they are still read.

torch is optional (the ``[torch]`` extra): it is imported only here, when a
``.pt`` file is written or read.
"""

from __future__ import annotations

import io
import json
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from registry.checkpoint.loongsage_format import DATA, DATA_RE, DataSourceFreshWarning
from registry.errors import CheckpointError, DocumentError, TorchUnavailableError
from registry.protocol.manifest import Manifest
from registry.store import Store, join

#: the fully_async pipeline buffer snapshot of a step.
PIPELINE = f"{DATA}/pipeline_buf.pt"
EXTRA = "modeldir-registry[torch]"


def data_file(index: int) -> str:
    """Relative path of data source ``index``'s state in a step directory."""
    return f"{DATA}/global_dataset_state_dict_ds{index}.pt"


def torch_module(what: str) -> Any:
    """``torch``, imported now.

    Raises:
        TorchUnavailableError: torch is not installed; names ``what`` and the extra.
    """
    try:
        import torch
    except ImportError:
        raise TorchUnavailableError(f"{what}: reading or writing LoongSage .pt files needs "
                                    f"torch: pip install '{EXTRA}'") from None
    return torch


def dumps_pt(obj: Any, *, what: str) -> bytes:
    """``obj`` as the bytes of a ``.pt`` file (``torch.save``), checked to load
    back with ``weights_only=True``.

    Raises:
        TorchUnavailableError: no torch.
        CheckpointError: ``obj`` cannot be saved, or holds values that only an
            unrestricted unpickler could load (numpy arrays, custom classes).
    """
    torch = torch_module(what)
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
        data = buf.getvalue()
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - pickling raises many types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{what}: cannot be saved as a .pt file that loads with "
                              f"weights_only=True (use tensors and plain Python values): "
                              f"{first}") from None
    return data


def loads_pt(data: bytes, *, what: str) -> Any:
    """Load the bytes of a ``.pt`` file with ``weights_only=True`` on CPU.

    Raises:
        TorchUnavailableError: no torch.
        DocumentError: not such a file.
    """
    torch = torch_module(what)
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - unpickling raises many types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DocumentError(what, f"not a .pt file that loads with weights_only=True: "
                                  f"{first}") from None


@dataclass(frozen=True, slots=True)
class DataSourceState:
    """The state one data source resumes from (matched by ``prompt_data_path``).

    Attributes:
        state: the saved cursor state, or None when the source starts fresh.
        saved_index: the ``ds<i>`` it was saved as (None when fresh).
        prompt_buffer: the prompts it had read but not yet handed out at the
            save, in order; to be consumed before reading on from ``state``.
    """

    prompt_data_path: str
    state: Any
    saved_index: int | None
    prompt_buffer: tuple[Any, ...] = ()

    @property
    def fresh(self) -> bool:
        return self.saved_index is None


class DataStateLookup:
    """Mixin for the resumed-state records (``loongsage_load.TrainingState``,
    ``loongsage_dcp.DistTrainingState``): looks a data source up by
    ``prompt_data_path`` in their ``data_sources``."""

    __slots__ = ()
    data_sources: tuple[DataSourceState, ...]

    def data_state(self, prompt_data_path: str) -> Any:
        """The state of the data source ``prompt_data_path`` (None: fresh).

        Raises:
            KeyError: ``prompt_data_path`` was not among the run's data sources.
        """
        for ds in self.data_sources:
            if ds.prompt_data_path == prompt_data_path:
                return ds.state
        raise KeyError(prompt_data_path)


def data_documents(data_sources: Iterable[Mapping[str, Any]], pipeline_buf: Any, *,
                   where: str) -> dict[str, bytes]:
    """The ``data_source/`` files of a save, serialized now (so an async save
    holds the state of this moment).

    Args:
        data_sources: ``{"prompt_data_path": str, "state": ..., "prompt_buffer":
            [...]?}`` per source, in the run's order (``ds<i>``).
        pipeline_buf: ``snapshot_pipeline_buf()``'s items (fully_async), or None.
        where: the step's URL, for messages.

    Raises:
        CheckpointError: a source without a prompt_data_path, one given twice,
            a prompt_buffer that is not a list, or a value torch cannot save.
        TorchUnavailableError: there is something to write and no torch.
    """
    docs: dict[str, bytes] = {}
    seen: set[str] = set()
    for i, ds in enumerate(data_sources):
        path = ds.get("prompt_data_path") if isinstance(ds, Mapping) else None
        if not isinstance(path, str) or not path:
            raise CheckpointError(f"{where}: data source {i} needs a non-empty "
                                  "prompt_data_path")
        if path in seen:
            raise CheckpointError(f"{where}: data source {i}: prompt_data_path {path!r} "
                                  "given twice")
        seen.add(path)
        buffer = ds.get("prompt_buffer")
        buffer = () if buffer is None else buffer
        if isinstance(buffer, (str, bytes, Mapping)) or not isinstance(buffer, Iterable):
            raise CheckpointError(f"{where}: data source {i}: prompt_buffer must be a list "
                                  "of the prompts not yet consumed")
        docs[data_file(i)] = dumps_pt({"ds_idx": i, "prompt_data_path": path,
                                       "state": ds.get("state"),
                                       "prompt_buffer": list(buffer)},
                                      what=f"{where}/{data_file(i)}")
    if pipeline_buf is not None:
        if isinstance(pipeline_buf, (str, bytes, Mapping)) or \
                not isinstance(pipeline_buf, Iterable):
            raise CheckpointError(f"{where}/{PIPELINE}: snapshot_pipeline_buf() must return "
                                  "a list of the in-flight items")
        docs[PIPELINE] = dumps_pt({"items": list(pipeline_buf)}, what=f"{where}/{PIPELINE}")
    return docs


def read_data_state(store: Store, prefix: str, manifest: Manifest, paths: list[str],
                    ) -> tuple[tuple[DataSourceState, ...], tuple[Any, ...] | None]:
    """The data source states for ``paths`` (in that order) and the pipeline
    buffer of a verified step (None: the save was not fully_async).

    Raises:
        DocumentError: a state file is malformed, or two name one prompt_data_path.
        TorchUnavailableError: the step holds ``.pt`` files and torch is missing.

    Warns:
        DataSourceFreshWarning: a path has no saved state (it starts fresh).
    """
    saved: dict[str, DataSourceState] = {}
    for e in manifest.files:
        m = DATA_RE.fullmatch(e.path)
        if m is None:
            continue
        where = store.url_of(join(prefix, e.path))
        data = store.read_bytes(join(prefix, e.path))
        if m.group(2) == "pt":
            doc = loads_pt(data, what=where)
        else:
            try:
                doc = json.loads(data)
            except ValueError as err:
                raise DocumentError(where, f"not JSON: {err}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("prompt_data_path"), str):
            raise DocumentError(where, "must be a dict with a prompt_data_path string")
        path = doc["prompt_data_path"]
        if path in saved:
            raise DocumentError(where, f"prompt_data_path {path!r} is saved twice")
        buffer = doc.get("prompt_buffer", [])
        if not isinstance(buffer, (list, tuple)):
            raise DocumentError(where, "prompt_buffer must be a list")
        saved[path] = DataSourceState(path, doc.get("state"), int(m.group(1)), tuple(buffer))
    out = []
    for p in paths:
        if p in saved:
            out.append(saved[p])
            continue
        warnings.warn(f"data source {p!r}: no saved state in "
                      f"{store.url_of(join(prefix, DATA))} (saved: {sorted(saved) or 'none'}); "
                      "it starts fresh", DataSourceFreshWarning, stacklevel=3)
        out.append(DataSourceState(p, None, None))
    pipeline = None
    if manifest.entry(PIPELINE) is not None:
        where = store.url_of(join(prefix, PIPELINE))
        doc = loads_pt(store.read_bytes(join(prefix, PIPELINE)), what=where)
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), (list, tuple)):
            raise DocumentError(where, "must be a dict with an items list")
        pipeline = tuple(doc["items"])
    return tuple(out), pipeline
