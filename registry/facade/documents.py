"""The JSON documents the CLI prints with ``--json`` and the web API serves.

One function per document, so ``registry <command> --json`` and
``GET /api/v1/...`` cannot drift apart: both call these (the index documents
-- ``ls``, ``show``, ``query``, ``diff`` -- come from :mod:`registry.index.queries`
through the :class:`registry.api.Registry` facade; the ones below are read from
the store). A test compares every API document with the CLI's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from registry.refs.aliases import list_aliases, parse_ref, resolve
from registry.errors import InvalidNameError
from registry.gating.gates import GateResult, Threshold, passed
from registry.gating.ledger import revocations
from registry.store import Store

if TYPE_CHECKING:
    from registry.checkpoint.tree import CheckpointTree


def checkpoint_list(tree: CheckpointTree, *, full: bool = False) -> dict[str, Any]:
    """``registry ckpt ls --json``: ``{"tree", "layout", "latest", "steps": [StepInfo]}``.

    Raises:
        PointerError: the tree's pointer is garbled.
        StorageError: the store failed.
    """
    infos = [tree.info(s, full=full) for s in tree.steps()]
    return {"tree": tree.store.url_of(tree.root), "layout": tree.layout.name,
            "latest": tree.latest(), "steps": [i.to_dict() for i in infos]}


def gate_report(model_id: str, version: str, results: list[GateResult]) -> dict[str, Any]:
    """``registry gate check --json``: ``{"model_id", "version", "passed", "gates"}``."""
    return {"model_id": model_id, "version": version, "passed": passed(results),
            "gates": [r.to_dict() for r in results]}


def gate_check(store: Store, ref: str, *,
               require: list[str] | list[Threshold] | None = None) -> dict[str, Any]:
    """Every gate of the release ``ref`` (``MODEL_ID@VERSION`` or ``@ALIAS``), now.

    Raises:
        InvalidNameError: ``ref`` has no ``@`` part or breaks the naming rule.
        NotCommittedError: no such version or alias.
        UsageError: a threshold does not parse.
    """
    from registry.release.model_release import ModelRelease  # the builder: numpy

    rel = ModelRelease(store)
    model_id, name = parse_ref(ref)
    if name is None:
        raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION", name=ref)
    version = resolve(store, model_id, name)
    return gate_report(model_id, version, rel.check(model_id, version, require=require or []))


def revocation_list(store: Store) -> list[dict[str, Any]]:
    """``registry ledger ls --json``: every revocation in the store, by source id."""
    return [r.to_dict() for r in revocations(store).values()]


def alias_map(store: Store, model_id: str,
              damaged: dict[str, str] | None = None) -> dict[str, str]:
    """``registry alias ls --json``: alias -> version, from the store; aliases
    whose pointers cannot be read go to ``damaged`` (alias -> why) when given."""
    return list_aliases(store, model_id, damaged=damaged)
