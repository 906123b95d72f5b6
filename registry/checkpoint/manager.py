"""CheckpointManager: save (sync or async), resume and retention for one run.

Implements seed 000, "Checkpoint step directory", "Writing atomically" and
"Resuming", on any store (local disk with atomic rename; S3 and memory with
the manifest as commit marker)::

    runs/<run_id>/ckpt/step-<nnnnnn>/{model.safetensors, optimizer.safetensors,
        config.json, tokenizer.json?, generation_config.json?, trainer_state.json,
        MANIFEST.json}
    runs/<run_id>/ckpt/LATEST              "step-000500\\n"
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.rules import limits
from registry.rules import numbers
from registry.rules import schemas
from registry.checkpoint.layout import TINYLLM, Layout
from registry.checkpoint.retention import RetentionPolicy
from registry.checkpoint.lease import DEFAULT_SECONDS, WriterLease
from registry.checkpoint.state import (
    config_dict,
    encode_json,
    read_file_or_doc,
    snapshot_f32,
    validate_save_inputs,
)
from registry.checkpoint.tree import CheckpointSkippedWarning, CheckpointTree
from registry.protocol.commit import DirectoryWriter
from registry.errors import (
    CheckpointError,
    NoValidCheckpointError,
    SafetensorsError,
    SchemaValidationError,
)
from registry.protocol.layout import run_root, staging_prefix
from registry.protocol.manifest import Manifest, utc_now
from registry.rules.names import check_name
from registry.host.pools import HelperPool
from registry.formats.safetensors_io import (
    MAX_HEADER_BYTES,
    check_optimizer_state,
    read_safetensors,
    write_safetensors,
)
from registry.store import Store, join, open_store


@dataclass(frozen=True, slots=True)
class SaveResult:
    """A landed checkpoint: its step, key, manifest digest, bytes and seconds."""

    step: int
    path: str
    manifest_sha256: str
    bytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class ResumeState:
    """What :meth:`CheckpointManager.resume` loaded from one verified step.

    Attributes:
        model: parameter name -> F32 array, shapes as saved.
        optimizer_state: ``<param>.exp_avg`` ... -> F32 array.
        optimizer: ``adamw``, ``sgd`` or ``muon`` (from the file's metadata).
        trainer_state: the validated ``trainer_state.json`` document.
        config: ``config.json`` as a dict.
    """

    step: int
    path: str
    manifest: Manifest
    model: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    optimizer: str
    trainer_state: dict[str, Any]
    config: dict[str, Any]
    generation_config: dict[str, Any] | None
    tokenizer: bytes | None


def write_safetensors_file(w: DirectoryWriter, relpath: str, tensors: Mapping[str, Any],
                           metadata: dict[str, str]) -> None:
    """Stream one safetensors file into a staged directory, hashed as written.
    The file's size is bounded up front (the tensors' bytes plus the header's
    limit), so an object store sizes every part alike."""
    bound = 8 + MAX_HEADER_BYTES + sum(int(getattr(t, "nbytes", 0)) for t in tensors.values())
    with w.open(relpath, size=bound) as f:
        write_safetensors(f, tensors, metadata=metadata, path=relpath)


def load_safetensors(store: Store, prefix: str, manifest: Manifest,
                     relpath: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a listed safetensors file; the header is validated before any tensor."""
    entry = manifest.entry(relpath)
    if entry is None:
        raise CheckpointError(f"{store.url_of(prefix)}: {relpath} is not in MANIFEST.json")
    with store.open_read(join(prefix, relpath)) as f:
        return read_safetensors(f, path=store.url_of(join(prefix, relpath)),
                                file_size=entry.size)

#: writes the model file beside the optimizer file (see ``_write``).
_FILE_WRITERS = HelperPool(4, "ckpt-file")


