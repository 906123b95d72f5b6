"""One way to open a release for reading: the trust path pull and load share.

:func:`open_release` turns ``model_id@version|alias`` plus a trust policy into
an :class:`OpenedRelease` (the version, its validated manifest, the gates it
fails now and the signature check) or a refusal. ``registry pull`` (store and
``--from``), the weights reader (:mod:`registry.load`) and the Python API call
it; none of them resolves, checks yanks, gates or signatures on its own.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from registry.aliases import resolve
from registry.layout import release_prefix
from registry.lifecycle.guard import refuse_retired
from registry.manifest import MANIFEST, Manifest
from registry.store import Store, join
from registry.verify import read_manifest

if TYPE_CHECKING:
    from registry.gates import GateResult
    from registry.model_sig import SignatureCheck
    from registry.trust import Trust


def resolve_for_pull(store: Store, model_id: str, name: str, trust: Trust | None) -> str:
    """The version to read: with ``trust``, an alias only through a move signed
    by a trusted key (:func:`registry.alias_sign.trusted_alias_version`, whose
    errors it raises); else :func:`registry.aliases.resolve`."""
    if trust is None or store.exists(join(release_prefix(model_id, name), MANIFEST)):
        return resolve(store, model_id, name)
    from registry.alias_sign import trusted_alias_version

    return trusted_alias_version(store, model_id, name, trust)


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
    from registry.model_sig import precheck, read_signature, verify_bytes

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


def default_version(store: Store, model_id: str, trust: Trust | None = None) -> str:
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
    from registry.layout import alias_key, model_root

    if store.exists(alias_key(model_id, DEFAULT_ALIAS)):
        return resolve_for_pull(store, model_id, DEFAULT_ALIAS, trust)
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
    """

    model_id: str
    version: str
    prefix: str
    manifest: Manifest
    failed: list[GateResult] = field(default_factory=list)
    signature: Future[SignatureCheck] | None = None

    def signature_check(self) -> SignatureCheck | None:
        """Wait for the signature verification; raises SignatureError when it failed."""
        return self.signature.result() if self.signature is not None else None


def open_release(store: Store, model_id: str, name: str, *, trust: Trust | None = None,
                 allow_yanked: bool = False, gates: bool = False,
                 require_passing: bool = False) -> OpenedRelease:
    """Resolve ``model_id@name`` (``name`` empty: :func:`default_version`) and
    admit it for reading, in this order:
    the alias (signed moves only under ``trust``), deletion and yank, the gates
    (``gates`` or ``require_passing``), the manifest, the signature's claims.

    Raises:
        NotCommittedError, ManifestError, InvalidNameError: no such release,
            or a manifest that does not validate.
        ReleaseDeletedError, ReleaseYankedError: see
            :func:`registry.lifecycle.guard.refuse_retired`.
        GateFailedError: ``require_passing`` and a gate fails now.
        SignatureError: see :func:`start_signature_check` and
            :func:`resolve_for_pull`.
    """
    version = (resolve_for_pull(store, model_id, name, trust) if name
               else default_version(store, model_id, trust))
    refuse_retired(store, model_id, version, allow_yanked=allow_yanked)
    failed: list[GateResult] = []
    if gates or require_passing:
        from registry.release.failing import failing_gates

        failed = failing_gates(store, model_id, version)
        if failed and require_passing:
            from registry.errors import GateFailedError

            raise GateFailedError(f"{model_id}@{version}: refused (it fails its gates now; "
                                  "require passing)", failed)
    prefix = release_prefix(model_id, version)
    manifest = read_manifest(store, prefix)
    signature = start_signature_check(store, prefix, manifest, model_id, version, trust)
    return OpenedRelease(model_id, version, prefix, manifest, failed, signature)


__all__ = ["DEFAULT_ALIAS", "OpenedRelease", "default_version", "open_release",
           "resolve_for_pull", "start_signature_check"]
