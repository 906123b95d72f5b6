"""ModelRelease's gates: the facts of a release (given, or read from a committed one)
and every gate evaluated on them against the live ledger and the model's policy
(split from :mod:`registry.release.model_release`; :class:`ModelRelease` mixes
:class:`ReleaseChecks` in)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from registry.gating import gates
from registry.rules import schemas
from registry.errors import DocumentError, VersionExistsError
from registry.gating.gates import GateFailedError, GateResult, ReleaseFacts, Threshold
from registry.protocol.layout import release_prefix
from registry.protocol.manifest import MANIFEST
from registry.refs.aliases import check_version_name
from registry.rules.names import model_from_key
from registry.gating.ledger import revoked_reasons
from registry.lifecycle.tombstone import check_version_free, refuse_deleted
from registry.lifecycle.yank import yank_gate
from registry.formats.modeldir import HIDDEN_KEYS, hidden_size
from registry.obs.tracing import traced
from registry.release import code as release_code
from registry.release import policy, signature_gate
from registry.obs.progress import NULL, Progress
from registry.release.inputs import load_doc, stored_code_gate, stored_doc, validated_doc
from registry.store import Store, join
from registry.protocol.verify import require_verified


class ReleaseChecks:
    """The gate half of :class:`registry.release.model_release.ModelRelease`
    (which provides ``store``; ``progress`` is told the gates as decided)."""

    store: Store
    progress: Progress = NULL

    def __init__(self, store: Store) -> None:
        self.store = store

    def _refuse_existing(self, prefix: str) -> None:
        self.store.ensure_root()  # the first release may create a new local store
        _, key, version = prefix.split("/")
        model_id = model_from_key(key)
        check_version_name(self.store, model_id, version)
        if self.store.exists(join(prefix, MANIFEST)):
            raise VersionExistsError(f"{self.store.url_of(prefix)}: version exists; releases "
                                     "are immutable, publish a new version", path=prefix)
        check_version_free(self.store, model_id, version)  # after the manifest: see there

    # -- inputs and gates --------------------------------------------------------

    def _facts(self, *, card: str | None, ledger: Any, evals: Any) -> ReleaseFacts:
        rows, ledger_error = validated_doc(ledger, "ledger.json", schemas.validate_ledger)
        summary, evals_error = validated_doc(evals, "evals/summary.json",
                                          schemas.validate_eval_summary)
        return ReleaseFacts(card, rows, ledger_error, summary, evals_error)

    def _gate(self, model_id: str, where: str, facts: ReleaseFacts,
              require: Iterable[Threshold | str], *,
              signer: signature_gate.Signer | None = None,
              carries_signature: bool = False, code_found: dict[str, Any] | None = None,
              forbid_code: bool = False) -> tuple[GateResult, ...]:
        thresholds = policy.thresholds(self.store, model_id, extra=require)
        results = gates.evaluate(facts, revoked=revoked_reasons(self.store), require=thresholds)
        results += signature_gate.publish_gate(self.store, model_id, signer,
                                                carries_signature=carries_signature)
        if code_found is not None and (forbid_code or policy.forbids_code(self.store, model_id)):
            results.append(release_code.gate_code(code_found))
        self.progress.gates(results)  # as decided, passing or not
        if not gates.passed(results):
            raise GateFailedError(where, results)
        return tuple(results)

    def _heads(self, heads: Iterable[Any], config: Mapping[str, Any]) -> list[dict[str, Any]]:
        docs, seen = [], set()
        size = hidden_size(dict(config))
        for h in heads:
            doc, where = load_doc(h, what="linear head")
            if size is None:
                raise DocumentError(where, "config.json has no hidden size to check the head "
                                           f"against (none of {', '.join(HIDDEN_KEYS)})")
            schemas.validate_linear_head(doc, path=where, hidden_size=size)
            if doc["name"] in seen:
                raise DocumentError(where, f"head name {doc['name']!r} given twice")
            seen.add(doc["name"])
            docs.append(doc)
        return docs

    # -- checking committed releases ----------------------------------------------

    def facts(self, model_id: str, version: str) -> ReleaseFacts:
        """The gate facts of a committed release, read from the store.

        Raises:
            NotCommittedError, ManifestError: the release is not committed.
        """
        prefix = release_prefix(model_id, version)
        manifest = require_verified(self.store, prefix, full=False)
        listed = {e.path for e in manifest.files}

        def read(name: str) -> bytes | None:
            return self.store.read_bytes(join(prefix, name)) if name in listed else None

        card_bytes = read("MODEL_CARD.md")
        card = card_bytes.decode("utf-8", "replace") if card_bytes is not None else None
        return self._facts(card=card, ledger=stored_doc(read("ledger.json"), prefix, "ledger.json",
                                                     self.store),
                           evals=stored_doc(read("evals/summary.json"), prefix,
                                         "evals/summary.json", self.store))

    @traced("registry.gates")
    def check(self, model_id: str, version: str,
              require: Iterable[Threshold | str] = ()) -> list[GateResult]:
        """Re-evaluate every gate of a committed release against the live ledger
        and the model's policy (plus ``require``).

        Raises:
            ReleaseDeletedError: the release was deleted (its tombstone).
            NotCommittedError, ManifestError: it is not committed.
        """
        refuse_deleted(self.store, model_id, version)
        facts = self.facts(model_id, version)
        thresholds = policy.thresholds(self.store, model_id, extra=require)
        results = gates.evaluate(facts, revoked=revoked_reasons(self.store), require=thresholds)
        return (results + signature_gate.stored_gate(self.store, model_id, version)
                + stored_code_gate(self.store, model_id, version)
                + yank_gate(self.store, model_id, version))
