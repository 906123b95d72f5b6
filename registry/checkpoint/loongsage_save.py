"""Saving LoongSage checkpoint trees (seed 003, "Model Saving").

A save writes ``<checkpoint_path>/train_step_<N>/`` (see
:mod:`registry.checkpoint.loongsage_format`) with the registry's commit protocol
(staging + rename locally, claim + manifest on object stores), one
``MANIFEST.json`` for the whole step directory, and only then moves the tracker
``latest_checkpointed_iteration.txt`` to ``N``.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.lease import DEFAULT_SECONDS, WriterLease
from registry.checkpoint.loongsage_data import data_documents
from registry.checkpoint.loongsage_format import (
    CONFIG,
    DIST,
    DIST_FORMAT,
    HF,
    MODEL,
    TOKENIZER,
    check_topology,
    derive_run_id,
)
from registry.checkpoint.manager import write_safetensors_file
from registry.checkpoint.retention import TRAINER_STATE, RetentionPolicy
from registry.checkpoint.preempt import LATE, NONE, PreemptionWatch, Preempted, agree
from registry.checkpoint.state import (
    OPTIMIZERS,
    config_dict,
    encode_json,
    read_file_or_doc,
    snapshot_f32,
)
from registry.checkpoint.tree import CheckpointTree
from registry.protocol.commit import DirectoryWriter
from registry.errors import CheckpointError, TorchUnavailableError, UsageError
from registry.protocol.layout import staging_prefix
from registry.protocol.manifest import Manifest
from registry.rules.names import check_name
from registry.formats.safetensors_io import check_optimizer_state
from registry.store import Store, open_store


@dataclass(frozen=True, slots=True)
class LoongSaveResult:
    """A landed save: its step, URL, manifest, size, write seconds, and whether
    the tracker moved to it (only saves holding ``dist_ckpt/`` are resumable)."""

    step: int
    path: str
    manifest_sha256: str
    bytes: int
    seconds: float
    tracked: bool
    parts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Job:
    step: int
    model: dict[str, np.ndarray] | None
    optimizer: dict[str, np.ndarray] | None
    optimizer_name: str
    docs: dict[str, bytes]
    dcp: tuple[bytes, bytes] | None = None  # (common, rank 0's RNG): JSON


@dataclass(frozen=True, slots=True)
class _Landed:
    step: int
    prefix: str
    manifest: Manifest
    seconds: float


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(doc: Any, *, what: str) -> bytes:
    try:
        return (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False,
                           default=_json_default) + "\n").encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{what}: not JSON-serializable: {e}") from None


class LoongSageCheckpointer:
    """Saves a training run into a LoongSage checkpoint tree (seed 003).

    Args:
        store: store URL or an open Store.
        checkpoint_path: key of the tree in the store (``""``: the store root);
            required, as the seed's table says (None is a UsageError).
        save_freq: ``trainer.save_freq``; a save every that many steps; ``<= 0``
            (default ``-1``): no saving at all, as the seed's table says (the
            final-step rule applies only when saving is on).
        total_steps: the final step; it is always saved when saving is on
            (``save_freq > 0`` and a switch on).
        save_checkpoint: ``trainer.save_checkpoint``: write ``dist_ckpt/`` (and
            ``data_source/``); only such saves move the tracker.
        save_hf: ``trainer.save_hf``: write ``hf_model/`` (needs ``hf_config``).
        async_save: ``trainer.async_save``: the write runs on one background
            thread; the arrays are snapshotted into reused buffers first.
        hf_config: ``config.json`` of the HF export (dict or JSON text, kept verbatim).
        tokenizer: ``tokenizer.json`` of the HF export (path, JSON text or dict).
        topology: parallel sizes ``{"tp", "pp", "ep", "dp"}`` recorded in the
            checkpoint (``common``); they gate the RNG restore on resume.
        keep: committed steps kept (the tracker's always), pruned on the writer
            before each save; ``0`` (default, as the seed): keep all.
        retention: a :class:`~registry.checkpoint.retention.RetentionPolicy`
            (keep last/best-by-metric/every k-th/one per interval, the union;
            ``keep`` > 0 stands for its keep_last), applied on the writer
            thread after each commit and tracker move (in place of ``keep``'s
            pruning before each save); the tracker's step and any step a
            release names are kept.
        save_every_seconds: also save when that many seconds passed since
            the last save landed (a save-decision policy beside
            ``save_freq``; only while saving is on, ``save_freq > 0``); on N
            ranks the ranks agree at every :meth:`maybe_save`.
        run_id: the manifest's ``run_id``; default derived from ``checkpoint_path``.
        lease_seconds: duration of the tree's writer lease
            (:mod:`registry.checkpoint.lease`).
        snapshot_pipeline_buf: fully_async mode (seed 003 4.3): called at each
            save, when :meth:`maybe_save` is called, for the items still in
            flight in the pipeline (a list of tensors and plain values);
            saved as ``data_source/pipeline_buf.pt`` and returned on resume
            as ``TrainingState.pipeline_buf``.

        save_on_preemption: handle ``preemption_signals`` (default SIGTERM)
            from construction to :meth:`finish`: the next :meth:`maybe_save`
            finishes the save in flight, saves that step whatever
            ``save_freq`` says (sync), moves the tracker, releases the lease
            and raises :class:`~registry.checkpoint.preempt.Preempted` (a
            SystemExit, code 143) carrying the step; past ``grace_seconds``
            after the notice it only finishes the save in flight
            (:mod:`registry.checkpoint.preempt`).

    Raises:
        UsageError: bad switches or sizes, or ``save_hf`` without ``hf_config``.

    Notes:
        Call :meth:`on_step_start` at the start of each train step (non-blocking
        finalize of the previous async save: the tracker moves there),
        :meth:`maybe_save` after it, and :meth:`finish` at the end (blocking
        flush). At most one save is in flight. A failed save never moves the
        tracker; its exception is raised by the next finalize.

        A tree has one writer at a time: the first save takes the writer
        lease ``<checkpoint_path>/WRITER.lease``, :meth:`finish` releases it.
        A second checkpointer of the same tree gets RunLeasedError (a
        CommitConflictError naming the holder) from :meth:`maybe_save` before
        it writes anything. Staging directories are writer-unique
        (``train_step_<N>.tmp-<owner>``), and the tracker moves only to a
        step whose MANIFEST.json is the one this writer committed and whose
        files all exist with their sizes, checked just before the move.
    """

    def __init__(self, store: str | Store, checkpoint_path: str | None, *,
                 save_freq: int = -1, total_steps: int, save_checkpoint: bool = True,
                 save_hf: bool = False, async_save: bool = True,
                 hf_config: Mapping[str, Any] | str | bytes | None = None,
                 tokenizer: Any = None, topology: Mapping[str, int] | None = None,
                 keep: int = 0, run_id: str | None = None,
                 lease_seconds: float = DEFAULT_SECONDS,
                 snapshot_pipeline_buf: Callable[[], Iterable[Any]] | None = None,
                 save_on_preemption: bool = False,
                 preemption_signals: Iterable[int] = (signal.SIGTERM,),
                 grace_seconds: float = 60.0,
                 retention: RetentionPolicy | None = None,
                 save_every_seconds: float = 0.0) -> None:
        if checkpoint_path is None:
            raise UsageError("checkpoint_path is required (seed 003: the training model's "
                             "checkpoint base directory)")
        self.snapshot_pipeline_buf = snapshot_pipeline_buf
        self.store = store if isinstance(store, Store) else open_store(store)
        self.store.ensure_root()  # a new run may be the first writer of a new store
        self.tree = CheckpointTree(self.store, checkpoint_path, LOONGSAGE)
        where = self.store.url_of(self.tree.root)
        for name, value in (("save_freq", save_freq), ("total_steps", total_steps),
                            ("keep", keep)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise UsageError(f"{where}: {name} {value!r} must be an integer")
        if total_steps < 1:
            raise UsageError(f"{where}: total_steps {total_steps} must be at least 1")
        self.save_freq, self.total_steps, self.keep = save_freq, total_steps, keep
        self.save_checkpoint, self.save_hf = bool(save_checkpoint), bool(save_hf)
        self.async_save = async_save
        self.topology = check_topology(topology, what=where)
        self.run_id = check_name(run_id, "run_id") if run_id is not None else \
            derive_run_id(self.store, self.tree.root)
        self.hf_config: bytes | None = None
        self.tokenizer: bytes | None = None
        if save_hf:
            if hf_config is None:
                raise UsageError(f"{where}: save_hf needs hf_config (the config.json of "
                                 "the HF export)")
            self.hf_config = encode_json(hf_config, what=f"{where}/{HF}/{CONFIG}")
            doc = config_dict(self.hf_config, what=f"{where}/{HF}/{CONFIG}")
            if tokenizer is not None:
                self.tokenizer = read_file_or_doc(tokenizer, what=f"{where}/{HF}/{TOKENIZER}")
            elif doc.get("tl_tokenizer") == "file":
                raise UsageError(f"{where}/{HF}/{CONFIG}: says \"tl_tokenizer\": \"file\" "
                                 "but no tokenizer was given")
        self.lease = WriterLease(self.store, self.tree.root, seconds=lease_seconds)
        #: the preemption notices' watch (save_on_preemption), else None.
        self.preempt = PreemptionWatch(preemption_signals, grace_seconds=grace_seconds) \
            if save_on_preemption else None
        self._preempt_group: Any = None  # where ranks agree on a notice (DistLoongSage...)
        self.retention = retention
        if not (isinstance(save_every_seconds, (int, float)) and save_every_seconds >= 0):
            raise UsageError(f"save_every_seconds {save_every_seconds!r} must be >= 0")
        self.save_every_seconds = float(save_every_seconds)
        self._last_save = time.monotonic()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loongsage-save")
        self._pending: Future[_Landed] | None = None
        self._buffers: dict[str, dict[str, np.ndarray]] = {}
        #: every save finalized so far, oldest first.
        self.saved: list[LoongSaveResult] = []
        #: called with each LoongSaveResult after it was finalized (tracker moved).
        self.on_commit: list[Callable[[LoongSaveResult], None]] = []

    # -- when ----------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        """Seed 003 4.1: every ``save_freq`` steps, and always the final step;
        never when ``save_freq <= 0`` (the seed's table: "no saving") or when
        both ``save_checkpoint`` and ``save_hf`` are off."""
        if not (self.save_checkpoint or self.save_hf) or self.save_freq <= 0:
            return False
        return step % self.save_freq == 0 or step == self.total_steps

    # -- the training loop's calls --------------------------------------------------

    def on_step_start(self) -> bool:
        """Finalize the previous async save if it has landed, without blocking.

        Returns:
            True when no save is in flight any more.

        Raises:
            The landed save's exception, if it failed (the tracker did not move).
        """
        pending = self._pending
        if pending is None:
            return True
        if not pending.done():
            return False
        self._pending = None
        self._finalize(pending.result())
        return True

    def maybe_save(self, step: int, *, model: Mapping[str, Any] | None = None,
                   optimizer_state: Mapping[str, Any] | None = None,
                   optimizer: str = "adamw", scheduler_state: Any = None,
                   rng_state: Any = None,
                   data_sources: Iterable[Mapping[str, Any]] = (),
                   metrics: Mapping[str, float] | None = None) -> bool:
        """Save ``step`` if :meth:`should_save` says so; returns whether it did.

        Args:
            step: the train step just finished (``train_step_<step>``).
            model: parameter name -> array (numpy or torch, any float dtype; F32 on disk).
            optimizer_state: ``<param>.exp_avg``/``.exp_avg_sq`` (adamw) or
                ``<param>.momentum_buffer`` (sgd, muon); needed with save_checkpoint.
            optimizer: ``"adamw"``, ``"sgd"`` or ``"muon"``.
            scheduler_state, rng_state: JSON-serializable (numpy values become lists).
            data_sources: ``{"prompt_data_path": str, "state": ..., "prompt_buffer":
                [...]}`` per data source, in the run's order (``..._ds<i>.pt``,
                see :mod:`registry.checkpoint.loongsage_data`; needs torch).
            metrics: name -> number (e.g. ``{"loss": 1.9}``), saved as the step's
                ``trainer_state.json`` (``{"step": N, ...}``, not a seed file)
                for retention's keep_best (:mod:`registry.checkpoint.retention`).

        Returns:
            False when no save is due. True once the save is scheduled (async:
            the arrays are snapshotted, the caller may change them at once) or
            written and the tracker moved (sync).

        Raises:
            CheckpointError, SafetensorsError, UsageError: bad input; nothing written.
            TorchUnavailableError: save_checkpoint (dist_ckpt is torch DCP), data
                sources or a pipeline buffer to save, and no torch (the ``[torch]`` extra); nothing written.
            RunLeasedError: another process is the tree's writer (or took it over
                from this one); nothing written.
            Any error of the previous async save.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"step {step!r} must be a non-negative integer")
        preempted, timed = self._decide()
        if not (preempted or timed) and not self.should_save(step):
            return False
        where = self.store.url_of(self.tree.prefix(step))
        if model is None or not model:
            raise CheckpointError(f"{where}: no model parameters given")
        docs = self._documents(step, scheduler_state, rng_state, data_sources, where, metrics)
        dcp_docs = None
        if self.save_checkpoint:
            try:
                import torch  # noqa: F401 - checked before anything is written
            except ImportError:
                raise TorchUnavailableError(
                    f"{where}/{DIST}: writing the torch_dist checkpoint (torch.distributed."
                    "checkpoint) needs torch: pip install 'modeldir-registry[torch]'") from None
            common = {"format": DIST_FORMAT, "step": step, "topology": self.topology,
                      "world_size": 1, "optimizer": optimizer,
                      "optimizer_sharding_type": "fully_reshardable",
                      "rank_order": "tp-ep-dp-pp", "scheduler_state": scheduler_state}
            dcp_docs = (_dumps(common, what=f"{where}/{DIST}: scheduler_state"),
                        _dumps(rng_state, what=f"{where}/{DIST}: rng_state"))
            if optimizer not in OPTIMIZERS:
                raise CheckpointError(f"{where}: optimizer {optimizer!r} is not one of "
                                      f"{', '.join(OPTIMIZERS)}")
            if optimizer_state is None:
                raise CheckpointError(f"{where}: save_checkpoint needs optimizer_state")
        self.wait()  # at most one save in flight; raises a previous failure
        params = self._snapshot("m", model, f"{where}/{DIST}: model")
        opt = None
        if self.save_checkpoint:
            assert optimizer_state is not None
            opt = self._snapshot("o", optimizer_state, f"{where}/{DIST}: optimizer_state")
            check_optimizer_state(opt, {k: v.shape for k, v in params.items()},
                                  optimizer=optimizer, path=f"{where}/{DIST}: optimizer_state")
        self.lease.hold()  # one writer per tree, checked before any byte is written
        job = _Job(step, params, opt, optimizer, docs, dcp_docs)
        return self._dispatch(self._write, job, step, preempted)

    def _dispatch(self, write: Callable[[Any], _Landed], job: Any, step: int,
                  preempted: bool) -> bool:
        """Write ``job`` on the save thread (async_save) or now; preempted: now, then exit."""
        if self.async_save and not preempted:
            self._pending = self._pool.submit(write, job)
        else:
            self._finalize(write(job))
        if preempted:
            self._exit_preempted(step)
        return True

    def _decide(self) -> tuple[bool, bool]:
        """(a preemption notice ends the job at this step, ``save_every_seconds``
        passed since the last save): collective under a process group when
        either is on, so every rank agrees (a notice or a timer reached on
        any rank counts for all). Past the grace period, or with nothing to
        save, the job exits here after the save in flight."""
        if self.preempt is None and not self.save_every_seconds:
            return False, False
        timed = bool(self.save_every_seconds) and (self.save_checkpoint or self.save_hf) \
            and self.save_freq > 0 and time.monotonic() - self._last_save >= self.save_every_seconds
        state, due = agree([self.preempt.state() if self.preempt else NONE, int(timed)],
                           self._preempt_group)
        if state == NONE:
            return False, bool(due)
        if state == LATE or not (self.save_checkpoint or self.save_hf):
            self._exit_preempted(None)
        return True, bool(due)

    def _exit_preempted(self, step: int | None) -> NoReturn:
        assert self.preempt is not None
        signum = self.preempt.signum
        self.finish()  # the save in flight lands and is tracked; lease released
        raise Preempted(step, signum)

    def wait(self) -> LoongSaveResult | None:
        """Blocking flush: wait for the in-flight save and finalize it.

        Returns:
            The newest finalized save, or None when there is none.
        """
        pending, self._pending = self._pending, None
        if pending is not None:
            self._finalize(pending.result())
        return self.saved[-1] if self.saved else None

    def finish(self) -> LoongSaveResult | None:
        """End of training: blocking flush (raising a failed save's error), then
        stop the writer thread and release the snapshot buffers."""
        try:
            return self.wait()
        finally:
            self._pool.shutdown(wait=True)
            self._buffers.clear()
            self.lease.release()
            if self.preempt is not None:
                self.preempt.close()

    close = finish

    def __enter__(self) -> LoongSageCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    # -- internals -------------------------------------------------------------------

    def _documents(self, step: int, scheduler_state: Any, rng_state: Any,
                   data_sources: Iterable[Mapping[str, Any]], where: str,
                   metrics: Mapping[str, float] | None = None) -> dict[str, bytes]:
        docs: dict[str, bytes] = {}
        if metrics:
            docs[TRAINER_STATE] = _dumps({**dict(metrics), "step": step},
                                         what=f"{where}/{TRAINER_STATE}: metrics")
        if self.save_checkpoint:
            pipeline = self.snapshot_pipeline_buf() if self.snapshot_pipeline_buf else None
            docs.update(data_documents(data_sources, pipeline, where=where))
        return docs

    def _snapshot(self, tag: str, tensors: Mapping[str, Any], what: str) -> dict[str, np.ndarray]:
        """F32 C-contiguous arrays: async, copies into buffers reused from save to
        save (safe: the previous save has landed); sync, views where possible."""
        out = snapshot_f32(tensors, what=what, copy=self.async_save,
                           reuse=self._buffers.get(tag))
        if self.async_save:
            self._buffers[tag] = out
        return out

    def _write(self, job: _Job) -> _Landed:
        with self.lease.renewing():
            return self._write_leased(job)

    def _write_leased(self, job: _Job) -> _Landed:
        t0 = time.perf_counter()
        prefix = self.tree.prefix(job.step)
        if self.keep > 0 and self.retention is None:
            self.tree.retain_or_warn(self.keep, writer=self.lease.owner)
        self.tree.clear_for_save(job.step)
        # Writer-unique, so that no other writer's cleanup can remove it.
        staging = staging_prefix(prefix, self.lease.owner[:12]) if self.store.atomic_rename else None
        with DirectoryWriter(self.store, prefix, kind="checkpoint",
                             meta={"run_id": self.run_id, "step": job.step,
                                   "layout": LOONGSAGE.name},
                             staging=staging, sole_writer=True) as w:
            if self.save_checkpoint:
                assert job.model is not None and job.dcp is not None
                # the one dist_ckpt format, at one rank (DESIGN section 1)
                from registry.checkpoint.loongsage_torchdist import one_rank_state, write_dcp

                state = one_rank_state(job.model, job.optimizer, *job.dcp)
                mine, meta = write_dcp(self.store, w.staging, state)
                if isinstance(mine, str):
                    raise CheckpointError(f"{self.store.url_of(prefix)}/{DIST}: {mine}")
                assert meta is not None
                for e in (*mine, meta):
                    w.entries[e.path] = e
            if self.save_hf:
                assert job.model is not None and self.hf_config is not None
                write_safetensors_file(w, f"{HF}/{MODEL}", job.model, {"format": "pt"})
                w.write_bytes(f"{HF}/{CONFIG}", self.hf_config)
                if self.tokenizer is not None:
                    w.write_bytes(f"{HF}/{TOKENIZER}", self.tokenizer)
            for rel, data in job.docs.items():
                w.write_bytes(rel, data)
            manifest = w.commit()
        return _Landed(job.step, prefix, manifest, time.perf_counter() - t0)

    def _finalize(self, landed: _Landed) -> None:
        """The seed's finalize: the write has landed, so the tracker may name it."""
        if self.save_checkpoint:
            self.lease.hold()  # still this tree's writer, just before the tracker moves
            self.tree.set_latest(landed.step, manifest_sha256=landed.manifest.digest)
        parts = tuple(p for p, on in ((DIST, self.save_checkpoint), (HF, self.save_hf)) if on)
        result = LoongSaveResult(landed.step, self.store.url_of(landed.prefix),
                                 landed.manifest.digest, landed.manifest.total_size,
                                 landed.seconds, self.save_checkpoint, parts)
        self.saved.append(result)
        self._last_save = time.monotonic()
        self._apply_retention()
        for hook in self.on_commit:
            hook(result)

    def _apply_retention(self) -> None:
        """The ``retention`` policy, after the commit and the tracker's move
        (so that a rule such as keep_best never deletes the step the tracker
        is about to name): async, on the writer thread before the next save;
        sync, here (never beside a save of this writer: retention treats the
        writer's own staging as a predecessor's)."""
        if self.retention is None:
            return
        if self.async_save:
            self._pool.submit(self.tree.retain_or_warn, self.keep, writer=self.lease.owner,
                              policy=self.retention)
        else:
            self.tree.retain_or_warn(self.keep, writer=self.lease.owner, policy=self.retention)
