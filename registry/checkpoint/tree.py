"""A checkpoint tree in a store: its steps, its pointer, verification, retention.

Shared by both layouts (:mod:`registry.checkpoint.layout`), the
CheckpointManager, LoongSage saving and the ``registry ckpt`` commands.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from registry.checkpoint.lease import DEFAULT_SECONDS as LEASE_SECONDS
from registry.checkpoint.lease import live_holder
from registry.checkpoint.retention import RetentionPolicy, released_steps, step_facts
from registry.protocol.storeclock import store_time
from registry.protocol.claim import read_state
from registry.protocol.commit import delete_directory
from registry.errors import (
    CheckpointExistsError,
    CommitConflictError,
    NoValidCheckpointError,
    NotCommittedError,
    ObjectNotFoundError,
    PointerError,
    RegistryError,
    StorageError,
)
from registry.protocol.layout import CLAIM_SUFFIX, TMP_MARK, claim_key, leftover_base
from registry.protocol.manifest import Manifest
from registry.protocol.pointer import move_pointer
from registry.store import Store, join
from registry.checkpoint.layout import TINYLLM, Layout
from registry.protocol.verify import VerifyReport, is_committed, require_verified, verify_directory


class CheckpointSkippedWarning(UserWarning):
    """A step was skipped on resume because it is not committed or does not verify."""


class RetentionSkippedWarning(UserWarning):
    """A save skipped retention because the pointer could not be read; the save
    itself goes on (and rewrites the pointer)."""


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step directory: its step, key, and verification report."""

    step: int
    prefix: str
    report: VerifyReport

    def to_dict(self) -> dict[str, object]:
        r = self.report
        return {"step": self.step, "path": self.prefix, "committed": r.manifest is not None,
                "verified": r.ok, "full": r.full,
                "bytes": r.manifest.total_size if r.manifest else None,
                "manifest_sha256": r.manifest.digest if r.manifest else None,
                "problems": [str(p) for p in r.problems]
                + ([str(r.error)] if r.error else [])}


