"""``registry index rebuild``: the index recomputed from the store, never
forgetting on a listing's word (issue 31 item 3).

What the listings show is added or updated. What the index holds and the
listings do not show is read directly (a HEAD of its manifest, a GET of its
pointer or revocation, :mod:`registry.protocol.confirm`): kept when it is there (the
listing lags: GCS, Swift, RGW, a cache), removed only when its absence is
confirmed. Staging directories (``*.tmp-*``) and claimed, uncommitted
versions are skipped, never an error; a release that does not verify, or
whose documents cannot be indexed (a number no column holds), is reported
damaged and left out, and the others are indexed. Every release skipped,
damaged, removed or kept against the listing is reported with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from registry.refs.aliases import list_aliases
from registry.checkpoint import CheckpointTree
from registry.protocol.confirm import manifest_absent, verify_confirmed
from registry.errors import (
    InvalidNameError,
    ObjectNotFoundError,
    PointerError,
    RegistryError,
    StorageError,
    UnsafeEntryError,
)
from registry.index import schema as t
from registry.index.alias_moves import record_move
from registry.index.db import Index
from registry.index.record import (
    record_alias,
    record_checkpoint,
    record_policy,
    record_release,
    record_revocation,
)
from registry.index.record_lifecycle import record_tags, record_tombstone, record_yank
from registry.protocol.layout import (
    CLAIM_SUFFIX,
    MODELS,
    RUNS,
    TMP_MARK,
    TOMBSTONES,
    model_ids,
    model_root,
    policy_key,
    run_root,
)
from registry.lifecycle.tags import tagged
from registry.lifecycle.tombstone import tombstones
from registry.lifecycle.yank import yanked
from registry.gating.ledger import PREFIX as REVOCATIONS
from registry.gating.ledger import _read as read_revocation
from registry.gating.ledger import revocations
from registry.protocol.manifest import Manifest
from registry.rules.names import check_name, model_from_key
from registry.refs.alias_history import AliasMove, history_aliases, read_head, walk
from registry.release.policy import thresholds
from registry.protocol.sequence import sequence_of
from registry.store import Store, join
from registry.obs.progress import NULL, Progress

__all__ = ["rebuild"]


@dataclass
class _Plan:
    """What the store holds, read completely before the index is touched."""

    releases: dict[tuple[str, str], Manifest] = field(default_factory=dict)
    aliases: dict[tuple[str, str], str] = field(default_factory=dict)
    policies: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[tuple[str, int], tuple[str, Manifest]] = field(default_factory=dict)
    revocations: dict[str, Any] = field(default_factory=dict)
    alias_moves: list[AliasMove] = field(default_factory=list)
    yanks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    tags: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    tombstones: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    report: list[dict[str, str]] = field(default_factory=list)

    def note(self, action: str, what: str, reason: str) -> None:
        self.report.append({"action": action, "what": what, "reason": reason})


def _indexed(s: Session) -> dict[str, set[Any]]:
    def rows(q: Any) -> set[tuple[Any, ...]]:
        return {tuple(r) for r in s.execute(q)}

    return {
        "releases": rows(select(t.Model.model_id, t.Release.version).join(t.Release)),
        "aliases": rows(select(t.Model.model_id, t.Alias.alias).join(t.Alias)),
        "checkpoints": rows(select(t.Checkpoint.run_id, t.Checkpoint.step)),
        "revocations": set(s.scalars(select(t.Revocation.source_id))),
        "models": set(s.scalars(select(t.Model.model_id))),
    }


def _release(plan: _Plan, store: Store, model_id: str, version: str, *,
             listed: bool, indexed: bool) -> None:
    prefix = join(model_root(model_id), version)
    what = f"{model_id}@{version}"
    report = verify_confirmed(store, prefix)
    if report.manifest is None:
        if manifest_absent(store, prefix):
            why = "its MANIFEST.json is gone (a HEAD of it: not found)"
        else:
            why = f"not committed ({report.error})"
        if indexed:
            plan.note("removed", what, why)
        elif store.exists(prefix + CLAIM_SUFFIX):
            plan.note("skipped", what, "being published (claimed, not committed yet)")
        else:
            plan.note("skipped", what, why)
        return
    meta = report.manifest.meta
    if report.problems:
        plan.note("damaged", what, str(report.problems[0])
                  + (" (removed from the index)" if indexed else ""))
    elif report.manifest.kind != "release" or meta.get("version") != version or meta.get(
            "model_id") != model_id:
        plan.note("damaged", what, f"its manifest is a {report.manifest.kind} of "
                  f"{meta.get('model_id')}@{meta.get('version')}")
    else:
        plan.releases[(model_id, version)] = report.manifest
        if not listed:
            plan.note("kept", what, "not in the listing, but its manifest is there (a HEAD "
                      "of it): the listing lags")


def _scan(store: Store, indexed: dict[str, set[Any]]) -> _Plan:
    plan = _Plan()
    listed_models = []
    for key in store.subdirs_confirmed(MODELS):
        try:  # a namespaced id's folder is <org>@<name> (registry.rules.names.model_key)
            listed_models.append(model_from_key(key))
        except InvalidNameError as e:  # quarantined: named, the other models still indexed
            plan.note("quarantined", join(MODELS, key), str(e))
    for model_id in listed_models:
        for name in store.subdirs_confirmed(model_root(model_id)):
            if name == "refs":
                continue
            if TMP_MARK in name:
                plan.note("skipped", f"{model_id}@{name}", "staging of a publish in progress "
                          "or killed (`registry gc` removes abandoned ones)")
                continue
            try:
                check_name(name, "version")
            except InvalidNameError as e:
                plan.note("skipped", f"{model_id}@{name}", str(e))
                continue
            _release(plan, store, model_id, name, listed=True,
                     indexed=(model_id, name) in indexed["releases"])
    seen = {(r["what"].split("@", 1)[0], r["what"].split("@", 1)[1]) for r in plan.report
            if "@" in r["what"]}
    for model_id, version in sorted(indexed["releases"] - plan.releases.keys() - seen):
        _release(plan, store, model_id, version, listed=False, indexed=True)
    _lifecycle(plan, store)
    models = sorted({m for m, _ in plan.releases} | set(listed_models))
    unreadable: set[tuple[str, str]] = set()  # damaged aliases: noted once, not re-read
    for model_id in models:
        damaged: dict[str, str] = {}
        for alias, version in list_aliases(store, model_id, damaged=damaged).items():
            plan.aliases[(model_id, alias)] = version
        for alias, why in sorted(damaged.items()):
            plan.note("damaged", f"{model_id}@{alias}", why)
            unreadable.add((model_id, alias))
        for alias in history_aliases(store, model_id):
            if alias in damaged:  # its history starts at the pointer: noted above
                continue
            broken: list[str] = []
            plan.alias_moves.extend(walk(store, model_id, alias, broken=broken))
            for note in broken:
                plan.note("damaged", f"{model_id}@{alias}", note)
        try:
            plan.policies[model_id] = thresholds(store, model_id)
        except StorageError:
            raise
        except RegistryError as e:  # quarantined: its gates fail where they are checked
            plan.note("quarantined", policy_key(model_id),
                      str(e).splitlines()[0])
    for model_id, alias in sorted(indexed["aliases"] - plan.aliases.keys() - unreadable):
        if model_id not in models:
            continue
        try:  # indexed, not listed: a listing that lagged, or a pointer gone bad since
            value = read_head(store, model_id, alias).version
        except (PointerError, UnsafeEntryError) as e:
            plan.note("damaged", f"{model_id}@{alias}", str(e))
            continue
        if value is not None:
            plan.aliases[(model_id, alias)] = value
    for run_id in store.subdirs_confirmed(RUNS):
        tree = CheckpointTree(store, run_root(run_id))
        for step in tree.steps():
            _checkpoint(plan, store, run_id, step)
    for run_id, step in sorted(indexed["checkpoints"] - plan.checkpoints.keys()):
        if not manifest_absent(store, CheckpointTree(store, run_root(run_id)).prefix(step)):
            _checkpoint(plan, store, run_id, step)
    bad: list[dict[str, str]] = []
    plan.revocations = dict(revocations(store, quarantined=bad))
    for q in bad:
        plan.note("quarantined", q["key"], q["reason"])
    for source_id in sorted(indexed["revocations"] - plan.revocations.keys()):
        try:
            plan.revocations[source_id] = read_revocation(
                store, join(REVOCATIONS, f"{source_id}.json"))
        except ObjectNotFoundError:
            pass
    return plan


def _lifecycle(plan: _Plan, store: Store) -> None:
    """Tombstones, yanks and tags (issue 32). A release with a tombstone is
    deleted whatever files are left (a delete stopped half way): it is not
    indexed, and reported."""
    for model_id in sorted(set(model_ids(store.subdirs(TOMBSTONES)))
                           | {m for m, _ in plan.releases}):
        for version, doc in tombstones(store, model_id).items():
            if doc.get("model_id") != model_id or doc.get("version") != version:
                plan.note("damaged", f"{model_id}@{version}", "its tombstone names "
                          f"{doc.get('model_id')}@{doc.get('version')}")
                continue
            plan.tombstones[(model_id, version)] = doc
            if plan.releases.pop((model_id, version), None) is not None:
                plan.note("skipped", f"{model_id}@{version}", "deleted (a tombstone), files "
                          "left: `registry release delete` again removes them")
    for model_id in sorted({m for m, _ in plan.releases}):
        for version, doc in yanked(store, model_id).items():
            if (model_id, version) in plan.releases:
                plan.yanks[(model_id, version)] = doc
        for version, values in tagged(store, model_id).items():
            if (model_id, version) in plan.releases:
                plan.tags[(model_id, version)] = values


def _checkpoint(plan: _Plan, store: Store, run_id: str, step: int) -> None:
    prefix = CheckpointTree(store, run_root(run_id)).prefix(step)
    report = verify_confirmed(store, prefix)
    if report.ok and report.manifest is not None:
        plan.checkpoints[(run_id, step)] = (store.url_of(prefix), report.manifest)


def _legacy_ranks(plan: _Plan) -> dict[tuple[str, str], int]:
    """1..k per model, by (created_at, version), for releases whose manifest
    records no sequence (committed before registry.protocol.sequence)."""
    by_model: dict[str, list[tuple[str, str]]] = {}
    for (model_id, version), manifest in plan.releases.items():
        if sequence_of(manifest) is None:
            by_model.setdefault(model_id, []).append((manifest.created_at, version))
    return {(m, v): rank for m, rows in by_model.items()
            for rank, (_, v) in enumerate(sorted(rows), start=1)}


def rebuild(index: Index, store: Store, progress: Progress = NULL) -> dict[str, Any]:
    """Recompute the index from the store; returns counts per kind and
    ``report``: one ``{"action", "what", "reason"}`` per release skipped,
    damaged, removed or kept against the listing (actions ``skipped``,
    ``damaged``, ``removed``, ``kept``), and per store record quarantined
    (``quarantined``, counted in ``quarantined`` when any: a model folder with an
    invalid name, a garbled revocation or ``policy.json``; the others are
    indexed, issue 50 item 4).

    The store is read completely first (every listing, every verification,
    every confirming read); only then, in one transaction, are the rows
    replaced: readers see the old index or the new one, never an emptied
    one, and a store that cannot be read leaves the index as it was.

    ``progress`` is told the scan (no total), then each release as it is
    recorded (unit ``releases``).

    Raises:
        StorageError: the store could not be read; the index is unchanged.
        IndexDatabaseError: the database failed; the index is unchanged.
    """
    progress.start("index scan", unit="releases")
    plan = _scan(store, index.read(_indexed))
    legacy = _legacy_ranks(plan)
    counts: dict[str, Any] = {}

    def work(s: Session) -> None:
        for table in (t.AliasMove, t.ReleaseTag, t.Yank, t.Tombstone, t.Policy, t.Alias,
                      t.EvalResult, t.ReleaseSource, t.ReleaseFile,
                      t.Release, t.LedgerSource, t.Model, t.Checkpoint, t.Revocation):
            s.execute(delete(table))
        counts.clear()
        counts.update(models=0, releases=0, aliases=0, checkpoints=0, revocations=0)
        damaged: list[dict[str, str]] = []
        models = sorted({m for m, _ in plan.releases} | {m for m, _ in plan.aliases}
                        | set(plan.policies))
        progress.start("index rebuild", files=len(plan.releases), unit="releases")
        for model_id, version in sorted(plan.releases):
            progress.file_done(f"{model_id}@{version}", 0)
            if _guarded(s, damaged, f"{model_id}@{version}", lambda: record_release(
                    s, store, model_id, version, legacy_seq=legacy.get((model_id, version)))):
                counts["releases"] += 1
        for (model_id, alias), version in sorted(plan.aliases.items()):
            record_alias(s, model_id, alias, version)
            counts["aliases"] += 1
        for move in plan.alias_moves:
            record_move(s, move)
        counts["alias_moves"] = len(plan.alias_moves)
        for model_id, policy in plan.policies.items():
            record_policy(s, model_id, policy)
        counts["models"] = len(models)
        for (run_id, step), (url, manifest) in sorted(plan.checkpoints.items()):
            record_checkpoint(s, run_id, step, url, manifest)
            counts["checkpoints"] += 1
        for rev in plan.revocations.values():
            record_revocation(s, rev)
            counts["revocations"] += 1
        for doc in plan.tombstones.values():
            record_tombstone(s, doc)
        for (model_id, version), doc in sorted(plan.yanks.items()):
            record_yank(s, model_id, version, doc)
        for (model_id, version), values in sorted(plan.tags.items()):
            record_tags(s, model_id, version, values)
        counts.update(tombstones=len(plan.tombstones), yanks=len(plan.yanks),
                      tagged=len(plan.tags))
        counts["report"] = plan.report + damaged
        quarantined = sum(r["action"] == "quarantined" for r in plan.report)
        if quarantined:  # the document keeps its shape when there is none
            counts["quarantined"] = quarantined

    index.run(work)
    progress.finish()
    return counts


def _guarded(s: Session, damaged: list[dict[str, str]], what: str,
             fn: Callable[[], Any]) -> bool:
    """Run one release's index writes in a savepoint: a release whose
    documents cannot be indexed is reported damaged, the others still land."""
    try:
        with s.begin_nested():
            fn()
        return True
    except (RegistryError, ValueError, OverflowError, DataError) as e:
        damaged.append({"action": "damaged", "what": what,
                        "reason": f"cannot be indexed: {str(e).splitlines()[0]}"})
        return False
