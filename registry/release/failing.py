"""Which releases fail their gates *now*, read from the store alone.

A release passed its gates when it was published, but the live ledger (a
revoked data source) and the model's policy can change afterwards. A serving
host pulling it, or an alias pointing at it, should hear of that: this module
re-evaluates the gates of one release (:func:`failing_gates`) or of every
aliased release (:func:`failing_aliases`) without any index, since the store
holds the ledger, the policy and each release's documents (seed 000
"Released model", DESIGN section 5).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from registry.refs.aliases import list_aliases
from registry.errors import RegistryError
from registry.gating.gates import GateResult
from registry.protocol.layout import MODELS, model_ids
from registry.release.checks import ReleaseChecks
from registry.store import Store


def failing_gates(store: Store, model_id: str, version: str, *,
                  unavailable: Callable[[BaseException], bool] | None = None
                  ) -> list[GateResult]:
    """The gates ``model_id@version`` fails now ([] when it passes them all).

    A gate that cannot be evaluated (a malformed ``policy.json``, an unreadable
    release document) is reported as a failing ``gates`` result naming why,
    never raised: the caller is reading, not judging the store.

    Args:
        unavailable: says which errors are the store failing (unreachable,
            5xx) rather than answering: those are raised, not reported as a
            failing gate (a server must not call an outage a refusal).
    """
    try:
        results = ReleaseChecks(store).check(model_id, version)
    except RegistryError as e:
        if unavailable is not None and unavailable(e):
            raise
        return [GateResult("gates", False, f"cannot evaluate the gates: {e}")]
    return [r for r in results if not r.passed]


def describe(failed: list[GateResult]) -> str:
    """``"ledger: source x is revoked ...; evals: ..."``: failing gates in one line."""
    return "; ".join(f"{r.name}: {r.reason}" for r in failed)


@dataclass(frozen=True, slots=True)
class FailingAlias:
    """An alias pointing at a version that fails a gate now, and why; or an
    alias whose pointer cannot be read (``version`` None: it serves nothing)."""

    model_id: str
    alias: str
    version: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "alias": self.alias, "version": self.version,
                "reason": self.reason}


def failing_aliases(store: Store) -> list[FailingAlias]:
    """Every alias of every model whose version fails a gate now, by model then
    alias; a model's damaged aliases (their pointers cannot be read) first,
    version None. Reads each aliased release's manifest, card, ledger and
    summary once."""
    out = []
    for model_id in model_ids(store.subdirs(MODELS)):
        verdicts: dict[str, list[GateResult]] = {}
        damaged: dict[str, str] = {}
        aliases = list_aliases(store, model_id, damaged=damaged)
        for alias in sorted(damaged):  # serves nothing: a host resolving it fails
            out.append(FailingAlias(model_id, alias, None, f"damaged alias: {damaged[alias]}"))
        for alias, version in sorted(aliases.items()):
            if version not in verdicts:
                verdicts[version] = failing_gates(store, model_id, version)
            if verdicts[version]:
                out.append(FailingAlias(model_id, alias, version, describe(verdicts[version])))
    return out
