"""Loading from LoongSage checkpoint trees (seed 003, "Model Loading").

Two paths, picked automatically by :func:`load_training_state`:

* from the checkpoint: only the step the tracker file records is resumable.
  It is verified in full (sha256 of every file against MANIFEST.json); a
  tracker that is empty, garbled, or names a missing or unverifiable step is
  an error -- never silently another step;
* from ``hf_model_path``: when there is no tracker (no usable checkpoint).

``hf_model_path`` is required either way (its config.json gives the model
structure). :func:`load_dist_ckpt` reads one concrete ``train_step_<N>/dist_ckpt``
(``ref_dist_ckpt_path``, ``opd.teachers[].dist_ckpt_path``): no tracker, no scan.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.rules import limits
from registry.rules import schemas
from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage_data import DataSourceState, DataStateLookup, read_data_state
from registry.checkpoint.loongsage_format import (
    CONFIG,
    DIST,
    LEGACY_DIST_FILES,
    MODEL,
    OPTIMIZER,
    RNG,
    RNG_TOPOLOGY_KEYS,
    SCHEDULER,
    DistCheckpoint,
    NoTrackerWarning,
    RngSkippedWarning,
    check_topology,
)
from registry.checkpoint.manager import load_safetensors
from registry.checkpoint.tree import CheckpointTree
from registry.errors import (
    CheckpointError,
    DocumentError,
    NoValidCheckpointError,
    NotCommittedError,
    ObjectNotFoundError,
    PointerError,
    TorchUnavailableError,
    UsageError,
)
from registry.protocol.manifest import Manifest
from registry.formats.safetensors_io import check_optimizer_state
from registry.store import Store, join, open_store
from registry.protocol.verify import read_manifest, verify_directory, verify_entries
from registry.formats.weights import INDEX, SINGLE, iter_tensors, load_weights


@dataclass(frozen=True, slots=True)
class TrainingState(DataStateLookup):
    """What a training run starts from.

    Attributes:
        source: ``"checkpoint"`` (resumed from the tracked step) or ``"hf"``
            (initialized from ``hf_model_path``).
        step: the resumed step; 0 for a run initialized from HF weights.
        path: URL of the step directory or of ``hf_model_path``.
        hf_config: ``hf_model_path``'s config.json.
        model: parameter name -> array (F32).
        optimizer_state, optimizer, scheduler_state: None from HF.
        rng_state: the saved RNG state, or None (from HF, or skipped because the
            TP/PP sizes changed; ``rng_restored`` says which).
        saved_topology: the sizes recorded at save time (None from HF).
        data_sources: one per requested ``prompt_data_path``, in the order asked.
        manifest: the step's manifest (None from HF).
        pipeline_buf: the in-flight items a fully_async save captured with
            ``snapshot_pipeline_buf()``, to be fed back first (None: none saved).
    """

    source: str
    step: int
    path: str
    hf_config: dict[str, Any]
    model: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray] | None
    optimizer: str | None
    scheduler_state: Any
    rng_state: Any
    rng_restored: bool
    saved_topology: dict[str, int] | None
    data_sources: tuple[DataSourceState, ...]
    manifest: Manifest | None
    pipeline_buf: tuple[Any, ...] | None = None


def _open(store: str | os.PathLike[str] | Store) -> Store:
    return store if isinstance(store, Store) else open_store(os.fspath(store))


def load_training_state(store: str | Store, checkpoint_path: str = "", *,
                        hf_model_path: str | os.PathLike[str] | Store | None = None,
                        data_sources: Iterable[str | Mapping[str, Any]] = (),
                        topology: Mapping[str, int] | None = None) -> TrainingState:
    """Pick the loading path and load (seed 003 section 3).

    Args:
        store, checkpoint_path: the store and the tree's key in it (``""``: root).
        hf_model_path: folder or URL of the HF model (config.json, and weights
            as model.safetensors or a sharded model.safetensors.index.json).
            Required on both paths.
        data_sources: this run's ``prompt_data_path`` values (or dicts holding
            one), in any order.
        topology: this run's ``{"tp", "pp", "ep", "dp"}`` sizes (missing: 1).

    Raises:
        UsageError: no hf_model_path; a bad topology or data source list.
        DocumentError: hf_model_path has no valid config.json (or weights, on
            the HF path).
        PointerError: the tracker is empty or not a step number.
        NoValidCheckpointError: the tracked step is missing or does not verify.
        CheckpointError: the tracked step has no loadable dist_ckpt.
        TorchUnavailableError: the step holds ``.pt`` data source files and
            torch (the ``[torch]`` extra) is not installed.

    Warns:
        NoTrackerWarning: step directories exist but there is no tracker.
        RngSkippedWarning: the TP or PP size differs from the saved one.
        DataSourceFreshWarning: a data source has no saved state.
    """
    store = _open(store)
    if hf_model_path is None or (isinstance(hf_model_path, str) and not hf_model_path):
        raise UsageError("hf_model_path is required: both loading paths (checkpoint "
                         "and HF) read its config.json for the model structure")
    hf_store = _open(hf_model_path)
    hf_config = _hf_config(hf_store)
    topo = check_topology(topology, what="topology")
    paths = _source_paths(data_sources)
    tree = CheckpointTree(store, checkpoint_path, LOONGSAGE)
    tracker = store.url_of(tree.pointer_key)
    try:
        step = None if _store_is_new(store) else tree.latest()
    except PointerError as e:
        raise PointerError(e.path, f"{e.rule}; only the step the tracker records is "
                                   "resumable, so no other step is tried") from None
    if step is None:
        if not _store_is_new(store) and tree.steps():
            warnings.warn(f"{tracker}: no tracker file, so none of the step directories of "
                          f"{store.url_of(tree.root)} is resumable; initializing from "
                          f"hf_model_path {hf_store.url}", NoTrackerWarning, stacklevel=2)
        return TrainingState("hf", 0, hf_store.url, hf_config, _hf_weights(hf_store),
                             None, None, None, None, False, None,
                             tuple(DataSourceState(p, None, None) for p in paths), None)
    prefix = tree.prefix(step)
    manifest = _verified_step(tree, step, tracker)
    dist = _read_dist(store, prefix, manifest, step, optimizer=True)
    changed = {k: (dist.topology[k], topo[k]) for k in RNG_TOPOLOGY_KEYS
               if dist.topology[k] != topo[k]}
    why = ""
    if changed:
        what = ", ".join(f"{k.upper()} {a} -> {b}" for k, (a, b) in changed.items())
        why = f"parallel topology changed since the save ({what})"
    elif not dist.rng_saved:
        why = "the checkpoint holds no RNG state"
    if why:
        warnings.warn(f"{store.url_of(prefix)}: {why}: RNG state is not restored; model, "
                      "optimizer, scheduler and data source state are", RngSkippedWarning,
                      stacklevel=2)
    data, pipeline = read_data_state(store, prefix, manifest, paths)
    return TrainingState("checkpoint", step, store.url_of(prefix), hf_config, dist.model,
                         dist.optimizer_state, dist.optimizer, dist.scheduler_state,
                         None if why else dist.rng_state, not why, dist.topology,
                         data, manifest, pipeline)


def load_dist_ckpt(store: str | Store, path: str = "", *,
                   optimizer: bool = False) -> DistCheckpoint:
    """Read one concrete ``train_step_<N>/dist_ckpt`` directory (a reference
    model's ``ref_dist_ckpt_path``, an OPD teacher's ``dist_ckpt_path``).

    The tracker is not read and no step is picked: ``path`` names the step.
    Every ``dist_ckpt/`` file is verified (size and sha256) against the step
    directory's MANIFEST.json before it is read.

    Args:
        store: the store, and ``path`` the directory's key in it; or, with
            ``path`` empty, the directory's folder path or URL.
        optimizer: read the optimizer state too (a reference model needs none).

    Raises:
        UsageError: ``path`` is not a ``train_step_<N>/dist_ckpt`` directory.
        NoValidCheckpointError: the step has no manifest, or a file does not verify.
        CheckpointError: the manifest lists no dist_ckpt.
    """
    if not path:
        if isinstance(store, Store):
            raise UsageError("load_dist_ckpt: name the train_step_<N>/dist_ckpt directory")
        url = os.fspath(store).rstrip("/")
        base, _, path = url.rpartition("/")
        base, _, stepdir = base.rpartition("/")
        path = f"{stepdir}/{path}"
        store = open_store(base or ".")
    store = _open(store)
    key = path.strip("/")
    parts = key.split("/")
    step = LOONGSAGE.parse_dir(parts[-2]) if len(parts) >= 2 and parts[-1] == DIST else None
    if step is None:
        hint = (" (it is a checkpoint_path: it holds the tracker file)"
                if store.exists(join(key, LOONGSAGE.pointer)) else "")
        raise UsageError(f"{store.url_of(key)}: must name one concrete "
                         f"train_step_<N>/{DIST} directory{hint}; the tracker file is not "
                         "read and no step is picked")
    prefix = "/".join(parts[:-1])
    try:
        manifest = read_manifest(store, prefix)
    except NotCommittedError as e:
        raise NoValidCheckpointError(f"{e} (a tree written without manifests can be "
                                     "adopted: registry ckpt adopt)") from None
    _verify_entries(store, prefix, manifest, f"{DIST}/")
    return _read_dist(store, prefix, manifest, step, optimizer=optimizer)


# -- helpers ---------------------------------------------------------------------------


def _store_is_new(store: Store) -> bool:
    """A local store whose folder does not exist yet: a brand-new run's
    (seed 003 section 3: no usable checkpoint, so the HF path), not the
    mistyped store a reader is otherwise told about."""
    root = store.local_path("")
    return root is not None and not os.path.isdir(root)


def _source_paths(data_sources: Iterable[str | Mapping[str, Any]]) -> list[str]:
    paths = []
    for i, ds in enumerate(data_sources):
        p = ds.get("prompt_data_path") if isinstance(ds, Mapping) else ds
        if not isinstance(p, str) or not p:
            raise UsageError(f"data source {i}: needs a non-empty prompt_data_path")
        if p in paths:
            raise UsageError(f"data source {i}: prompt_data_path {p!r} given twice")
        paths.append(p)
    return paths


def _verified_step(tree: CheckpointTree, step: int, tracker: str) -> Manifest:
    store, prefix = tree.store, tree.prefix(step)
    never = "only the tracked step is resumable, so no other step is tried"
    if step not in tree.steps():
        raise NoValidCheckpointError(f"{tracker} records step {step}, but "
                                     f"{store.url_of(prefix)} does not exist; {never}")
    report = verify_directory(store, prefix, full=True)
    if report.error is not None:
        hint = (" (a tree written without manifests can be adopted: registry ckpt adopt)"
                if isinstance(report.error, NotCommittedError) else "")
        raise NoValidCheckpointError(f"{tracker} records step {step}, but {report.error}"
                                     f"{hint}; {never}")
    if report.problems:
        raise NoValidCheckpointError(f"{tracker} records step {step}, but "
                                     f"{store.url_of(prefix)} does not verify: "
                                     f"{report.problems[0]}; {never}")
    assert report.manifest is not None
    return report.manifest


def _verify_entries(store: Store, prefix: str, manifest: Manifest, under: str) -> None:
    entries = [e for e in manifest.files if e.path.startswith(under)]
    sizes = {under + rel: n for rel, n in store.walk_files(join(prefix, under)).items()}
    # Piece by piece on every core where the manifest has piece states.
    problems = verify_entries(store, prefix, entries, full=True, sizes=sizes)
    if problems:
        raise NoValidCheckpointError(f"{store.url_of(prefix)} does not verify: {problems[0]}")


def _json_file(store: Store, prefix: str, rel: str) -> Any:
    return schemas.load_json(store.read_bytes(join(prefix, rel), limit=limits.MAX_JSON_BYTES),
                             path=store.url_of(join(prefix, rel)))


def _read_dist(store: Store, prefix: str, manifest: Manifest, step: int, *,
               optimizer: bool) -> DistCheckpoint:
    url = store.url_of(join(prefix, DIST))
    if manifest.entry(f"{DIST}/.metadata") is not None:  # torch_dist: DCP shards
        try:
            import torch  # noqa: F401 - loongsage_dcp_read may be imported already
            from registry.checkpoint.loongsage_dcp_read import read_dist
        except ImportError:
            raise TorchUnavailableError(f"{url}: torch_dist shards (torch.distributed."
                                        "checkpoint); reading them needs PyTorch: pip install "
                                        "'modeldir-registry[torch]'") from None
        return read_dist(store, prefix, manifest, step, optimizer=optimizer)
    # a tree written by an earlier version of the single-process saver
    lacking = [n for n in LEGACY_DIST_FILES if manifest.entry(f"{DIST}/{n}") is None]
    if len(lacking) == len(LEGACY_DIST_FILES):
        raise CheckpointError(f"{url}/.metadata: not in the step's MANIFEST.json; this step "
                              "has no dist_ckpt to load (saved with save_checkpoint off?)")
    if lacking:
        raise CheckpointError(f"{url}/{lacking[0]}: not in the step's MANIFEST.json; an "
                              "earlier version's dist_ckpt needs "
                              f"{', '.join(LEGACY_DIST_FILES)}, so this step cannot be loaded")
    model, _ = load_safetensors(store, prefix, manifest, f"{DIST}/{MODEL}")
    opt = opt_name = None
    if optimizer:
        opt, meta = load_safetensors(store, prefix, manifest, f"{DIST}/{OPTIMIZER}")
        opt_name = meta.get("optimizer", "")
        check_optimizer_state(opt, {k: v.shape for k, v in model.items()}, optimizer=opt_name,
                              path=f"{url}/{OPTIMIZER}")
    sched = _json_file(store, prefix, f"{DIST}/{SCHEDULER}")
    rng = _json_file(store, prefix, f"{DIST}/{RNG}")
    for doc, name, key in ((sched, SCHEDULER, "scheduler_state"), (rng, RNG, "rng_state")):
        if not isinstance(doc, dict) or key not in doc:
            raise DocumentError(f"{url}/{name}", f"must be a JSON object with {key!r}")
    try:
        topology = check_topology(rng.get("topology"), what=f"{url}/{RNG}")
    except UsageError as e:
        raise DocumentError(f"{url}/{RNG}", str(e)) from None
    return DistCheckpoint(step, url, manifest, model, opt, opt_name, sched["scheduler_state"],
                          rng["rng_state"], topology)


def _data_sources(store: Store, prefix: str, manifest: Manifest,
                  paths: list[str]) -> tuple[DataSourceState, ...]:
    """The data source states of a verified step, in the order of ``paths``
    (the multi-rank resume reads these; the pipeline buffer: read_data_state)."""
    return read_data_state(store, prefix, manifest, paths)[0]


def _hf_config(hf: Store) -> dict[str, Any]:
    try:
        data = hf.read_bytes(CONFIG)
    except ObjectNotFoundError:
        raise DocumentError(hf.url_of(CONFIG), "missing: hf_model_path must hold the HF "
                                               "config.json (it gives the model structure)"
                            ) from None
    doc = schemas.load_json(data, path=hf.url_of(CONFIG))
    if not isinstance(doc, dict):
        raise DocumentError(hf.url_of(CONFIG), "must be a JSON object")
    return doc


def _hf_weights(hf: Store) -> dict[str, np.ndarray]:
    """The HF model's weights as F32: model.safetensors, or the shards a
    model.safetensors.index.json names, under the rule of :mod:`registry.formats.weights`
    (a stale shard beside them, a tensor in two shards... are refused)."""
    files = hf.walk_files("")
    if SINGLE not in files and INDEX not in files:
        raise DocumentError(hf.url_of(MODEL), "missing: no usable checkpoint, so the "
                                              "initial weights come from hf_model_path")
    weights = load_weights(hf, "", files=files)
    tensors = {name: array for _, name, array in iter_tensors(hf, "", weights)}
    return {k: np.asarray(v, dtype=np.float32) if v.dtype.kind == "f" or
            v.dtype.name == "bfloat16" else v for k, v in tensors.items()}
