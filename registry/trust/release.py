"""THE trust function: a ref plus a trust policy -> a release admitted for reading, or a refusal.

:func:`open_release` is the one place that decides whether a release may be
read (issue 50 item 1). Every door calls it: ``registry pull`` (the store,
``--from`` a mirror, the cache), the weights reader (:mod:`registry.load`),
the Python API (``Registry.pull``), ``registry serve`` (the Hub routes, the
pages and JSON API where they hand out a release). None of them resolves an
alias, checks a deletion, a yank, the gates or a signature on its own.

In this order:

1. **the name**: a version as itself; an alias through its pointer -- with
   trust, only through a move signed by a trusted, unrevoked key
   (:func:`registry.trust.alias_sign.trusted_alias_version`). What another party
   (a mirror, a Hub) says an alias points to is a *hint*: the mirror must hand
   over the signed move itself (``registry.alias_move`` of its answer), which
   is checked here like a store's; a bare version number from it is never
   taken for an alias under trust;
2. with trust, **the signed snapshot and timestamp** of the model when it
   has them (:mod:`registry.trust.freshness`: expiry, versions never going
   back, each listed record as listed), then **the marks**
   (:mod:`registry.trust.marks`): the alias's move, the release's tombstone
   and yank record are never below what this host saw;
3. **deleted, yanked** (:func:`registry.lifecycle.guard.refuse_retired`);
4. **the gates** when asked (``gates``, ``require_passing``);
5. **the manifest**, validated;
6. **the signature** with trust: its claims before any byte of a file is read,
   its cryptography on a helper thread (``verify="async"``, a pull overlaps it
   with its download) or at once, cached per (manifest, trust) for
   :data:`SIGNATURE_TTL` seconds (``verify="now"`` with a :class:`Verdicts`).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from registry.refs.aliases import resolve
from registry.protocol.layout import release_prefix, yank_key
from registry.lifecycle.guard import refuse_retired
from registry.protocol.manifest import MANIFEST, Manifest
from registry.store import Store, join
from registry.protocol.verify import read_manifest

if TYPE_CHECKING:
    from registry.gating.gates import GateResult
    from registry.lifecycle.guard import Retired
    from registry.trust.model_sig import SignatureCheck
    from registry.trust import Trust
    from registry.trust.marks import Marks

#: seconds a signature verdict is reused by a :class:`Verdicts` (same manifest, same trust)
SIGNATURE_TTL = 60.0


def is_version(store: Store, model_id: str, name: str) -> bool:
    """Whether ``name`` is a committed version of ``model_id`` (its MANIFEST.json exists)."""
    return store.exists(join(release_prefix(model_id, name), MANIFEST))


def resolve_for_pull(store: Store, model_id: str, name: str, trust: Trust | None,
                     marks: Marks | None = None) -> str:
    """The version to read: with ``trust``, an alias only through a move signed
    by a trusted key (:func:`registry.trust.alias_sign.trusted_alias_version`, whose
    errors it raises); else :func:`registry.refs.aliases.resolve`. With ``marks``,
    an alias whose move is older than one this host saw is refused
    (RollbackError)."""
    if is_version(store, model_id, name):
        return resolve(store, model_id, name, is_version=True)
    if trust is None:
        version = resolve(store, model_id, name)
    else:
        from registry.trust.alias_sign import trusted_alias_version

        version = trusted_alias_version(store, model_id, name, trust)
    if marks is not None:  # after the signature: an older *signed* move is refused here
        from registry.refs.alias_history import read_head
        from registry.protocol.layout import alias_key

        head = read_head(store, model_id, name)
        if head.version != version:
            from registry.errors import PointerConflictError

            raise PointerConflictError(store.url_of(alias_key(model_id, name)),
                                       expected=version, actual=str(head.version))
        marks.check_alias(model_id, name, head.move.seq if head.move is not None else None,
                          store.url_of(alias_key(model_id, name)))
    return version


def check_marks(store: Store, model_id: str, version: str, marks: Marks,
                allow_yanked: bool) -> Retired:
    """The release's tombstone and yank record against this host's marks.

    Returns:
        what was read (:class:`registry.lifecycle.guard.Retired`), for
        :func:`registry.lifecycle.guard.refuse_retired` to decide on without
        reading the two records again.

    Raises:
        RollbackError: a tombstone seen before is gone, or the yank record is
            gone or older than one seen (not raised for the yank with
            ``allow_yanked``: the caller takes a yanked release anyway).
    """
    from registry.errors import DocumentError
    from registry.lifecycle import records
    from registry.lifecycle.guard import Retired
    from registry.lifecycle.tombstone import is_deleted
    from registry.trust.marks import RollbackError

    where = store.url_of(release_prefix(model_id, version))
    deleted = is_deleted(store, model_id, version)
    marks.check_deleted(model_id, version, deleted, where)
    try:
        record = records.load(store, yank_key(model_id, version))
    except DocumentError as e:
        return Retired(deleted, None, e)  # a garbled record fails the yanked gate
    try:
        marks.check_yank(model_id, version, record, store.url_of(yank_key(model_id, version)))
    except RollbackError:
        if not allow_yanked:
            raise
    return Retired(deleted, record)


@dataclass
class Verdicts:
    """Signature verdicts of a long-running process, per (manifest digest,
    trust): reused :data:`SIGNATURE_TTL` seconds; a new trust (a key added or
    revoked, :class:`registry.trust.source.TrustSource`) is a new key."""

    ttl: float = SIGNATURE_TTL
    #: (digest, id(trust)) -> (when, verdict, trust): the trust is kept so its id stays its own
    _table: dict[tuple[str, int], tuple[float, object, object]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, store: Store, prefix: str, manifest: Manifest, model_id: str,
              version: str, trust: Trust) -> SignatureCheck:
        """:func:`registry.trust.model_sig.verify_release`, or its verdict of the last ``ttl`` s."""
        from registry.errors import RegistryError
        from registry.trust.model_sig import verify_release

        key = (manifest.digest, id(trust))
        now = time.monotonic()
        with self._lock:
            hit = self._table.get(key)
        if hit is None or now - hit[0] >= self.ttl:
            try:
                verdict: object = verify_release(store, prefix, manifest, model_id=model_id,
                                                 version=version, trust=trust)
            except RegistryError as e:
                verdict = e
            with self._lock:
                if len(self._table) > 4096:
                    self._table.clear()
                self._table[key] = (now, verdict, trust)
            hit = (now, verdict, trust)
        if isinstance(hit[1], Exception):
            raise hit[1]
        return hit[1]  # type: ignore[return-value]


def start_signature_check(store: Store, prefix: str, manifest: Manifest, model_id: str,
                          version: str, trust: Trust | None) -> Future[SignatureCheck] | None:
    """Refuse a badly signed release before any byte of a file is read (JSON
    checks only), then run the library's cryptographic verification on a
    helper thread: its import costs about a second of CPU, which a pull
    overlaps with its download. Callers await the result before anything is
    placed (pull) or handed out (load).

    Raises:
        SignatureError: ``trust`` given and ``model.sig`` is missing or its
            claims do not match the release (the future raises the rest).
    """
    if trust is None:
        return None
    from registry.errors import SignatureError
    from registry.trust.model_sig import precheck, read_signature, verify_bytes

    where = store.url_of(prefix)
    data = read_signature(store, prefix, manifest)
    if data is None:
        raise SignatureError(where, "unsigned: no model.sig in the release (this host "
                                    "accepts only releases signed by a trusted key)")
    precheck(data, manifest.files, model_id=model_id, version=version, trust=trust,
             where=where)
    pool = ThreadPoolExecutor(1, thread_name_prefix="pull-signature")
    try:
        return pool.submit(verify_bytes, data, manifest.files, model_id=model_id,
                           version=version, trust=trust, where=where)
    finally:
        pool.shutdown(wait=False)


#: the alias a ref without ``@`` means first (the Hub's default revision)
DEFAULT_ALIAS = "main"


def default_version(store: Store, model_id: str, trust: Trust | None = None,
                    marks: Marks | None = None) -> str:
    """What ``model_id`` without ``@`` means (``registry pull model``, ``load``):
    the alias ``main`` when the model has one; else, without trust, the newest
    release (by its manifest's ``created_at``) that is neither deleted nor
    yanked and passes its gates now. With ``trust`` only ``main`` through a
    signed move counts: which release is "newest" is a store writer's to
    decide (delete the newer ones), a signed move is not.

    Raises:
        NotCommittedError: no ``main`` and no release passing its gates (or
            none at all); with trust, no ``main``.
        SignatureError: see :func:`resolve_for_pull`.
    """
    from registry.errors import NotCommittedError
    from registry.protocol.layout import alias_key, model_root

    if store.exists(alias_key(model_id, DEFAULT_ALIAS)):
        return resolve_for_pull(store, model_id, DEFAULT_ALIAS, trust, marks)
    where = store.url_of(model_root(model_id))
    if trust is not None:
        raise NotCommittedError(f"{where}: no alias {DEFAULT_ALIAS!r}; with trusted keys a "
                                f"ref without @ means {model_id}@{DEFAULT_ALIAS} moved by a "
                                "signed alias set: name the version or alias",
                                path=model_root(model_id))
    from registry.errors import RegistryError
    from registry.lifecycle.guard import refuse_retired
    from registry.release.failing import failing_gates

    dated = []
    for v in store.subdirs(model_root(model_id)):
        if v == "refs":
            continue
        try:
            dated.append((read_manifest(store, release_prefix(model_id, v)).created_at, v))
        except (RegistryError, OSError):
            continue  # not committed (or not readable): not a candidate
    for _, v in sorted(dated, reverse=True):
        try:
            refuse_retired(store, model_id, v)
        except RegistryError:
            continue
        if not failing_gates(store, model_id, v):
            return v
    raise NotCommittedError(f"{where}: no alias {DEFAULT_ALIAS!r} and no release passing its "
                            "gates now (name a version: MODEL_ID@VERSION)",
                            path=model_root(model_id))


@dataclass
class OpenedRelease:
    """A release resolved and admitted for reading.

    Attributes:
        model_id, version: what was resolved (an alias is already a version).
        prefix: the release's store prefix (``models/<model_id>/<version>``).
        manifest: its validated MANIFEST.json.
        failed: the gates it fails now (only evaluated when asked: ``gates``).
        signature: the running signature verification (None without trust).
        freshness: what protects its records (signed snapshot, or trust on first use).
    """

    model_id: str
    version: str
    prefix: str
    manifest: Manifest
    failed: list[GateResult] = field(default_factory=list)
    signature: Future[SignatureCheck] | None = None
    #: what protects the release's records from a store writer, in words: a signed
    #: snapshot (:mod:`registry.trust.freshness`) or trust on first use (the marks)
    freshness: str = ""

    def signature_check(self) -> SignatureCheck | None:
        """Wait for the signature verification; raises SignatureError when it failed."""
        return self.signature.result() if self.signature is not None else None


def open_release(store: Store, model_id: str, name: str, *, trust: Trust | None = None,
                 allow_yanked: bool = False, gates: bool = False,
                 require_passing: bool = False,
                 marks: Marks | Literal["host"] | None = "host",
                 verify: Literal["async", "now"] = "async",
                 verdicts: Verdicts | None = None,
                 manifests: Callable[[str, str], Manifest] | None = None) -> OpenedRelease:
    """Resolve ``model_id@name`` (``name`` empty: :func:`default_version`) and
    admit it for reading, in this order:
    the alias (signed moves only under ``trust``), this host's marks, deletion
    and yank, the gates (``gates`` or ``require_passing``), the manifest, the
    signature (its claims now; its cryptography on a thread with
    ``verify="async"``, else at once, through ``verdicts`` when given).

    ``marks``: this host's high-water marks (:mod:`registry.trust.marks`);
    ``"host"`` (the default): those of the store in this host's cache folder
    (``$REGISTRY_CACHE``), so a door that passes nothing is still protected;
    None: none (only for a caller that keeps no state, and says so).

    ``manifests``: ``(model_id, version) -> Manifest`` of a long-running
    process that keeps the manifests it read and validated (a committed
    release's manifest never changes; whether the release is still served is
    decided above, by its tombstone and yank record read now).

    Raises:
        NotCommittedError, ManifestError, InvalidNameError: no such release,
            or a manifest that does not validate.
        ReleaseDeletedError, ReleaseYankedError: see
            :func:`registry.lifecycle.guard.refuse_retired`.
        RollbackError: a record went back below this host's marks
            (:mod:`registry.trust.marks`; a SignatureError).
        GateFailedError: ``require_passing`` and a gate fails now.
        SignatureError: see :func:`start_signature_check` and
            :func:`resolve_for_pull`.
    """
    if marks == "host":
        from registry.trust.marks import Marks as _Marks

        marks = _Marks.for_store(store.url)
    assert not isinstance(marks, str)
    fresh = None
    if trust is not None:  # TUF's snapshot and timestamp, where the model has them
        from registry.trust.freshness import admit

        fresh = admit(store, model_id, trust, marks)
        if fresh is not None and not (name and is_version(store, model_id, name)):
            fresh.check_alias(store, name or DEFAULT_ALIAS)
    version = (resolve_for_pull(store, model_id, name, trust, marks) if name
               else default_version(store, model_id, trust, marks))
    if fresh is not None:
        fresh.check_release(store, version)
    seen = check_marks(store, model_id, version, marks, allow_yanked) if marks is not None \
        else None  # the records read once: refuse_retired decides on what the marks saw
    refuse_retired(store, model_id, version, allow_yanked=allow_yanked, seen=seen)
    failed: list[GateResult] = []
    if gates or require_passing:
        from registry.release.failing import failing_gates

        if marks is not None:  # a revocation a store writer deleted is not lifted
            from registry.protocol.layout import REVOCATIONS

            from registry.errors import StorageError

            try:
                names = {n[:-5] for n, d in store.list_dir(REVOCATIONS)
                         if not d and n.endswith(".json")}
            except StorageError:  # a mirror lists nothing; a store's failure: the gates say
                names = None
            if names is not None:
                marks.check_revoked(names, store.url_of(REVOCATIONS))
        failed = failing_gates(store, model_id, version)
        if failed and require_passing:
            from registry.errors import GateFailedError

            raise GateFailedError(f"{model_id}@{version}: not pulled (--require-passing, "
                                  "require_passing: it fails its gates now)", failed)
    prefix = release_prefix(model_id, version)
    manifest = (manifests(model_id, version) if manifests is not None
                else read_manifest(store, prefix))
    said = (manifest.meta.get("model_id"), manifest.meta.get("version"))
    # with trust, the signature says it; a manifest that names no release at
    # all (written by commit_local_directory without metadata, or before the
    # field) has nothing to contradict
    if trust is None and said != (None, None) and said != (model_id, version):
        from registry.errors import ManifestError

        raise ManifestError(store.url_of(join(prefix, MANIFEST)),
                            f"is the manifest of {said[0]}@{said[1]}, not {model_id}@{version} "
                            "(a release copied from another version?)")
    signature: Future[SignatureCheck] | None = None
    if trust is not None and verify == "now":
        check = (verdicts.check(store, prefix, manifest, model_id, version, trust)
                 if verdicts is not None else _verify_now(store, prefix, manifest, model_id,
                                                          version, trust))
        signature = Future()
        signature.set_result(check)
    else:
        signature = start_signature_check(store, prefix, manifest, model_id, version, trust)
    if fresh is not None:
        freshness = fresh.describe()
    else:
        from registry.trust.freshness import describe_tofu

        freshness = describe_tofu(marks) if trust is None else (
            "trusted keys, but no signed snapshot of this model: trust on first use for its "
            "records (registry snapshot sign)")
    return OpenedRelease(model_id, version, prefix, manifest, failed, signature, freshness)


def _verify_now(store: Store, prefix: str, manifest: Manifest, model_id: str, version: str,
                trust: Trust) -> SignatureCheck:
    from registry.trust.model_sig import verify_release

    return verify_release(store, prefix, manifest, model_id=model_id, version=version,
                          trust=trust)


__all__ = ["DEFAULT_ALIAS", "SIGNATURE_TTL", "OpenedRelease", "Verdicts", "check_marks",
           "default_version", "is_version", "open_release", "resolve_for_pull",
           "start_signature_check"]