class CheckpointManager:
    """Saves and resumes the checkpoints of one training run.

    Args:
        store_url: store URL (or an open Store).
        run_id: the run; checkpoints live under ``runs/<run_id>/ckpt/``.
        keep_ckpts: the spec's ``keep_ckpts``: committed steps kept after each
            save (``<= 0``: keep all).
        progress_file: local JSON Lines file; one ``{"kind": "ckpt", ...}``
            event is appended after LATEST moved (seed step 5).
        async_save: ``save()`` returns once the arrays are snapshotted; the
            write happens on one background thread.
        background_delete: retention (deleting the steps beyond
            ``keep_ckpts``) runs on a background thread after LATEST moved,
            instead of inside the save (Orbax's ``enable_background_delete``).
            A sync ``save()`` then returns once the step is committed and
            LATEST names it; the deletion finishes before the next save starts
            writing, before ``resume`` and in ``close``. A deletion error is
            raised by the next ``poll``/``save``/``resume``/``close``.
        lease_seconds: duration of the run's writer lease
            (:mod:`registry.checkpoint.lease`), renewed by every save and every
            third of it while a save writes.

    Raises:
        InvalidNameError: ``run_id`` breaks the naming rule.

    Notes:
        At most one save is in flight. A failed async save never moves LATEST;
        its exception is raised by the next ``poll``/``wait``/``save`` (that
        ``save`` is then not scheduled), and later saves work.

        A run has one writer at a time: the first ``save`` takes the run's
        writer lease (``runs/<run_id>/ckpt/WRITER.lease``), ``close`` releases
        it. A second manager of the same run (a preempted job's zombie, a
        launcher started twice) gets RunLeasedError, a CommitConflictError
        naming the holder, from ``save`` before it writes anything; a writer
        whose lease lapsed and was taken over gets the same error from every
        later save (it is fenced off). Under the lease it removes the stale
        staging directories and claims its predecessors left. Staging
        directories are writer-unique (``step-<n>.tmp-<owner>``), and LATEST
        moves only to a step whose MANIFEST.json is the one this writer
        committed and whose files all exist with their sizes, checked just
        before the move.
    """

    def __init__(self, store_url: str | Store, run_id: str, *, keep_ckpts: int,
                 progress_file: str | os.PathLike[str] | None = None,
                 async_save: bool = True, background_delete: bool = False,
                 layout: Layout = TINYLLM, root: str | None = None,
                 lease_seconds: float = DEFAULT_SECONDS,
                 retention: RetentionPolicy | None = None) -> None:
        self.store = store_url if isinstance(store_url, Store) else open_store(store_url)
        self.retention = retention  # rules beside keep_ckpts (registry.checkpoint.retention)
        self.run_id = check_name(run_id, "run_id")
        self.store.ensure_root()  # a new run may be the first writer of a new store
        self.keep_ckpts = keep_ckpts
        self.progress_file = progress_file
        self.async_save = async_save
        self.tree = CheckpointTree(self.store, run_root(run_id) if root is None else root,
                                   layout)
        self.lease = WriterLease(self.store, self.tree.root, seconds=lease_seconds)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-save")
        self._pending: Future[SaveResult] | None = None
        self.background_delete = background_delete
        self._deleter: ThreadPoolExecutor | None = None
        self._deleting: Future[None] | None = None
        self._spare: dict[str, dict[str, np.ndarray]] = {}
        #: called with the SaveResult after LATEST moved (the index hooks in here).
        self.on_commit: list[Callable[[SaveResult], None]] = []
        #: called with the steps retention deleted after each save.
        self.on_retain: list[Callable[[list[int]], None]] = []

    # -- saving ------------------------------------------------------------------

    def save(self, step: int, model_tensors: Mapping[str, Any],
             optimizer_state: Mapping[str, Any], *, optimizer: str,
             config: Mapping[str, Any] | str | bytes, trainer_state: Mapping[str, Any],
             tokenizer: Any = None, generation_config: Mapping[str, Any] | None = None,
             ) -> Future[SaveResult]:
        """Save ``step``; returns a Future of its SaveResult (done when sync).

        Args:
            step: the optimizer step (``step-<nnnnnn>``, six digits at least).
            model_tensors: parameter name -> array (numpy, or torch), any float
                dtype; stored as F32 master weights.
            optimizer_state: AdamW ``<name>.exp_avg``/``<name>.exp_avg_sq``, SGD
                or Muon ``<name>.momentum_buffer``; shapes as the parameter's.
            optimizer: ``"adamw"``, ``"sgd"`` or ``"muon"``.
            config: the model config, a dict or JSON text kept verbatim.
            trainer_state: trainer-state.schema.json document; its ``step`` must
                equal ``step``.
            tokenizer: tokenizer.json as a path, JSON text/bytes or dict;
                required when config says ``"tl_tokenizer": "file"``.
            generation_config: generation-config.schema.json document.

        Raises:
            CheckpointError, SchemaValidationError, SafetensorsError: bad input;
                nothing is written.
            RunLeasedError: another process is the run's writer (or took the
                run over from this one); nothing is written.
            CheckpointExistsError: the step is already committed at or before
                LATEST (both a CommitConflictError and a CheckpointError).
            CommitConflictError: another writer committed the step first;
                LATEST did not move.
            InsufficientSpaceError: the disk filled up; nothing committed.
            Any error of the previous async save, which is then cleared.
        """
        where = self.store.url_of(self.tree.prefix(step) if isinstance(step, int) and step >= 0
                                  else self.tree.root)
        config_bytes = encode_json(config, what=f"{where}/config.json")
        config_doc = config_dict(config_bytes, what=f"{where}/config.json")
        tok = (read_file_or_doc(tokenizer, what=f"{where}/tokenizer.json")
               if tokenizer is not None else None)
        self.wait()  # at most one save in flight; raises a previous failure
        # The previous save has landed (wait() above): its snapshot buffers are free.
        model = snapshot_f32(model_tensors, what=f"{where}/model.safetensors",
                             copy=self.async_save, reuse=self._spare.get("model"))
        opt = snapshot_f32(optimizer_state, what=f"{where}/optimizer.safetensors",
                           copy=self.async_save, reuse=self._spare.get("optimizer"))
        if self.async_save:
            self._spare = {"model": model, "optimizer": opt}
        state = numbers.plain_copy(trainer_state, path=f"{where}/trainer_state.json")
        gen = (numbers.plain_copy(generation_config, path=f"{where}/generation_config.json")
               if generation_config else None)
        validate_save_inputs(step, model, opt, optimizer=optimizer, config=config_doc,
                             trainer_state=state, has_tokenizer=tok is not None,
                             generation_config=gen, where=where)
        self.lease.hold()  # one writer per run, checked before any byte is written
        job = (step, model, opt, optimizer, config_bytes, state, tok, gen)
        if self.async_save:
            self._pending = self._pool.submit(self._write, *job)
            return self._pending
        done: Future[SaveResult] = Future()
        done.set_result(self._write(*job))
        return done

    def _write(self, step: int, model: dict[str, np.ndarray], opt: dict[str, np.ndarray],
               optimizer: str, config: bytes, state: dict[str, Any], tokenizer: bytes | None,
               gen: dict[str, Any] | None) -> SaveResult:
        with self.lease.renewing():
            return self._write_leased(step, model, opt, optimizer, config, state,
                                      tokenizer, gen)

    def _write_leased(self, step: int, model: dict[str, np.ndarray],
                      opt: dict[str, np.ndarray], optimizer: str, config: bytes,
                      state: dict[str, Any], tokenizer: bytes | None,
                      gen: dict[str, Any] | None) -> SaveResult:
        t0 = time.perf_counter()
        self._finish_delete()  # retention must not race this save's staging
        prefix = self.tree.prefix(step)
        self.tree.clear_for_save(step)
        # Writer-unique, so that no other writer's cleanup can remove it.
        staging = staging_prefix(prefix, self.lease.owner[:12]) if self.store.atomic_rename else None
        with DirectoryWriter(self.store, prefix, kind="checkpoint",
                             meta={"run_id": self.run_id, "step": step}, staging=staging,
                             sole_writer=True) as w:
            # The two big files are written (and hashed) at once, one per core.
            model_written = _FILE_WRITERS.submit(
                write_safetensors_file, w, "model.safetensors", model, {"format": "pt"})
            try:
                write_safetensors_file(w, "optimizer.safetensors", opt,
                                       {"format": "tinyllm", "optimizer": optimizer,
                                        "step": str(step)})
            finally:
                model_written.result()
            w.write_bytes("config.json", config)
            if tokenizer is not None:
                w.write_bytes("tokenizer.json", tokenizer)
            if gen is not None:
                w.write_json("generation_config.json", gen)
            w.write_json("trainer_state.json", state)
            manifest = w.commit()
        self.lease.hold()  # still this run's writer, just before the pointer moves
        self.tree.set_latest(step, manifest_sha256=manifest.digest)
        result = SaveResult(step, self.store.url_of(prefix), manifest.digest,
                            manifest.total_size, time.perf_counter() - t0)
        self._emit(result)
        for hook in self.on_commit:
            hook(result)
        if self.background_delete:
            if self._deleter is None:
                self._deleter = ThreadPoolExecutor(max_workers=1,
                                                   thread_name_prefix="ckpt-delete")
            self._deleting = self._deleter.submit(self._retain)
        else:
            self._retain()
        return result

    def _retain(self) -> None:
        deleted = self.tree.retain_or_warn(self.keep_ckpts, writer=self.lease.owner,
                                           policy=self.retention)
        steps = [s for s in (self.tree.layout.parse_dir(k.rsplit("/", 1)[-1]) for k in deleted)
                 if s is not None]
        for retained in self.on_retain:
            retained(steps)

    def _finish_delete(self) -> None:
        """Wait for a background retention; raise its error (then cleared)."""
        deleting, self._deleting = self._deleting, None
        if deleting is not None:
            deleting.result()

    def _emit(self, r: SaveResult) -> None:
        if self.progress_file is None:
            return
        event = {"kind": "ckpt", "time": utc_now(), "run_id": self.run_id, "step": r.step,
                 "path": r.path, "manifest_sha256": r.manifest_sha256, "bytes": r.bytes,
                 "seconds": round(r.seconds, 6)}
        with open(self.progress_file, "a", encoding="utf-8") as f:
            f.write(numbers.dumps(event) + "\n")
            f.flush()

    def poll(self) -> bool:
        """Finalize a landed async save without blocking.

        Returns:
            True when no save is in flight any more.

        Raises:
            The landed save's exception, if it failed.
        """
        deleting = self._deleting
        if deleting is not None and deleting.done():
            self._finish_delete()
        pending = self._pending
        if pending is None:
            return True
        if not pending.done():
            return False
        self._pending = None
        pending.result()
        return True

    def wait(self) -> SaveResult | None:
        """Block until the in-flight save has landed; raise its error if it failed."""
        pending, self._pending = self._pending, None
        return pending.result() if pending is not None else None

    def close(self) -> None:
        """Flush the in-flight save (raising its error), stop the worker and
        release the run's writer lease."""
        try:
            self.wait()
        finally:
            try:
                self._finish_delete()
            finally:
                self._pool.shutdown(wait=True)
                if self._deleter is not None:
                    self._deleter.shutdown(wait=True)
                self.lease.release()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resuming ----------------------------------------------------------------

    def resume(self, path: str | None = None) -> ResumeState:
        """Load the newest checkpoint that verifies (seed 000 "Resuming").

        Args:
            path: a step directory: its name (``step-000120``, in this run),
                its key in the store, or its URL or local path, in this run or
                any other tree of the same layout -- the directory given is
                the one loaded, never a same-named step of this run. None:
                the directory LATEST names.

        Returns:
            The ResumeState of the first candidate that verifies (sha256 of
            every file against MANIFEST.json) and whose files keep their
            format (optimizer state complete, trainer_state.json valid),
            trying older steps of the same tree after a warning
            (CheckpointSkippedWarning) naming each skipped step and why.
            When LATEST named a step that does not verify, LATEST is moved
            back (compare-and-swap) to the step resumed from, so it always
            names a complete checkpoint.

        Raises:
            NoValidCheckpointError: no step verifies.
            CheckpointError: ``path`` names no step directory.
            SafetensorsError, SchemaValidationError: only through
                NoValidCheckpointError's reasons (a step breaking its format
                is skipped like one that does not verify).
        """
        self.wait()
        self._finish_delete()
        tree, start = (self.tree, None) if path is None else self._tree_of(path)
        skipped: list[str] = []
        while True:
            try:
                step, manifest = tree.resumable(start)
            except NoValidCheckpointError as e:
                if skipped:
                    raise NoValidCheckpointError(
                    f"{e}; also skipped: {'; '.join(skipped)}") from None
                raise
            try:
                state = self.load(step, manifest, tree=tree)
            except (SafetensorsError, SchemaValidationError, CheckpointError) as e:
                reason = f"{tree.layout.step_dir(step)}: {e}"
                skipped.append(reason)
                warnings.warn(f"skipping {reason}", CheckpointSkippedWarning, stacklevel=2)
                older = [s for s in tree.steps() if s < step]
                if not older:
                    raise NoValidCheckpointError(
                        f"{tree.store.url_of(tree.root)}: no checkpoint verifies: "
                        f"{'; '.join(skipped)}") from None
                start = max(older)
                continue
            if path is None:
                self.tree.reset_latest(step)
            return state

    def _tree_of(self, path: str) -> tuple[CheckpointTree, int]:
        """The tree holding the step directory ``path``, and its step.

        Raises:
            CheckpointError: the last segment is not a step directory name, or
                the directory does not exist.
        """
        parent, _, name = path.rstrip("/").rpartition("/")
        step = self.tree.layout.parse_dir(name)
        if step is None:
            raise CheckpointError(f"{path}: not a step directory "
                                  f"({self.tree.layout.dir_format})")
        own = {self.tree.root, self.store.url_of(self.tree.root).rstrip("/")}
        local_root = self.store.local_path(self.tree.root)
        if local_root is not None:
            own.add(os.path.abspath(local_root))
        if not parent or parent in own or (
                "://" not in parent and os.path.isabs(parent)
                and os.path.abspath(parent) in own):
            tree = self.tree
        elif "://" in parent or os.path.isabs(parent):
            if "://" not in parent and not os.path.isdir(parent):
                # a missing local folder is no store to open (that is exit 6)
                raise CheckpointError(f"{path}: no such step directory (no folder {parent})")
            tree = CheckpointTree(open_store(parent), "", self.tree.layout)
        else:
            tree = CheckpointTree(self.store, parent, self.tree.layout)
        if not tree.store.exists(tree.prefix(step)) and step not in tree.steps():
            raise CheckpointError(f"{path}: no such step directory "
                                  f"({tree.store.url_of(tree.prefix(step))})")
        return tree, step

    def load(self, step: int, manifest: Manifest, *,
             tree: CheckpointTree | None = None) -> ResumeState:
        """Read the files of a verified step directory of ``tree`` (default: this run's).

        Raises:
            SafetensorsError: a weights or optimizer file breaks its format, or
                the optimizer state is incomplete.
            SchemaValidationError, DocumentError: trainer_state.json or
                config.json is invalid.
        """
        tree = tree or self.tree
        store = tree.store
        prefix = tree.prefix(step)
        url = store.url_of(prefix)
        model, _ = load_safetensors(store, prefix, manifest, "model.safetensors")
        opt, meta = load_safetensors(store, prefix, manifest, "optimizer.safetensors")
        optimizer = meta.get("optimizer", "")
        check_optimizer_state(opt, {k: v.shape for k, v in model.items()}, optimizer=optimizer,
                              path=f"{url}/optimizer.safetensors")
        state = schemas.load_json(store.read_bytes(join(prefix, "trainer_state.json"),
                                                  limit=limits.MAX_JSON_BYTES),
                                  path=f"{url}/trainer_state.json")
        schemas.validate(state, "trainer-state", path=f"{url}/trainer_state.json")
        config = config_dict(store.read_bytes(join(prefix, "config.json"), limit=limits.MAX_JSON_BYTES),
                             what=f"{url}/config.json")
        gen = tok = None
        if manifest.entry("generation_config.json"):
            gen = schemas.load_json(store.read_bytes(join(prefix, "generation_config.json"),
                                                    limit=limits.MAX_JSON_BYTES),
                                    path=f"{url}/generation_config.json")
        if manifest.entry("tokenizer.json"):
            tok = store.read_bytes(join(prefix, "tokenizer.json"))
        return ResumeState(step, url, manifest, model, opt, optimizer, state, config, gen, tok)