class CheckpointTree:
    """The checkpoint tree rooted at ``root`` in ``store``.

    Args:
        root: key of the tree (``runs/<run_id>/ckpt`` or a LoongSage
            ``checkpoint_path`` relative to the store root, ``""`` for the root).
        layout: naming rules (tinyllm or loongsage).
    """

    def __init__(self, store: Store, root: str, layout: Layout = TINYLLM) -> None:
        self.store = store
        self.root = root.strip("/")
        self.layout = layout
        self._now: float | None = None  # the store's time, within one retention pass

    def prefix(self, step: int) -> str:
        """Key of the step directory of ``step``."""
        return join(self.root, self.layout.step_dir(step))

    @property
    def pointer_key(self) -> str:
        return join(self.root, self.layout.pointer)

    def steps(self) -> list[int]:
        """Every step that has a directory (committed or not), sorted numerically.
        Staging directories, claims and foreign names are ignored."""
        found = {self.layout.parse_dir(name) for name, is_dir in self.store.list_dir(self.root)
                 if is_dir}
        return sorted(s for s in found if s is not None)

    def latest(self) -> int | None:
        """The step the pointer names, or None when there is no pointer.

        Raises:
            PointerError: the pointer is empty or garbled.
        """
        try:
            raw = self.store.read_bytes(self.pointer_key)
        except FileNotFoundError:
            return None
        return self.layout.parse_pointer(raw, path=self.store.url_of(self.pointer_key))

    def set_latest(self, step: int, *, manifest_sha256: str | None = None) -> None:
        """Move the pointer to ``step``, never backwards (compare-and-swap).

        Immediately before the move, the step must be committed: its
        MANIFEST.json exists and validates and every file it lists exists
        with its size (one listing, no file read), and -- given
        ``manifest_sha256`` -- the manifest is the one the caller committed.
        This holds whatever else writes into the tree (a second writer, a
        ``gc`` that emptied the directory meanwhile).

        Raises:
            CommitConflictError: the step's manifest is not ``manifest_sha256``
                (another writer committed this step); the pointer did not move.
            NotCommittedError: the step is not committed or a file is missing
                or resized; the pointer did not move.
            PointerRegressionError: the pointer is already further on.
        """
        prefix = self.prefix(step)
        report = verify_directory(self.store, prefix)
        url = self.store.url_of(prefix)
        if report.manifest is None:
            raise NotCommittedError(f"{url}: not moving {self.layout.pointer} to it: "
                                    f"{report.error}", path=prefix)
        if report.problems:
            raise NotCommittedError(f"{url}: not moving {self.layout.pointer} to it: "
                                    f"{report.problems[0]}", path=prefix)
        if manifest_sha256 is not None and report.manifest.digest != manifest_sha256:
            raise CommitConflictError(
                f"{url}: not moving {self.layout.pointer} to it: its MANIFEST.json "
                f"(sha256 {report.manifest.digest[:12]}) is not the one this writer "
                f"committed ({manifest_sha256[:12]}): another writer saved this step",
                path=prefix)
        move_pointer(self.store, self.pointer_key, self.layout.pointer_value(step),
                     order=self.layout.order)

    def clear_for_save(self, step: int) -> None:
        """Remove what a crashed save of ``step`` left, before saving it again.

        A step beyond the pointer was never vouched for (the crash came between
        its commit and the pointer move), and a step that does not verify is
        broken: both are deleted, MANIFEST.json first. A committed step at or
        before the pointer is a real checkpoint: saving over it is refused.

        Raises:
            CheckpointExistsError: ``step`` is committed at or before the
                pointer (a CommitConflictError and a CheckpointError).
        """
        prefix = self.prefix(step)
        try:
            latest = self.latest()
        except PointerError:
            latest = None
        if latest is not None and step <= latest and is_committed(self.store, prefix):
            raise CheckpointExistsError(
                f"{self.store.url_of(prefix)}: already a committed checkpoint at or before "
                f"{self.layout.pointer} (step {latest}); saving does not overwrite it: delete "
                "newer checkpoints (registry ckpt gc) or use a new run id")
        delete_directory(self.store, prefix)

    def reset_latest(self, step: int) -> None:
        """Point the pointer at ``step`` even if that is backwards (compare-and-swap
        against what it holds now): used when the step it named does not verify."""
        try:
            raw = self.store.read_bytes(self.pointer_key)
            current: str | None = raw.decode("utf-8", "replace").strip() or None
        except FileNotFoundError:
            current = None
        if current != self.layout.pointer_value(step):
            move_pointer(self.store, self.pointer_key, self.layout.pointer_value(step),
                         expected=current, check_expected=True)

    def info(self, step: int, *, full: bool = False) -> StepInfo:
        return StepInfo(step, self.prefix(step),
                        verify_directory(self.store, self.prefix(step), full=full))

    def resumable(self, start: int | None = None, *, fallback: bool = True) -> tuple[int, Manifest]:
        """The step to resume from, fully verified against its manifest.

        Args:
            start: the step to try first; None: the step the pointer names
                (or, with no usable pointer, the newest step directory).
            fallback: on a step that is not committed or does not verify, warn
                (CheckpointSkippedWarning naming the step and why) and try the
                newest older one (seed 000 "Resuming"); False: raise instead
                (seed 003: only the tracked step is resumable).

        Raises:
            NoValidCheckpointError: no candidate verifies.
            PointerError: ``fallback`` is False and the pointer is unusable.
        """
        if start is None:
            try:
                start = self.latest()
            except PointerError as e:
                if not fallback:
                    raise
                warnings.warn(f"{e}; scanning step directories instead",
                              CheckpointSkippedWarning, stacklevel=2)
        steps = self.steps()
        if start is None:
            if not fallback:
                raise NoValidCheckpointError(
                    f"{self.store.url_of(self.pointer_key)}: no tracker file")
            candidates = sorted(steps, reverse=True)
        elif fallback:
            candidates = [start] + sorted((s for s in steps if s < start), reverse=True)
        else:
            candidates = [start]
        reasons = []
        for step in candidates:
            try:
                return step, require_verified(self.store, self.prefix(step), full=True)
            except RegistryError as e:
                if isinstance(e, StorageError) and not isinstance(e, ObjectNotFoundError):
                    raise  # the store failed: never resume from an older step for that
                reason = f"{self.layout.step_dir(step)}: {e}"
                reasons.append(reason)
                if not fallback:
                    break
                warnings.warn(f"skipping {reason}", CheckpointSkippedWarning, stacklevel=2)
        where = self.store.url_of(self.root)
        detail = "; ".join(reasons) if reasons else "no step directories"
        raise NoValidCheckpointError(f"{where}: no checkpoint verifies ({detail})")

    def live_writer(self, *, writer: str | None = None) -> dict[str, object] | None:
        """The run's writer lease (``WRITER.lease``) while another process
        holds it live -- a save may be in progress -- else None. ``writer``:
        the caller's own lease owner, never "another"."""
        holder = live_holder(self.store, self.root)
        return None if holder is None or (writer and holder.get("owner") == writer) else holder

    def _claimed_live(self, key: str) -> bool:
        """Whether a live claim guards ``key`` (a claim, or the staging or step
        directory beside ``<key>.claim``): its writer is alive on this host or
        renewed it within its lease."""
        claim = claim_key(key)
        seen = read_state(self.store, claim, now=self._store_now())
        return seen is not None and seen[0].live

    def _store_now(self) -> float:
        """The store's time (registry.protocol.storeclock), read once per retention
        pass and only when an age is needed: ages compare store stamps only."""
        if self._now is None:
            self._now = store_time(self.store).now
        return self._now

    def retain(self, keep: int, *, min_age: float = 0.0,
               writer: str | None = None,
               policy: RetentionPolicy | None = None) -> list[str]:
        """Apply retention; returns the keys deleted.

        With ``policy`` (:mod:`registry.checkpoint.retention`) its rules
        choose the committed steps kept (``keep > 0`` stands for its
        ``keep_last``), plus the newest resumable step; with or without it,
        a step a release of this store names (its manifest's ``source``) is
        never deleted.

        Keeps the ``keep`` newest committed steps (``keep <= 0``: all), the
        ``keep`` newest *resumable* ones (holding optimizer state:
        ``optimizer.safetensors`` / ``dist_ckpt/``, see
        :meth:`Layout.resumable`), so that an export-only step never takes
        the place of the state training resumes from, and always the step the
        pointer names. Without a pointer, every resumable step is kept (which
        one is vouched for is unknown). Deletes the other committed steps
        (MANIFEST.json first), stale staging directories and claims, and
        uncommitted step directories older than the pointer's step.
        ``min_age`` (seconds) spares leftovers younger than that.

        Beside a live writer it deletes only surplus committed steps older
        than the pointer: when
        another process holds the run's writer lease live (``writer`` is the
        caller's own lease owner: the saving manager), staging directories,
        claims and uncommitted steps are all left alone, whatever their age
        -- the writer may be about to commit one and point at it. Without a
        live lease, a leftover guarded by a live claim (its process alive on
        this host, or renewed within its lease) is left alone too. Pointer
        temp files (``LATEST.tmp-<random>``), lock files and the lease are
        never candidates (:meth:`is_leftover`), except a pointer temp file
        older than a writer lease (seed 000 step 6: "any stale *.tmp"):
        ``LATEST.tmp`` or ``LATEST.tmp-<random>`` whose age is at least the
        live lease's ``lease_seconds`` (the default lease without one).

        Raises:
            PointerError: the pointer exists but cannot be read (empty, as a
                full disk leaves it, garbled, not UTF-8, naming something
                outside the tree): nothing is deleted, since the step it
                vouched for is unknown.

        Notes:
            Safe only where no other writer saves into this tree (a training
            run is the sole writer of its checkpoints: the writer lease).
        """
        try:
            latest = self.latest()
        except PointerError as e:
            raise PointerError(e.path, f"{e.rule}; retention deletes nothing while the "
                                       "pointer cannot be read (repair it: registry ckpt "
                                       "verify shows the steps that verify)") from None
        committed, uncommitted, resumable = [], [], []
        manifests: dict[int, Manifest] = {}
        for step in self.steps():
            manifest = verify_directory(self.store, self.prefix(step)).manifest
            (committed if manifest is not None else uncommitted).append(step)
            if manifest is not None:
                manifests[step] = manifest
                if self.layout.resumable(manifest):
                    resumable.append(step)
        doomed = []
        self._now = None
        if policy is not None and keep > 0:
            policy = dataclasses.replace(policy, keep_last=keep)
        if policy is not None and policy.active:
            kept = policy.kept([step_facts(self.store, self.prefix(s), s, manifests[s],
                                           policy.metric) for s in committed])
            kept |= set(resumable if latest is None else resumable[-1:])
            doomed += [self.prefix(s) for s in committed if s not in kept and s != latest]
        elif keep > 0:
            kept = set(committed[-keep:]) | set(resumable if latest is None
                                                else resumable[-keep:])
            doomed += [self.prefix(s) for s in committed if s not in kept and s != latest]
        if doomed:  # never a step a release names
            named = released_steps(self.store, {str(m.meta.get("run_id"))
                                                for m in manifests.values()})
            doomed = [k for k in doomed if not self._released(k, manifests, named)]
        if self.live_writer(writer=writer) is not None:
            # A save may be under way: only surplus commits the pointer passed.
            return self._delete([k for k in doomed if latest is not None
                                 and (self.layout.parse_dir(k.rsplit("/", 1)[-1]) or 0) < latest]
                                + self._stale_pointer_temps(writer))
        owner = writer is not None  # the lease holder: any claim left is a predecessor's
        if latest is not None:
            doomed += [self.prefix(s) for s in uncommitted
                       if s < latest and (owner or not self._claimed_live(self.prefix(s)))]
        for name, _is_dir in self.store.list_dir(self.root):
            if self.is_leftover(name):
                key = join(self.root, name)
                if not owner and self._claimed_live(key):
                    continue
                if min_age <= 0 or self._age(key, self._store_now()) >= min_age:
                    doomed.append(key)
        doomed += self._stale_pointer_temps(writer)
        self._now = None
        return self._delete(doomed)

    def _released(self, key: str, manifests: dict[int, Manifest],
                  named: set[tuple[str, int]]) -> bool:
        step = self.layout.parse_dir(key.rsplit("/", 1)[-1])
        m = manifests.get(step) if step is not None else None
        return m is not None and (str(m.meta.get("run_id")), step) in named

    def _stale_pointer_temps(self, writer: str | None) -> list[str]:
        """The pointer's temp files (the seed's ``LATEST.tmp``, the stores'
        ``<pointer>.tmp-<random>``) older than a writer lease (the live
        holder's ``lease_seconds``, else the default): no pointer move lasts
        that long, since a writer whose lease lapsed must not move the pointer."""
        base = self.layout.pointer
        names = [name for name, is_dir in self.store.list_dir(self.root) if not is_dir
                 and (name == base + TMP_MARK or name.startswith(base + TMP_MARK + "-"))]
        if not names:
            return []
        holder = live_holder(self.store, self.root)
        seconds = holder.get("lease_seconds") if holder else None
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            seconds = LEASE_SECONDS
        now = self._store_now()
        out = []
        for key in (join(self.root, n) for n in names):
            try:
                mtime = self.store.info(key).mtime
            except FileNotFoundError:
                continue  # renamed over the pointer meanwhile: a swap that completed
            if mtime is not None and now - mtime >= seconds:
                out.append(key)
        return out

    def _delete(self, doomed: list[str]) -> list[str]:
        pointer_temp = join(self.root, self.layout.pointer) + TMP_MARK
        for key in doomed:
            if key.endswith(CLAIM_SUFFIX) or key.startswith(pointer_temp):
                self.store.delete(key)
            else:
                delete_directory(self.store, key)
        return doomed

    def retain_or_warn(self, keep: int, *, writer: str | None = None,
                       policy: RetentionPolicy | None = None) -> list[str]:
        """:meth:`retain` inside a save (``writer``: the saver's lease owner): a
        pointer that cannot be read skips retention with a
        RetentionSkippedWarning instead of failing the save."""
        try:
            return self.retain(keep, writer=writer, policy=policy)
        except PointerError as e:
            warnings.warn(str(e), RetentionSkippedWarning, stacklevel=2)
            return []

    def is_leftover(self, name: str) -> bool:
        """Whether ``name`` (an entry of the tree root) is a step's staging
        directory (``step-000500.tmp``, ``step-000500.tmp-<id>``) or claim
        (``step-000500.claim``). Pointer temp files (``LATEST.tmp``), lock
        files and the writer lease are not: a concurrent pointer move or
        lease renewal owns them."""
        base = leftover_base(name)
        return base is not None and self.layout.parse_dir(base) is not None

    def _age(self, key: str, now: float) -> float:
        files = self.store.walk_files(key)
        try:
            first = join(key, next(iter(files))) if files else key
            mtime = self.store.info(first).mtime
        except FileNotFoundError:
            return float("inf")
        return now - mtime if mtime is not None else float("inf")
