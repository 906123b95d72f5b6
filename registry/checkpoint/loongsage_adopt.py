"""Adopting a LoongSage tree written without manifests (by LoongSage itself).

``registry ckpt adopt <checkpoint_path>`` hashes every file of the step the
tracker vouches for and commits that step directory in place by creating its
``MANIFEST.json`` with a conditional create (``O_EXCL`` locally,
``If-None-Match: *`` on S3). From then on ``registry ckpt verify`` checks it
and a release can be made from its ``hf_model/``.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage_format import derive_run_id
from registry.checkpoint.tree import CheckpointTree
from registry.errors import (
    CheckpointError,
    CommitConflictError,
    NoValidCheckpointError,
    ObjectExistsError,
)
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, check_path
from registry.store import Store, join
from registry.protocol.verify import verify_directory


@dataclass(frozen=True, slots=True)
class AdoptResult:
    """The adopted step: its URL, manifest, and whether it already had one."""

    step: int
    path: str
    manifest: Manifest
    already: bool

    def to_dict(self) -> dict[str, object]:
        return {"step": self.step, "path": self.path, "manifest_sha256": self.manifest.digest,
                "files": len(self.manifest.files), "bytes": self.manifest.total_size,
                "already_adopted": self.already}


def adopt(store: Store, checkpoint_path: str = "", *, run_id: str | None = None,
          workers: int = 4) -> AdoptResult:
    """Write MANIFEST.json for the step the tracker records.

    Args:
        store, checkpoint_path: the tree (``""``: the store root).
        run_id: the manifest's run_id; default derived from the path.
        workers: files hashed in parallel.

    Returns:
        The AdoptResult; ``already`` when the step already had a manifest that
        verifies (nothing is written then).

    Raises:
        PointerError: the tracker is missing-but-required, empty or garbled.
        NoValidCheckpointError: no tracker, the tracked step does not exist or
            is empty, or it has a manifest that does not verify.
        UnsafePathError: a file name breaks the manifest path rules.
        CheckpointError: files changed while they were hashed.
        CommitConflictError: another writer committed the step meanwhile.
    """
    tree = CheckpointTree(store, checkpoint_path, LOONGSAGE)
    tracker = store.url_of(tree.pointer_key)
    step = tree.latest()
    if step is None:
        raise NoValidCheckpointError(f"{tracker}: no tracker file; adopt commits only the "
                                     "step the tracker vouches for")
    prefix = tree.prefix(step)
    url = store.url_of(prefix)
    if step not in tree.steps():
        raise NoValidCheckpointError(f"{tracker} records step {step}, but {url} does not exist")
    if store.exists(join(prefix, MANIFEST)):
        report = verify_directory(store, prefix, full=True)
        if not report.ok:
            why = report.error or report.problems[0]
            raise NoValidCheckpointError(f"{url}: already has a manifest that does not "
                                         f"verify ({why}); not adopted again")
        assert report.manifest is not None
        return AdoptResult(step, url, report.manifest, True)
    sizes = store.walk_files(prefix)
    if not sizes:
        raise NoValidCheckpointError(f"{url}: holds no files")
    for rel in sizes:
        check_path(rel, source=url)

    def digest(rel: str) -> FileEntry:
        h = hashlib.sha256()
        n = 0
        for block in store.iter_read(join(prefix, rel)):
            h.update(block)
            n += len(block)
        return FileEntry(rel, n, h.hexdigest())

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        entries = list(pool.map(digest, sorted(sizes)))
    after = store.walk_files(prefix)
    changed = [e.path for e in entries if e.size != sizes[e.path] or after.get(e.path) != e.size]
    changed += sorted(set(after) - set(sizes) - {MANIFEST})
    if changed:
        raise CheckpointError(f"{url}: {changed[0]} changed while it was hashed; is a "
                              "writer still saving this step? Nothing was adopted")
    manifest = Manifest.build("checkpoint", entries,
                              run_id=run_id or derive_run_id(store, tree.root), step=step,
                              layout=LOONGSAGE.name, metadata={"adopted": "true"})
    try:
        store.create(join(prefix, MANIFEST), manifest.to_bytes())
    except ObjectExistsError:
        raise CommitConflictError(f"{url}: committed by another writer while adopting",
                                  path=prefix) from None
    return AdoptResult(step, url, manifest, False)
