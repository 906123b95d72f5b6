"""LoongSage rollout data (seed 003 section 1): the trajectories a rollout-only
run writes for a train-only run to read, under ``rollout_data_path``::

    <rollout_data_path>/step_<step>.pt             torch.save(<the step's trajectories>)
    <rollout_data_path>/step_<step>.MANIFEST.json  its commit marker: a tinyllm
                                                   manifest (kind checkpoint, layout
                                                   "loongsage-rollout", run_id, step)
                                                   listing step_<step>.pt, size, sha256
    <rollout_data_path>/WRITER.lease               the one writer's lease

The seed names one file per step, so each step is committed on its own with a
manifest beside it rather than a directory around it: the ``.pt`` file is
written (durable on close: fsync locally, the completed PUT on S3), its folder
is fsynced, then the manifest is created with a conditional create (``O_EXCL``
locally, ``If-None-Match: *`` on S3). A step is committed if and only if its
manifest exists, parses and lists ``step_<step>.pt``; a reader checks the
file's size and sha256 against it before unpickling (``torch.load`` with
``weights_only=True``). A committed step is never overwritten; a writer killed
before its manifest leaves an uncommitted ``.pt`` the next write of that step
replaces.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from typing import Any

from registry.rules import limits
from registry.checkpoint.lease import DEFAULT_SECONDS, WriterLease
from registry.checkpoint.loongsage_data import dumps_pt, loads_pt
from registry.checkpoint.loongsage_format import derive_run_id
from registry.errors import (
    CommitConflictError,
    IntegrityError,
    ManifestError,
    NotCommittedError,
    ObjectExistsError,
    ObjectNotFoundError,
    UsageError,
)
from registry.protocol.manifest import FileEntry, Manifest, parse_manifest
from registry.rules.names import check_name
from registry.store import Store, join, open_store

DEFAULT_PATH = "./rollout_data"
LAYOUT = "loongsage-rollout"
MARKER_RE = re.compile(r"step_(0|[1-9][0-9]{0,17})\.MANIFEST\.json")


def data_name(step: int) -> str:
    """``step_<step>.pt``: the seed's name of a step's rollout data."""
    return f"step_{step}.pt"


def marker_name(step: int) -> str:
    """``step_<step>.MANIFEST.json``: the step's commit marker."""
    return f"step_{step}.MANIFEST.json"


@dataclass(frozen=True, slots=True)
class RolloutStep:
    """One committed step of rollout data: its step, URL, manifest, size in bytes."""

    step: int
    path: str
    manifest: Manifest
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "path": self.path, "manifest_sha256": self.manifest.digest,
                "bytes": self.bytes, "sha256": self.manifest.files[0].sha256}


