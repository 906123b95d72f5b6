"""Index write paths: one function per committed fact, each idempotent (upsert).

Facts are read back from the store after their commit, so incremental indexing
and ``registry index rebuild`` run the very same code.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from registry.gating import gates
from registry.gating.gates import Threshold
from registry.index.schema import (
    Alias,
    Checkpoint,
    EvalResult,
    LedgerSource,
    Model,
    Policy,
    Release,
    ReleaseFile,
    ReleaseSource,
    Revocation,
)
from registry.protocol.layout import release_prefix
from registry.gating.ledger import Revocation as StoreRevocation
from registry.protocol.manifest import Manifest
from registry.protocol.sequence import sequence_of
from registry.store import Store
from registry.protocol.verify import read_manifest


def model_pk(s: Session, model_id: str) -> int:
    """Primary key of the model row, created if needed."""
    pk = s.scalar(select(Model.id).where(Model.model_id == model_id))
    if pk is None:
        row = Model(model_id=model_id)
        s.add(row)
        s.flush()
        pk = row.id
    return pk


def _dtype(store: Store, prefix: str, manifest: Manifest) -> str:
    # numpy and the weights formats load only when a release is indexed
    from registry.formats.weights import INDEX, SINGLE, load_weights
    from registry.release.convert import dtype_label, weights_groups

    files = {e.path: e.size for e in manifest.files}
    if SINGLE not in files and INDEX not in files:
        return "none"
    weights = load_weights(store, prefix, files=files)
    return dtype_label(weights_groups(weights.described, weights.metadata))[:32]


def record_release(s: Session, store: Store, model_id: str, version: str, *,
                   legacy_seq: int | None = None) -> int:
    """Index the committed release ``model_id@version`` (replacing any row); returns its pk.

    Its ``seq`` is the sequence its manifest records (:mod:`registry.protocol.sequence`);
    a release committed before the counter has none and gets ``legacy_seq``
    (``index rebuild``: its rank by ``(created_at, version)``), else one more
    than the model's highest."""
    prefix = release_prefix(model_id, version)
    from registry.release import ModelRelease  # its conversion code loads numpy

    manifest = read_manifest(store, prefix)
    facts = ModelRelease(store).facts(model_id, version)
    card = gates.gate_model_card(facts.card)
    ledger = gates.gate_ledger(facts.ledger, facts.ledger_error, revoked={})
    evals = gates.gate_evals(facts.evals, facts.evals_error)
    mpk = model_pk(s, model_id)
    replaced = s.execute(delete(Release).where(Release.model_pk == mpk,
                                               Release.version == version)).rowcount
    if not replaced:
        # an increment under the row's lock: concurrent writers of one model
        # each add theirs (a count(*) here would miss the other's uncommitted row)
        s.execute(update(Model).where(Model.id == mpk)
                  .values(release_count=Model.release_count + 1))
    seq = sequence_of(manifest)
    if seq is None:
        seq = legacy_seq if legacy_seq is not None else 1 + (s.scalar(
            select(func.max(Release.seq)).where(Release.model_pk == mpk)) or 0)
    source = manifest.meta.get("source", {})
    summary = facts.evals or {}
    row = Release(model_pk=mpk, version=version, uri=store.url_of(prefix),
                  manifest_sha256=manifest.digest, bytes=manifest.total_size,
                  dtype=_dtype(store, prefix, manifest), source_run_id=source.get("run_id"),
                  source_step=source.get("step"), source_uri=source.get("uri"),
                  source_manifest_sha256=source.get("manifest_sha256"),
                  created_at=manifest.created_at, seq=seq, card_ok=card.passed, ledger_ok=ledger.passed,
                  ledger_reason=ledger.reason, evals_passed=evals.passed,
                  evals_reason=evals.reason, suite=summary.get("suite"),
                  suite_version=summary.get("suite_version"))
    s.add(row)
    s.flush()
    s.add_all(ReleaseFile(release_pk=row.id, path=e.path, bytes=e.size, sha256=e.sha256)
              for e in manifest.files)
    for r in (facts.ledger or []):
        spk = _source_pk(s, r)
        s.add(ReleaseSource(release_pk=row.id, source_pk=spk, name=r["name"], uri=r["uri"],
                            license=r["license"], allowed_uses=",".join(r["allowed_uses"]),
                            revoked_in_file=bool(r["revoked"])))
    s.add_all(EvalResult(release_pk=row.id, task=r["task"], metric=r["metric"],
                         task_metric=f"{r['task']}/{r['metric']}", value=r["value"], n=r["n"],
                         threshold=r["threshold"], higher_is_better=r["higher_is_better"],
                         passed=r["passed"]) for r in summary.get("results", []))
    return row.id


def _source_pk(s: Session, row: dict[str, object]) -> int:
    src = s.scalar(select(LedgerSource).where(LedgerSource.source_id == row["source_id"]))
    if src is None:
        src = LedgerSource(source_id=row["source_id"], name=row["name"], uri=row["uri"],
                           license=row["license"])
        s.add(src)
        s.flush()
    return src.id


def record_checkpoint(s: Session, run_id: str, step: int, uri: str, manifest: Manifest) -> None:
    s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step == step))
    s.add(Checkpoint(run_id=run_id, step=step, uri=uri, manifest_sha256=manifest.digest,
                     bytes=manifest.total_size, created_at=manifest.created_at))


def forget_checkpoints(s: Session, run_id: str, steps: list[int]) -> None:
    """Drop the rows of checkpoints that retention deleted from the store."""
    s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step.in_(steps)))


def keep_only_checkpoints(s: Session, run_id: str, steps: list[int]) -> None:
    """Drop the rows of ``run_id``'s checkpoints whose step is not in ``steps``
    (the steps still in the store)."""
    s.execute(delete(Checkpoint).where(Checkpoint.run_id == run_id,
                                       Checkpoint.step.not_in(steps)))


def record_alias(s: Session, model_id: str, alias: str, version: str | None) -> None:
    """The alias's row: ``version`` now, or none (``version`` None: removed)."""
    mpk = model_pk(s, model_id)
    s.execute(delete(Alias).where(Alias.model_pk == mpk, Alias.alias == alias))
    if version is not None:
        s.add(Alias(model_pk=mpk, alias=alias, version=version))


def record_revocation(s: Session, rev: StoreRevocation) -> None:
    s.execute(delete(Revocation).where(Revocation.source_id == rev.source_id))
    s.add(Revocation(source_id=rev.source_id, revoked_at=rev.revoked_at,
                     reason=rev.revocation_reason))


def record_policy(s: Session, model_id: str, thresholds: Iterable[Threshold]) -> None:
    mpk = model_pk(s, model_id)
    s.execute(delete(Policy).where(Policy.model_pk == mpk))
    s.add_all(Policy(model_pk=mpk, position=i, metric=t.metric, op=t.op, value=t.value)
              for i, t in enumerate(thresholds))
