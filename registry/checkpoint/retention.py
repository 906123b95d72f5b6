"""Retention policies of a checkpoint tree (issue 46 item 3): which committed
steps to keep, beyond the count ``keep``.

A :class:`RetentionPolicy` is the union of its rules, each off at 0:

``keep_last``
    the N newest committed steps (what ``keep`` / ``--keep`` always meant);
``keep_best`` with ``metric`` and ``mode``
    the K steps whose metric is lowest (``min``) or highest (``max``); the
    metric is a top-level number of the step's ``trainer_state.json``
    (seed 000's trainer state, e.g. ``loss``; a LoongSage step has one when
    the loop passes ``maybe_save(..., metrics=...)``); a step without the
    number, or without the file, is never among the best;
``keep_every``
    every step that is a multiple of k;
``keep_interval``
    one step per interval of that many seconds of commit time (the
    manifest's ``created_at``): the newest of each interval.

Whatever the policy, the pointer's step and every step a release names
(its manifest's ``source``: run_id and step) are kept; :meth:`CheckpointTree.retain`
applies the rest (MANIFEST.json first, beside the zombie-writer lease as
for ``keep``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from registry.errors import ObjectNotFoundError, RegistryError, UsageError
from registry.protocol.layout import MODELS
from registry.protocol.manifest import MANIFEST, Manifest, parse_manifest
from registry.store import Store, join

MODES = ("min", "max")
TRAINER_STATE = "trainer_state.json"


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What a policy judges a committed step by: its step, commit time (epoch
    seconds, None when unknown) and metric value (None when absent)."""

    step: int
    created: float | None
    metric: float | None


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """Keep the union of the rules (see the module); all zero keeps everything.

    Raises:
        UsageError: a negative count or interval, ``keep_best`` without
            ``metric``, a ``mode`` other than min or max.
    """

    keep_last: int = 0
    keep_best: int = 0
    metric: str | None = None
    mode: str = "min"
    keep_every: int = 0
    keep_interval: float = 0.0

    def __post_init__(self) -> None:
        for name in ("keep_last", "keep_best", "keep_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"retention {name} {value!r} must be a non-negative integer")
        if not isinstance(self.keep_interval, (int, float)) or not \
                (math.isfinite(self.keep_interval) and self.keep_interval >= 0):
            raise UsageError(f"retention keep_interval {self.keep_interval!r} must be a "
                             "non-negative number of seconds")
        if self.mode not in MODES:
            raise UsageError(f"retention mode {self.mode!r} must be min or max")
        if self.keep_best and not self.metric:
            raise UsageError("retention keep_best needs a metric (a trainer_state.json field)")

    @property
    def active(self) -> bool:
        """Whether any rule is on (an all-off policy keeps every step)."""
        return bool(self.keep_last or self.keep_best or self.keep_every or self.keep_interval)

    def kept(self, steps: Sequence[StepFacts]) -> set[int]:
        """The steps the rules keep, of ``steps`` (committed, any order)."""
        if not self.active:
            return {s.step for s in steps}
        ordered = sorted(steps, key=lambda s: s.step)
        keep: set[int] = set()
        if self.keep_last:
            keep |= {s.step for s in ordered[-self.keep_last:]}
        if self.keep_best:
            scored = [s for s in ordered if s.metric is not None and math.isfinite(s.metric)]
            sign = 1.0 if self.mode == "min" else -1.0
            scored.sort(key=lambda s: (sign * (s.metric or 0.0), -s.step))
            keep |= {s.step for s in scored[:self.keep_best]}
        if self.keep_every:
            keep |= {s.step for s in ordered if s.step % self.keep_every == 0}
        if self.keep_interval:
            newest: dict[int, int] = {}
            for s in ordered:
                if s.created is not None:
                    newest[math.floor(s.created / self.keep_interval)] = s.step
            keep |= set(newest.values())
        return keep


def step_facts(store: Store, prefix: str, step: int, manifest: Manifest,
               metric: str | None) -> StepFacts:
    """The facts of the committed step at ``prefix`` (its trainer_state.json
    read only when ``metric`` is asked and the manifest lists the file)."""
    created = _epoch(manifest.created_at)
    value = None
    if metric and any(e.path == TRAINER_STATE for e in manifest.files):
        try:
            doc = json.loads(store.read_bytes(join(prefix, TRAINER_STATE), limit=1 << 20))
        except (RegistryError, ValueError, UnicodeDecodeError, FileNotFoundError):
            doc = None
        raw = doc.get(metric) if isinstance(doc, dict) else None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw)
    return StepFacts(step, created, value)


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def released_steps(store: Store, run_ids: Iterable[str]) -> set[tuple[str, int]]:
    """(run_id, step) of every checkpoint step a release of ``store`` names
    (``models/<id>/<version>/MANIFEST.json`` whose ``source`` has a run_id of
    ``run_ids``). A release manifest that cannot be read is skipped: it
    names no step that could be trusted."""
    wanted = set(run_ids)
    out: set[tuple[str, int]] = set()
    if not wanted:
        return out
    for model, is_dir in store.list_dir(MODELS):
        if not is_dir:
            continue
        for version, vdir in store.list_dir(join(MODELS, model)):
            if not vdir:
                continue
            key = join(MODELS, model, version, MANIFEST)
            try:
                m = parse_manifest(store.read_bytes(key), source=store.url_of(key))
            except (ObjectNotFoundError, FileNotFoundError, RegistryError, ValueError):
                continue
            source = m.meta.get("source")
            if isinstance(source, dict) and source.get("run_id") in wanted and \
                    isinstance(source.get("step"), int):
                out.add((str(source["run_id"]), int(source["step"])))
    return out
