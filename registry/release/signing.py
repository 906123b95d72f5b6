"""Signing a release as it is committed, and the ``signature`` gate (issue 17).

A model's policy may list public keys (``registry policy set MODEL
--require-signed-by PUB.pem``); then every release of it must carry a
``model.sig`` made by one of them, covering exactly its files (see
:mod:`registry.signing`). The gate is named ``signature`` and its reason names
the signing key's fingerprint. Models without listed keys have no signature
gate, and the ``[signing]`` extra is then never imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from registry.commit import DirectoryWriter
from registry.errors import GateFailedError, IntegrityError, SignatureError
from registry.gates import GateResult
from registry.keys import PublicKey, Trust, check_private_key
from registry.release import policy
from registry.signing import (
    SIGNATURE,
    claimed_fingerprint,
    inspect_bytes,
    read_signature,
    sign_entries,
    verify_bytes,
    verify_release,
    warm_up,
)
from registry.store import Store, join
from registry.verify import read_manifest

GATE = "signature"


@dataclass(frozen=True, slots=True)
class Signer:
    """A checked signing key: its file and its public half."""

    key_path: str
    public: PublicKey


def signer(sign_key: str | os.PathLike[str] | None) -> Signer | None:
    """Check ``--sign-key`` before anything is written (None: no signing).

    Raises:
        DocumentError, SigningUnavailableError: see :func:`registry.keys.check_private_key`.
    """
    if sign_key is None:
        return None
    public = check_private_key(sign_key)
    warm_up()
    return Signer(os.fspath(sign_key), public)


def _passed(key: PublicKey | str, name: str = "") -> GateResult:
    fp, label = (key.fingerprint, key.name) if isinstance(key, PublicKey) else (key, name)
    return GateResult(GATE, True, f"signed by key {fp}" + (f" ({label})" if label else ""))


def publish_gate(store: Store, model_id: str, signer: Signer | None, *,
                 carries_signature: bool) -> list[GateResult]:
    """The signature gate decided before a byte is written: the signing key must
    be one the policy lists. A directory that arrives signed is checked later,
    by :func:`seal`, once its digests are known."""
    keys = policy.signed_by(store, model_id)
    if not keys or (signer is None and carries_signature):
        return []
    listed = {k.fingerprint: k for k in keys}
    if signer is None:
        return [GateResult(GATE, False, "unsigned: the policy requires a signature by "
                                        f"{_names(keys)} (give --sign-key)")]
    if signer.public.fingerprint not in listed:
        return [GateResult(GATE, False, f"signing key {signer.public.fingerprint} is not one "
                                        f"the policy lists ({_names(keys)})")]
    return [_passed(listed[signer.public.fingerprint])]


def _names(keys: list[PublicKey]) -> str:
    return ", ".join(f"{k.name} ({k.fingerprint[:16]})" for k in keys)


def seal(w: DirectoryWriter, signer: Signer | None, store: Store, model_id: str,
         version: str, results: tuple[GateResult, ...]) -> tuple[GateResult, ...]:
    """Just before the commit: write ``model.sig`` (signing the digests the
    writer computed), or check a carried one; returns the gate results.

    Raises:
        SignatureError: a carried model.sig is malformed, names another release
            or does not cover exactly the files written.
        GateFailedError: the policy lists keys and a carried signature is not
            made by one of them.
    """
    if signer is not None:
        data = sign_entries(w.entries.values(), signer.key_path, model_id=model_id,
                            version=version)
        w.write_bytes(SIGNATURE, data)
        return results
    if SIGNATURE not in w.entries:
        return results
    where = store.url_of(join(w.prefix, SIGNATURE))
    data = store.read_bytes(join(w.staging, SIGNATURE))
    inspect_bytes(data, w.entries.values(), model_id=model_id, version=version, where=where)
    keys = policy.signed_by(store, model_id)
    if not keys:
        return results
    try:
        check = verify_bytes(data, w.entries.values(), model_id=model_id, version=version,
                             trust=Trust(tuple(keys)), where=where)
    except SignatureError as e:
        raise GateFailedError(store.url_of(w.prefix),
                              [*results, GateResult(GATE, False, e.reason)]) from None
    return (*results, _passed(check.fingerprint, check.key))


def stored_gate(store: Store, model_id: str, version: str) -> list[GateResult]:
    """The signature gate of a committed release, from the store (small reads:
    its manifest and model.sig); [] when the policy lists no key."""
    keys = policy.signed_by(store, model_id)
    if not keys:
        return []
    prefix = join("models", model_id, version)
    manifest = read_manifest(store, prefix)
    try:
        check = verify_release(store, prefix, manifest, model_id=model_id, version=version,
                               trust=Trust(tuple(keys)))
    except (SignatureError, IntegrityError) as e:
        return [GateResult(GATE, False, e.reason)]
    return [_passed(check.fingerprint, check.key)]


def signature_info(store: Store, model_id: str, version: str) -> dict[str, Any] | None:
    """What ``registry show`` reports: ``{"path", "fingerprint", "verified"}``,
    or None for an unsigned release. ``fingerprint`` is the key the bundle names
    (``verificationMaterial.publicKey.hint``); ``verified`` is True/False when
    the model's policy lists keys (checked against them), else None."""
    prefix = join("models", model_id, version)
    manifest = read_manifest(store, prefix)
    try:
        data = read_signature(store, prefix, manifest)
    except (SignatureError, IntegrityError):
        return {"path": SIGNATURE, "fingerprint": None, "verified": False}
    if data is None:
        return None
    verified = None
    if policy.signed_by(store, model_id):
        verified = all(g.passed for g in stored_gate(store, model_id, version))
    return {"path": SIGNATURE, "fingerprint": claimed_fingerprint(data), "verified": verified}
