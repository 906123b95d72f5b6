"""``registry release gc``: a retention policy over committed releases (issue 32 item 2).

Criteria combine with AND; a release is deleted (:func:`registry.lifecycle.delete.delete_release`,
tombstone and all) when it is

* not among the ``keep_last`` newest of its model (by the store's release
  order, :mod:`registry.protocol.sequence`), when ``keep_last`` is given;
* older than ``older_than`` seconds by the store's clock (its manifest's
  stamp against a probe object, :mod:`registry.protocol.storeclock`: never this
  host's clock), when given;
* pointed at by no alias -- always: ``release delete`` refuses an aliased
  release, so ``unaliased`` alone is the policy "every release no alias
  points at". A model with an alias whose pointer cannot be read keeps
  every release the other criteria would delete (the alias may point at
  any of them), and says so.

At least one criterion is required: ``release gc`` with none would delete
every unaliased release by accident. Every release looked at is reported,
deleted or kept, with the rule that decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.refs.aliases import damaged_alias_note, list_aliases
from registry.errors import NotCommittedError, RegistryError, ReleaseInUseError, UsageError
from registry.protocol.layout import MODELS, TMP_MARK, model_ids, model_root, release_prefix
from registry.lifecycle.delete import delete_release
from registry.lifecycle.tombstone import is_deleted
from registry.protocol.manifest import MANIFEST, Manifest
from registry.rules.names import check_model_id, check_name
from registry.protocol.sequence import sequence_of
from registry.store import Store, join
from registry.protocol.verify import read_manifest


@dataclass
class GcReport:
    """What a retention run did (or, with ``dry_run``, would do).

    Attributes:
        deleted: ``{"model_id", "version", "reason"}`` per release deleted.
        kept: ``{"model_id", "version", "reason"}`` per release kept, and why.
        tombstones: the tombstones written (empty on a dry run).
    """

    dry_run: bool
    deleted: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    tombstones: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "deleted": self.deleted, "kept": self.kept}


def _releases(store: Store, model_id: str) -> list[tuple[str, Manifest]]:
    """Committed, undeleted releases of ``model_id``, newest first."""
    out = []
    for name in store.subdirs_confirmed(model_root(model_id)):
        if name == "refs" or TMP_MARK in name:
            continue
        try:
            check_name(name, "version")
            manifest = read_manifest(store, release_prefix(model_id, name))
        except (NotCommittedError, RegistryError):
            continue
        if manifest.kind != "release" or is_deleted(store, model_id, name):
            continue
        out.append((name, manifest))
    out.sort(key=lambda vm: (sequence_of(vm[1]) or 0, vm[1].created_at, vm[0]), reverse=True)
    return out


def _policy_text(keep_last: int | None, unaliased: bool, older_than: float | None) -> str:
    parts = []
    if keep_last is not None:
        parts.append(f"keep-last {keep_last}")
    if unaliased:
        parts.append("unaliased")
    if older_than is not None:
        parts.append(f"older than {older_than:g} s")
    return "retention policy (" + ", ".join(parts) + ")"


def collect(store: Store, *, keep_last: int | None = None, unaliased: bool = False,
            older_than: float | None = None, model_id: str | None = None,
            dry_run: bool = False, reason: str | None = None) -> GcReport:
    """Apply the policy to ``model_id`` (default: every model); returns the report.

    Args:
        keep_last: keep this many newest releases of each model (>= 0).
        unaliased: a criterion of its own (see the module doc).
        older_than: seconds, by the store's clock.
        reason: recorded in each tombstone (default: the policy in words).

    Raises:
        UsageError: no criterion, or a negative ``keep_last`` / ``older_than``.
        InvalidNameError: a bad ``model_id``.
        StorageError: the store failed (what was deleted before stays deleted,
            each with its tombstone).
    """
    if keep_last is None and not unaliased and older_than is None:
        raise UsageError("release gc: give at least one of --keep-last N, --unaliased, "
                         "--older-than DURATION")
    if keep_last is not None and keep_last < 0:
        raise UsageError(f"--keep-last {keep_last}: must be at least 0")
    if older_than is not None and older_than < 0:
        raise UsageError("--older-than: must not be negative")
    why = reason or _policy_text(keep_last, unaliased, older_than)
    report = GcReport(dry_run=dry_run)
    models = ([check_model_id(model_id)] if model_id
              else model_ids(store.subdirs_confirmed(MODELS)))
    now = None
    if older_than is not None:
        from registry.protocol.storeclock import store_time

        now = store_time(store).now
    for m in models:
        aliases: dict[str, list[str]] = {}
        damaged: dict[str, str] = {}
        for alias, version in list_aliases(store, m, damaged=damaged).items():
            aliases.setdefault(version, []).append(alias)
        # an alias that cannot be read may point at any release: keep them all
        unreadable = damaged_alias_note(m, damaged) if damaged else None
        for i, (version, _manifest) in enumerate(_releases(store, m)):
            row = {"model_id": m, "version": version}
            if keep_last is not None and i < keep_last:
                report.kept.append({**row, "reason": f"among the {keep_last} newest"})
                continue
            if version in aliases:
                report.kept.append({**row, "reason": "alias " + ", ".join(sorted(
                    aliases[version])) + " points at it"})
                continue
            if unreadable is not None:
                report.kept.append({**row, "reason": unreadable})
                continue
            if now is not None and older_than is not None:
                stamp = store.info(join(release_prefix(m, version), MANIFEST)).mtime or now
                if now - stamp < older_than:
                    report.kept.append({**row, "reason": f"committed {now - stamp:.0f} s ago, "
                                                         f"not older than {older_than:g} s"})
                    continue
            if dry_run:
                report.deleted.append({**row, "reason": why})
                continue
            try:
                doc, _ = delete_release(store, m, version, why)
            except ReleaseInUseError as e:
                report.kept.append({**row, "reason": f"an alias was set meanwhile ({e})"})
                continue
            report.deleted.append({**row, "reason": why})
            report.tombstones.append(doc)
    return report