class RolloutData:
    """The rollout data directory ``rollout_data_path`` (seed 003).

    Args:
        rollout_data_path: a folder or URL (default ``./rollout_data``, as the
            seed's table); with ``store``, a key in it (``""``: its root).
        store: an open Store or URL the path is relative to.
        run_id: the manifests' run_id; default derived from the path.
        lease_seconds: the writer lease's duration (one writer at a time).

    Raises:
        UsageError: an empty path without ``store``; a bad run_id.

    Notes:
        Writers take the lease ``WRITER.lease`` on their first write and keep it
        until :meth:`close`; a second writer gets RunLeasedError before it
        writes anything. Readers take no lock: they only read committed steps.
    """

    def __init__(self, rollout_data_path: str | os.PathLike[str] = DEFAULT_PATH, *,
                 store: str | Store | None = None, run_id: str | None = None,
                 lease_seconds: float = DEFAULT_SECONDS) -> None:
        path = os.fspath(rollout_data_path)
        if store is None:
            if not path:
                raise UsageError("rollout_data_path must name a folder or URL")
            self.store, self.root = open_store(path), ""
        else:
            self.store = store if isinstance(store, Store) else open_store(store)
            self.root = path.strip("/")
        self.run_id = check_name(run_id, "run_id") if run_id is not None else \
            derive_run_id(self.store, self.root)
        self.lease = WriterLease(self.store, self.root, seconds=lease_seconds)

    @property
    def url(self) -> str:
        return self.store.url_of(self.root)

    def _key(self, name: str) -> str:
        return join(self.root, name) if self.root else name

    # -- writing -------------------------------------------------------------------

    def write(self, step: int, trajectories: Any) -> RolloutStep:
        """Commit ``step_<step>.pt`` holding ``trajectories``.

        Args:
            step: the rollout step (a non-negative integer).
            trajectories: tensors and plain Python values (what
                ``torch.load(weights_only=True)`` loads back).

        Returns:
            The committed RolloutStep.

        Raises:
            UsageError: a bad step.
            CheckpointError: ``trajectories`` cannot be saved that way; nothing written.
            TorchUnavailableError: no torch (the ``[torch]`` extra).
            CommitConflictError: the step is already committed (never overwritten).
            RunLeasedError: another process is this directory's writer.
            StorageError: the store failed; the step is not committed.
        """
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise UsageError(f"{self.url}: rollout step {step!r} must be a non-negative integer")
        data_key, marker = self._key(data_name(step)), self._key(marker_name(step))
        data = dumps_pt(trajectories, what=self.store.url_of(data_key))
        self.store.ensure_root()
        self.lease.hold()
        if self.store.exists(marker):
            raise CommitConflictError(f"{self.store.url_of(data_key)}: step {step} is already "
                                      "committed; rollout data is never overwritten",
                                      path=data_key)
        with self.store.open_write(data_key, size=len(data)) as f:
            f.write(data)
        self.store.fsync_dir(self.root)  # the file's entry, before the marker names it
        manifest = Manifest.build("checkpoint",
                                  [FileEntry(data_name(step), len(data),
                                             hashlib.sha256(data).hexdigest())],
                                  run_id=self.run_id, step=step, layout=LAYOUT)
        self.lease.hold()  # still the writer, just before the commit
        try:
            self.store.create(marker, manifest.to_bytes())
        except ObjectExistsError:
            raise CommitConflictError(f"{self.store.url_of(marker)}: committed by another "
                                      "writer meanwhile", path=marker) from None
        return RolloutStep(step, self.store.url_of(data_key), manifest, len(data))

    def close(self) -> None:
        """Release the writer lease (if this object took it)."""
        self.lease.release()

    def __enter__(self) -> RolloutData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The committed steps (those with a commit marker), ascending.

        Raises:
            StorageError: the listing failed (never an empty answer then).
        """
        found = []
        for name, is_dir in self.store.list_dir(self.root):
            m = MARKER_RE.fullmatch(name)
            if m and not is_dir:
                found.append(int(m.group(1)))
        return sorted(found)

    def manifest(self, step: int) -> Manifest:
        """The commit marker of ``step``, parsed and checked.

        Raises:
            NotCommittedError: the step has no marker (its ``.pt`` may exist:
                a write that did not finish).
            ManifestError: the marker is malformed, or is not this step's.
        """
        marker = self._key(marker_name(step))
        where = self.store.url_of(marker)
        try:
            raw = self.store.read_bytes(marker, limit=limits.MAX_POINTER_BYTES)
        except ObjectNotFoundError:
            half = f" ({data_name(step)} exists: a write that did not finish)" \
                if self.store.exists(self._key(data_name(step))) else ""
            raise NotCommittedError(f"{self.store.url_of(self._key(data_name(step)))}: rollout "
                                    f"step {step} is not committed: no {marker_name(step)}"
                                    f"{half}", path=marker) from None
        manifest = parse_manifest(raw, source=where)
        names = [e.path for e in manifest.files]
        if manifest.meta.get("step") != step or names != [data_name(step)]:
            raise ManifestError(where, f"must list exactly {data_name(step)} of step {step} "
                                       f"(lists {names}, step {manifest.meta.get('step')})")
        return manifest

    def verify(self, step: int) -> RolloutStep:
        """Check ``step_<step>.pt``'s size and sha256 against its marker.

        Raises:
            NotCommittedError, ManifestError: as :meth:`manifest`.
            IntegrityError: the file is missing or its size or sha256 differs.
        """
        return self._read_verified(step)[1]

    def read(self, step: int) -> Any:
        """The trajectories of ``step``, verified first (size and sha256).

        Raises:
            as :meth:`verify`; DocumentError when the verified file does not
            load with ``weights_only=True``; TorchUnavailableError without torch.
        """
        data, _ = self._read_verified(step)
        return loads_pt(data, what=self.store.url_of(self._key(data_name(step))))

    def _read_verified(self, step: int) -> tuple[bytes, RolloutStep]:
        manifest = self.manifest(step)
        entry = manifest.files[0]
        key = self._key(entry.path)
        url = self.store.url_of(key)
        try:
            data = self.store.read_bytes(key)
        except ObjectNotFoundError:
            raise IntegrityError(url, expected_size=entry.size, actual_size=None) from None
        actual = hashlib.sha256(data).hexdigest()
        if len(data) != entry.size or actual != entry.sha256:
            raise IntegrityError(url, expected_size=entry.size, actual_size=len(data),
                                 expected_sha256=entry.sha256, actual_sha256=actual)
        return data, RolloutStep(step, url, manifest, len(data))
