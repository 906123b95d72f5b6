"""``registry index rebuild``: the index recomputed from the store alone."""

from __future__ import annotations

from sqlalchemy import delete
from sqlalchemy.orm import Session

from registry.aliases import list_aliases
from registry.checkpoint import CheckpointTree, run_root
from registry.errors import RegistryError
from registry.index import schema as t
from registry.index.db import Index
from registry.index.record import (
    record_alias,
    record_checkpoint,
    record_policy,
    record_release,
    record_revocation,
)
from registry.ledger import revocations
from registry.release.policy import thresholds
from registry.store import Store, join
from registry.verify import verify_directory


def rebuild(index: Index, store: Store) -> dict[str, int]:
    """Replace every row with what the store holds; returns counts per kind.

    Only committed directories are indexed. One transaction: readers see the
    old index or the new one.
    """
    counts = {"models": 0, "releases": 0, "aliases": 0, "checkpoints": 0, "revocations": 0}

    def work(s: Session) -> None:
        for table in (t.Policy, t.Alias, t.EvalResult, t.ReleaseSource, t.ReleaseFile,
                      t.Release, t.LedgerSource, t.Model, t.Checkpoint, t.Revocation):
            s.execute(delete(table))
        for k in counts:
            counts[k] = 0
        for model_id in store.subdirs("models"):
            counts["models"] += 1
            for version in store.subdirs(join("models", model_id)):
                if verify_directory(store, join("models", model_id, version)).ok:
                    record_release(s, store, model_id, version)
                    counts["releases"] += 1
            for alias, version in list_aliases(store, model_id).items():
                record_alias(s, model_id, alias, version)
                counts["aliases"] += 1
            try:
                record_policy(s, model_id, thresholds(store, model_id))
            except RegistryError:
                pass  # a malformed policy.json is reported by gate checks, not here
        for run_id in store.subdirs("runs"):
            tree = CheckpointTree(store, run_root(run_id))
            for step in tree.steps():
                report = verify_directory(store, tree.prefix(step))
                if report.ok and report.manifest is not None:
                    record_checkpoint(s, run_id, step, store.url_of(tree.prefix(step)),
                                      report.manifest)
                    counts["checkpoints"] += 1
        for rev in revocations(store).values():
            record_revocation(s, rev)
            counts["revocations"] += 1

    index.run(work)
    return counts
