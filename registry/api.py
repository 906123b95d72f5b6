"""The Registry facade: one object for a store and its index.

Every write goes to the store first (the source of truth) and then to the
index. A failing index write never undoes or blocks the store commit: it is
reported as an :class:`IndexWriteWarning` (and kept in ``index_errors``), and
``registry index rebuild`` repairs the index from the store alone.

Example::

    reg = Registry("s3://bucket/registry", db="postgresql+psycopg://db/registry")
    reg.create_release("run-1", 500, "tiny", "1.0", dtype="bf16",
                       ledger="ledger.json", eval_summary="summary.json")
    reg.passing("tiny")            # versions passing every gate now
    reg.pull("tiny@prod", to="/srv/models/tiny")
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import Session

from registry.rules import limits
from registry.facade.api_aliases import AliasMixin
from registry.protocol.layout import release_prefix
from registry.rules.names import check_model_id, check_name
from registry.facade.api_lifecycle import LifecycleMixin
from registry.refs.aliases import parse_ref, resolve
from registry.errors import (
    IndexDamagedError,
    IndexDatabaseError,
    IndexOutOfDateError,
    IndexReadOnlyError,
    InvalidNameError,
    RegistryError,
    StorageError,
    UnknownModelError,
)
from registry.gating.gates import GateResult, Threshold
from registry.index import Index, queries
from registry.events import POLICY_CHANGED, SOURCE_REVOKED, append_event
from registry.index.record import (
    forget_checkpoints,
    keep_only_checkpoints,
    record_checkpoint,
    record_policy,
    record_release,
    record_revocation,
)
from registry.trust.certs import Certificate
from registry.trust.keys import PublicKey
from registry.gating.ledger import Revocation, revoke
from registry.obs.progress import NULL, Progress
from registry.release.events import release_event
from registry.release.code import code_files
from registry.release.policy import forbids_code, set_policy, signed_by
from registry.release.signature_gate import signature_info, stored_gate
from registry.trust.model_sig import SIGNATURE
from registry.formats.modeldir import other_weights
from registry.store import Store, join, open_store
from registry.protocol.verify import read_manifest

if TYPE_CHECKING:  # these load numpy, fsspec's transfers...: imported where used
    from registry.checkpoint import CheckpointManager, SaveResult
    from registry.checkpoint.loongsage import LoongSageCheckpointer, LoongSaveResult
    from registry.pull import PullResult
    from registry.pull.cache_admin import PullCache
    from registry.release import ModelRelease, ReleaseResult

T = TypeVar("T")


class IndexWriteWarning(UserWarning):
    """The store commit succeeded but the index could not be updated."""


def _thresholds(require: Iterable[Threshold | str]) -> list[Threshold]:
    return [r if isinstance(r, Threshold) else Threshold.parse(r) for r in require]


#: the weights file whose header ``show`` summarizes (or the index and its shards)
WEIGHTS = "model.safetensors"  # registry.formats.weights.SINGLE (that module loads numpy)


class Registry(AliasMixin, LifecycleMixin):
    """A store plus its SQL index.

    Args:
        store: store URL or Store (default ``$REGISTRY_STORE`` or ``./artifacts``).
        db: SQLAlchemy URL of the index (default ``$REGISTRY_DB`` or
            ``sqlite:///registry.db``); opened on first use, so pulling and
            checkpointing work without any database.
    """

    def __init__(self, store: str | Store | None = None, db: str | None = None) -> None:
        self.store = store if isinstance(store, Store) else open_store(store)
        self.db = db
        self._index: Index | None = None
        self.index_errors: list[str] = []
        #: the signed snapshots this object's writes made (registry.trust.snapshot.sign_snapshot)
        self.snapshots: list[dict[str, Any]] = []
        #: weights summaries (stored_summary), by the sha256s of the weights files
        #: (a long-lived Registry, such as `registry serve`'s, reads each header once)
        self._weights: dict[str, dict[str, Any]] = {}

    @property
    def index(self) -> Index:
        if self._index is None:
            self._index = Index(self.db)
        return self._index

    def _record(self, what: str, fn: Callable[[Session], Any]) -> None:
        try:
            self.index.run(fn)
        except Exception as e:  # the store commit stands whatever the index does
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            msg = (f"{what} is committed in the store but the index was not updated "
                   f"({reason}); run `registry index rebuild` to index it")
            self.index_errors.append(msg)
            warnings.warn(msg, IndexWriteWarning, stacklevel=3)

    def _query(self, fn: Callable[[Session], T]) -> T:
        return self.index.read(fn)

    # -- writes -----------------------------------------------------------------

    def checkpoint_manager(self, run_id: str, **kw: Any) -> CheckpointManager:
        """A CheckpointManager whose commits are also indexed (see its docs)."""
        from registry.checkpoint import CheckpointManager
        mgr = CheckpointManager(self.store, run_id, **kw)

        def hook(r: SaveResult) -> None:
            manifest = read_manifest(self.store, mgr.tree.prefix(r.step))
            self._record(f"{r.path}",
                         lambda s: record_checkpoint(s, run_id, r.step, r.path, manifest))

        mgr.on_commit.append(hook)
        mgr.on_retain.append(lambda steps: steps and self._record(
            f"retention of {run_id}", lambda s: forget_checkpoints(s, run_id, steps)))
        return mgr

    def loongsage_checkpointer(self, checkpoint_path: str, **kw: Any) -> LoongSageCheckpointer:
        """A LoongSageCheckpointer (seed 003) whose saves are also indexed.

        Each finalized save is recorded under the checkpointer's ``run_id``
        (given, or derived from the tree); rows of steps its retention
        (``keep``) deleted are dropped at the same time. Index failures are
        warnings, as for every write of this facade.
        """
        from registry.checkpoint.loongsage import LoongSageCheckpointer
        c = LoongSageCheckpointer(self.store, checkpoint_path, **kw)

        def hook(r: LoongSaveResult) -> None:
            manifest = read_manifest(self.store, c.tree.prefix(r.step))
            present = c.tree.steps()

            def write(s: Session) -> None:
                record_checkpoint(s, c.run_id, r.step, r.path, manifest)
                keep_only_checkpoints(s, c.run_id, present)
            self._record(r.path, write)

        c.on_commit.append(hook)
        return c

    def _releaser(self, progress: Progress | None) -> ModelRelease:
        from registry.release import ModelRelease
        rel = ModelRelease(self.store)
        rel.progress = progress or NULL
        rel.on_commit.append(lambda r: self._record(
            r.url, lambda s: record_release(s, self.store, r.model_id, r.version)))
        rel.on_commit.append(lambda r: release_event(self.store, r))
        return rel

    def create_release(self, run_id: str, step: int, model_id: str, version: str,
                       progress: Progress | None = None, **kw: Any) -> ReleaseResult:
        """:meth:`ModelRelease.create` (``progress``: registry.obs.progress), then index it."""
        return self._releaser(progress).create(run_id, step, model_id, version, **kw)

    def publish(self, model_dir: str | os.PathLike[str], model_id: str, version: str,
                progress: Progress | None = None, **kw: Any) -> ReleaseResult:
        """:meth:`ModelRelease.publish` (``progress``: registry.obs.progress), then index it."""
        return self._releaser(progress).publish(model_dir, model_id, version, **kw)

    def revoke(self, source_id: str, reason: str, *,
               sign_key: str | os.PathLike[str] | None = None) -> tuple[Revocation, bool]:
        """Revoke a data source: store (``ledger/``) first, then the index, then
        the event ``source.revoked`` (a repeated revocation appends none).
        With ``sign_key``, every model's signed snapshot is signed again, listing
        the revocation (:mod:`registry.trust.snapshot`; into :attr:`snapshots`).
        Raises EventNotRecordedError after both stand when the event fails."""
        rev, created = revoke(self.store, source_id, reason)
        self._resign(None, sign_key)
        self._record(f"revocation of {source_id}", lambda s: record_revocation(s, rev))
        if created:
            append_event(self.store, SOURCE_REVOKED, data={"source_id": source_id,
                         "reason": rev.revocation_reason}, actor=rev.actor)
        return rev, created

    def set_policy(self, model_id: str, require: Iterable[str],
                   signed_by: Iterable[PublicKey | Certificate] = (), *,
                   forbid_code: bool = False,
                   protected_aliases: dict[str, list[str]] | None = None,
                   sign_key: str | os.PathLike[str] | None = None) -> list[Threshold]:
        """Replace the model's policy: thresholds and (optionally) the public keys
        and CA certificates (``registry.trust.certs.load_anchor``) one of which must
        have signed every release (the ``signature`` gate), ``forbid_code``
        (the ``code`` gate: no pickle, no remote code) and protected aliases
        (alias -> key fingerprints, :mod:`registry.trust.alias_sign`); then the index
        and the event ``policy.changed`` (EventNotRecordedError if it fails).
        With ``sign_key``, a model that has a signed snapshot gets a new one
        listing the new policy.json (into :attr:`snapshots`; also when only the
        event failed); a model without one is not opted in. The key is checked
        before the policy is written (DocumentError, SigningUnavailableError)."""
        if sign_key is not None:
            from registry.trust.keys import check_private_key

            check_private_key(sign_key)
        parsed = set_policy(self.store, model_id, require, signed_by, forbid_code=forbid_code,
                            protected_aliases=protected_aliases)
        try:
            self._record(f"policy of {model_id}", lambda s: record_policy(s, model_id, parsed))
            append_event(self.store, POLICY_CHANGED, model_id=model_id,
                         data={"require": [str(t) for t in parsed],
                               "protected_aliases": sorted(protected_aliases or {})})
        finally:
            self._resign([model_id], sign_key, only_signed=True)
        return parsed

    def rebuild_index(self, progress: Progress | None = None) -> dict[str, Any]:
        """Recompute the whole index from the store (see
        :func:`registry.index.rebuild.rebuild`): counts per kind, and
        ``report``, the releases skipped, damaged, removed or kept against
        the listing, each with its reason.

        Raises:
            IndexDamagedError: the SQLite file is not a database: see
                :meth:`repair_index`.
        """
        from registry.index.rebuild import rebuild
        return rebuild(self.index, self.store, progress or NULL)

    def repair_index(self) -> str | None:
        """Move a damaged SQLite index file aside (``<file>.damaged-<time>``) so
        that :meth:`rebuild_index` starts from an empty one; returns the new
        name, or None when the index opens (nothing moved). Postgres and other
        failures raise as :attr:`index` does (IndexDatabaseError)."""
        if self._index is not None:
            return None
        try:
            self._index = Index(self.db)
        except IndexDamagedError:
            damaged = Index(self.db, check=False)
            aside = damaged.move_aside()
            self._index = Index(self.db)
            return aside
        except IndexOutOfDateError:
            # The rebuild replaces every row: bring the schema to head first;
            # a SQLite schema no migration can finish (half-applied by an
            # older registry killed mid-migration) is moved aside like a
            # damaged file.
            old = Index(self.db, check=False)
            try:
                old.upgrade()
            except (IndexReadOnlyError, IndexDamagedError):
                old.close()
                raise
            except IndexDatabaseError:
                if old.sqlite_path() is None:
                    old.close()
                    raise
                aside = old.move_aside()
                self._index = Index(self.db)
                return aside
            old.close()
            self._index = Index(self.db)
        return None

    # -- reads ------------------------------------------------------------------

    def resolve(self, ref: str) -> tuple[str, str]:
        """``model_id@version`` or ``model_id@alias`` -> ``(model_id, version)``."""
        model_id, name = parse_ref(ref)
        if name is None:
            raise InvalidNameError(f"{ref!r}: expected MODEL_ID@VERSION or MODEL_ID@ALIAS",
                                   name=ref)
        return model_id, resolve(self.store, model_id, name)

    def pull(self, ref: str, *, require_passing: bool = False, **kw: Any) -> PullResult:
        """Pull ``model_id@version``, ``model_id@alias`` or ``model_id`` (its
        alias ``main``, else its newest release passing its gates) to a model directory
        on this host: :func:`registry.pull.pull` (its keyword arguments and
        errors: ``to``, ``cache``, ``workers``, ``verify``, ``force``,
        ``fsync``, ...). Reads only the store, never the index.

        Raises:
            GateFailedError: ``require_passing`` and the release fails a gate
                now (live ledger, policy): nothing is downloaded.
        """
        model_id, given = parse_ref(ref)
        # resolved (a bare model id: registry.trust.release.default_version), admitted
        # and gated once, by the trust function (registry.trust.release)
        from registry.pull import pull
        return pull(self.store, model_id, given or "", require_passing=require_passing, **kw)

    def cache(self, path: str | os.PathLike[str] | None = None) -> PullCache:
        """This host's pull cache (``path``, else ``$REGISTRY_CACHE``...):
        ``ls()``, ``prune(...)``, ``verify()`` (registry.pull.cache_admin).
        Needs neither the store nor the index."""
        from registry.pull.cache_admin import PullCache
        return PullCache(path)

    def gate_check(self, model_id: str, version: str,
                   require: Iterable[Threshold | str] = ()) -> list[GateResult]:
        """Every gate of a committed release, evaluated now from the store."""
        from registry.release import ModelRelease
        return ModelRelease(self.store).check(model_id, version, require=require)

    def _known_model(self, s: Session, model_id: str) -> None:
        """Raise UnknownModelError unless the index holds ``model_id``: an empty
        answer must mean "none", never "no such model" (a typo).

        Raises:
            InvalidNameError: ``model_id`` is no model id (registry.rules.names).
        """
        check_model_id(model_id)
        known = queries.model_ids(s)
        if model_id not in known:
            names = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            raise UnknownModelError(
                f"{model_id}: no such model in the index "
                f"{self.index.engine.url.render_as_string(hide_password=True)} (models: "
                f"{names or 'none'}; if the store holds it, run `registry index rebuild`)",
                model_id=model_id, known=tuple(known))

    def passing(self, model_id: str, *, require: Iterable[Threshold | str] = (),
                latest: bool = False) -> list[dict[str, Any]]:
        """Versions passing every gate now (index), newest first; [] when none does.

        Raises:
            UnknownModelError: the index has no such model.
        """
        req = _thresholds(require)
        keys = self._store_gated(model_id)

        def work(s: Session) -> list[dict[str, Any]]:
            self._known_model(s, model_id)
            return queries.passing(s, model_id, require=req, latest=latest and not keys)
        rows = self._query(work)
        if not keys:
            return rows
        # The signature and code gates are read from the store (model.sig +
        # manifest of each candidate, a few KB each): the index holds neither.
        ok = [r for r in rows if all(g.passed for g in self._store_gates(model_id,
                                                                         r["version"]))]
        return ok[:1] if latest else ok

    def releases_for_source(self, source_id: str) -> list[dict[str, Any]]:
        return self._query(lambda s: queries.releases_for_source(s, source_id))

    def _store_gated(self, model_id: str) -> bool:
        """The model's policy has gates the index cannot answer (signing keys,
        ``forbid_code``)."""
        return bool(signed_by(self.store, model_id)) or forbids_code(self.store, model_id)

    def _store_gates(self, model_id: str, version: str) -> list[GateResult]:
        from registry.release.model_release import stored_code_gate
        return (stored_gate(self.store, model_id, version)
                + stored_code_gate(self.store, model_id, version))

    def show(self, model_id: str, version: str) -> dict[str, Any]:
        """The index's summary of one release, plus ``signature`` read from the
        store (``{"path", "fingerprint", "verified"}`` or None), the
        ``signature`` gate when the model's policy lists keys, and from the
        weights' headers (one file or the index and its shards):
        ``weights`` (stored tensor groups), ``weight_files`` (``[{"path",
        "bytes", "tensors", "parameters"}]``, the index first) and
        ``parameters`` (scalars stored); ``config_dtype``: the dtype
        config.json tells engines to load (``"bfloat16"``) or None; ``code``: the
        pickle and remote-code files it carries
        (:func:`registry.release.code.code_files`), and the ``code`` gate when
        the policy forbids code; ``other_weights``: ``{format: [paths]}`` of
        the sets of weights beside the safetensors
        (registry.formats.modeldir.other_weights)."""
        doc = self._query(lambda s: queries.show(s, model_id, version))
        # the index lists the release's files (it is immutable): a file it
        # lacks is not looked for in the store, a header it has is read once
        files = {f["path"]: f["sha256"] for f in doc["manifest"]}
        doc["signature"] = (signature_info(self.store, model_id, version)
                            if SIGNATURE in files else None)
        prefix = release_prefix(model_id, version)
        doc["code"] = code_files(
            files, lambda n: self.store.read_bytes(join(prefix, n), limit=limits.MAX_JSON_BYTES))
        doc["other_weights"] = other_weights(files)  # sets beside the safetensors
        sig_gate = self._store_gates(model_id, version)
        if sig_gate:
            doc["gates"] = [*doc["gates"], *(g.to_dict() for g in sig_gate)]
            doc["passed"] = doc["passed"] and all(g.passed for g in sig_gate)
        from registry.formats.weights import INDEX, weights_names
        from registry.release.weights_summary import stored_summary
        if WEIGHTS not in files and INDEX not in files:
            doc["weights"], doc["weight_files"], doc["parameters"] = [], [], 0
            doc["config_dtype"] = None
        else:
            # keyed by the digests of every weights file (one, or the index and
            # shards) and of config.json
            key = " ".join(files[p] for p in [*weights_names(files), "config.json"]
                           if p in files)
            if key not in self._weights:
                if len(self._weights) >= 4096:
                    self._weights.clear()
                self._weights[key] = stored_summary(
                    self.store, model_id, version,
                    files={f["path"]: f["bytes"] for f in doc["manifest"]})
            summary = copy.deepcopy(self._weights[key])
            doc["weights"], doc["weight_files"] = summary["groups"], summary["files"]
            doc["parameters"] = summary["parameters"]
            doc["config_dtype"] = summary["config_dtype"]
        return doc

    def ls(self, model_id: str | None = None) -> list[dict[str, Any]]:
        """Models (``model_id`` None), the models of one org (``model_id``
        ``"<org>/"``: those named ``<org>/<name>``), or the releases of ``model_id``.

        "Passing" (``passing``, ``newest_passing``) means what :meth:`passing`
        says: the index's gates, and the signature gate read from the store
        when a model's policy lists keys (one small read of each model's
        ``policy.json``).

        A model whose ``policy.json`` cannot be read is quarantined: its row
        says so (``quarantined``: why) and passes nothing; the other rows are
        answered as usual (issue 50 item 4).

        Raises:
            UnknownModelError: the index has no such model.
            InvalidNameError: ``model_id`` is no model id, or ``<org>/`` with a
                bad org.
        """
        if model_id is not None and model_id.endswith("/"):
            org = check_name(model_id[:-1], f"org of {model_id!r}")
            return [r for r in self.ls() if r["model_id"].startswith(f"{org}/")]

        def work(s: Session) -> list[dict[str, Any]]:
            if model_id is not None:
                self._known_model(s, model_id)
            return queries.ls(s, model_id)
        rows = self._query(work)
        if model_id is None:
            for r in rows:
                try:
                    if r["newest_passing"] is not None and self._store_gated(r["model_id"]):
                        ok = self.passing(r["model_id"], latest=True)
                        r["newest_passing"] = ok[0]["version"] if ok else None
                except StorageError:
                    raise
                except RegistryError as e:  # quarantined: this model fails closed, alone
                    r["newest_passing"] = None
                    r["quarantined"] = str(e).splitlines()[0]
            return rows
        try:
            gated = self._store_gated(model_id)
        except StorageError:
            raise
        except RegistryError as e:
            gated, why = False, str(e).splitlines()[0]
            for r in rows:
                r["passing"], r["quarantined"] = False, why
        if gated:
            for r in rows:
                if r["passing"]:
                    r["passing"] = all(g.passed for g in self._store_gates(model_id,
                                                                           r["version"]))
        return rows

    def diff(self, model_id: str, a: str, b: str) -> dict[str, Any]:
        return self._query(lambda s: queries.diff(s, model_id, a, b))

    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """Indexed checkpoints of a run (step, uri, manifest_sha256, bytes,
        created_at), oldest first."""
        return self._query(lambda s: queries.checkpoints(s, run_id))

    def revocations(self) -> list[dict[str, Any]]:
        return self._query(queries.revocations)

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
        self.store.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

