"""``registry index rebuild``: the index recomputed from the store alone."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from registry.aliases import list_aliases
from registry.checkpoint import CheckpointTree
from registry.errors import RegistryError, StorageError
from registry.index import schema as t
from registry.index.db import Index
from registry.index.record import (
    record_alias,
    record_checkpoint,
    record_policy,
    record_release,
    record_revocation,
)
from registry.layout import MODELS, RUNS, run_root
from registry.ledger import revocations
from registry.release.policy import thresholds
from registry.store import Store, join
from registry.verify import verify_directory


def rebuild(index: Index, store: Store) -> dict[str, int]:
    """Replace every row with what the store holds; returns counts per kind.

    Only committed directories are indexed. The store is read completely
    first (every listing, every verification); only then, in one
    transaction, are the old rows replaced, so a store that cannot be read
    (down, denied, wrong credentials, missing bucket) leaves the index as it
    was: readers see the old index or the new one, never an emptied one.

    Raises:
        StorageError: the store could not be read; the index is unchanged.
        IndexDatabaseError: the database failed; the index is unchanged.
    """
    counts = {"models": 0, "releases": 0, "aliases": 0, "checkpoints": 0, "revocations": 0}
    models: list[tuple[str, list[str], dict[str, str], object]] = []
    for model_id in store.subdirs_confirmed(MODELS):
        versions = [v for v in store.subdirs_confirmed(join(MODELS, model_id))
                    if verify_directory(store, join(MODELS, model_id, v)).ok]
        try:
            policy: object = thresholds(store, model_id)
        except StorageError:
            raise
        except RegistryError:
            policy = None  # a malformed policy.json is reported by gate checks, not here
        models.append((model_id, versions, list_aliases(store, model_id), policy))
    checkpoints = []
    for run_id in store.subdirs_confirmed(RUNS):
        tree = CheckpointTree(store, run_root(run_id))
        for step in tree.steps():
            report = verify_directory(store, tree.prefix(step))
            if report.ok and report.manifest is not None:
                checkpoints.append((run_id, step, store.url_of(tree.prefix(step)),
                                    report.manifest))
    revs = list(revocations(store).values())

    def work(s: Session) -> None:
        for table in (t.Policy, t.Alias, t.EvalResult, t.ReleaseSource, t.ReleaseFile,
                      t.Release, t.LedgerSource, t.Model, t.Checkpoint, t.Revocation):
            s.execute(delete(table))
        for k in counts:
            counts[k] = 0
        for model_id, versions, aliases, policy in models:
            counts["models"] += 1
            for version in versions:
                record_release(s, store, model_id, version)  # an error rolls back
                counts["releases"] += 1
            for alias, version in aliases.items():
                record_alias(s, model_id, alias, version)
                counts["aliases"] += 1
            if policy is not None:
                record_policy(s, model_id, policy)  # type: ignore[arg-type]
        for run_id, step, url, manifest in checkpoints:
            record_checkpoint(s, run_id, step, url, manifest)
            counts["checkpoints"] += 1
        for rev in revs:
            record_revocation(s, rev)
            counts["revocations"] += 1

    index.run(work)
    return counts
