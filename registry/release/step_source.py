"""Publishing a directory that lives inside a checkpoint step.

Seed 003 writes a Hugging Face export at ``<checkpoint_path>/train_step_<N>/hf_model``;
a release engineer may ``registry publish`` that directory. A release must come
from a committed checkpoint, so such a directory is published only when its
step's MANIFEST.json lists every one of its files and each matches (size and
sha256, read in full) -- the same guarantee ``release create`` gives for a step.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from registry.checkpoint.layout import LAYOUTS
from registry.errors import IntegrityError, NotCommittedError, RegistryError
from registry.protocol.manifest import MANIFEST
from registry.store import join, open_store
from registry.protocol.verify import read_manifest, verify_entries

if TYPE_CHECKING:
    from registry.checkpoint.tree import CheckpointTree


def check_step_source(url: str) -> str | None:
    """Verify ``url`` against its checkpoint step when it lies directly inside
    one (``.../train_step_<N>/<dir>`` or ``.../step-<nnnnnn>/<dir>``).

    Returns:
        The step manifest's sha256 digest, or None when ``url`` is not inside a
        step directory (nothing is checked then).

    Raises:
        NotCommittedError: the step has no MANIFEST.json (not committed: a
            crashed save, or a tree this registry did not write -- adopt it
            with ``registry ckpt adopt`` first).
        ManifestError: the step's manifest is invalid.
        IntegrityError: a file of ``url`` is not listed in the step's manifest,
            or a listed one is missing or differs (names the file, expected and
            actual values).
    """
    full = url if "://" in url else os.path.abspath(url)
    parent, _, name = full.rstrip("/").rpartition("/")
    root, _, step_dir = parent.rpartition("/")
    if not name or not step_dir or all(
            layout.parse_dir(step_dir) is None for layout in LAYOUTS.values()):
        return None
    store = open_store(root or "/")
    try:
        manifest = read_manifest(store, step_dir)
    except NotCommittedError:
        raise NotCommittedError(
            f"{store.url_of(step_dir)}: checkpoint step is not committed (no MANIFEST.json); "
            f"{name}/ is published only from a committed step (a tree this registry did "
            "not write: `registry ckpt adopt` it first)", path=step_dir) from None
    sub = name + "/"
    entries = [e for e in manifest.files if e.path.startswith(sub)]
    listed = {e.path for e in entries}
    for rel in sorted(store.walk_files(join(step_dir, name))):
        if sub + rel not in listed:
            raise IntegrityError(f"{store.url_of(step_dir)}/{sub}{rel}",
                                 reason="not listed in the step's MANIFEST.json "
                                        "(written after the step was committed?)")
    problems = verify_entries(store, step_dir, entries, full=True)
    if problems:
        p = problems[0]
        raise IntegrityError(f"{store.url_of(step_dir)}/{p.path}", expected_size=p.expected_size,
                             actual_size=p.actual_size, expected_sha256=p.expected_sha256,
                             actual_sha256=p.actual_sha256, reason=p.reason)
    return manifest.digest


def missing_step(tree: CheckpointTree, run_id: str | None, step: int) -> NotCommittedError:
    """The error for ``release create`` of a step with no committed checkpoint,
    in the user's words (:func:`registry.rules.suggest.missing_step`): the run is
    unknown (with close matches), the step's save did not finish, or the run
    has no such step (its committed steps listed)."""
    from registry.rules import suggest
    from registry.protocol.layout import RUNS

    store = tree.store
    run = run_id or tree.root
    try:
        started = tree.steps()
        committed = [s for s in started if store.exists(join(tree.prefix(s), MANIFEST))]
    except (RegistryError, OSError):
        started, committed = [], []
    runs = None
    if not started and run_id is not None:
        try:
            empty = not store.list_dir(tree.root)
            runs = store.subdirs(RUNS) if empty else None
        except (RegistryError, OSError):
            runs = []
    return NotCommittedError(suggest.missing_step(store.url, run, step, committed, started,
                                                  runs), path=tree.prefix(step))
