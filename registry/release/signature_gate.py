"""Signing a release as it is committed, and the ``signature`` gate (issue 17).

A model's policy may list public keys and CA certificates (``registry policy
set MODEL --require-signed-by PUB.pem --require-signed-by CA.crt``); then every
release of it must carry a ``model.sig`` made by one of the keys, or with a
signing certificate that chains to one of the CAs (valid now), covering
exactly its files (see :mod:`registry.trust.model_sig`). The gate is named
``signature`` and its reason names the signer: the key's fingerprint, or the
certificate's subject and fingerprint and its CA. Models without listed keys
have no signature gate, and the ``[signing]`` extra is then never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from registry.rules import limits
from registry.trust import certs
from registry.protocol.commit import DirectoryWriter
from registry.errors import GateFailedError, IntegrityError, SignatureError, UsageError
from registry.gating.gates import GateResult
from registry.trust.keys import PublicKey, check_private_key
from registry.protocol.layout import release_prefix
from registry.release import policy
from registry.trust.model_sig import (
    SIGNATURE,
    SignatureCheck,
    claimed_certificate,
    claimed_fingerprint,
    inspect_bytes,
    read_signature,
    sign_entries,
    verify_bytes,
    verify_release,
    warm_up,
)
from registry.store import Store, join
from registry.trust import Trust
from registry.protocol.verify import read_manifest

GATE = "signature"


@dataclass(frozen=True, slots=True)
class Signer:
    """A checked signing key: its file and its public half, and its
    certificate (with the chain above it) when it signs with one."""

    key_path: str
    public: PublicKey
    cert: certs.CertSigner | None = None


def signer(sign_key: str | os.PathLike[str] | None, *,
           sign_cert: str | os.PathLike[str] | None = None,
           cert_chain: Iterable[str | os.PathLike[str]] = ()) -> Signer | None:
    """Check ``--sign-key`` (and ``--sign-cert``, ``--cert-chain``) before
    anything is written (None: no signing).

    Raises:
        UsageError: ``sign_cert`` or ``cert_chain`` without ``sign_key``, or
            ``cert_chain`` without ``sign_cert``.
        DocumentError, SigningUnavailableError: see
            :func:`registry.trust.keys.check_private_key` and
            :func:`registry.trust.certs.check_signing_certificate` (a certificate
            not of the key, expired or not yet valid, without the signing usage,
            or a chain that does not link it to its CA).
    """
    chain = list(cert_chain)
    if sign_key is None:
        if sign_cert is not None or chain:
            raise UsageError("--sign-cert/--cert-chain: give the certificate's key with "
                             "--sign-key")
        return None
    if chain and sign_cert is None:
        raise UsageError("--cert-chain: give the signing certificate with --sign-cert")
    public = check_private_key(sign_key)
    cert = certs.check_signing_certificate(sign_key, sign_cert, chain) \
        if sign_cert is not None else None
    warm_up()
    return Signer(os.fspath(sign_key), public, cert)


def _passed(key: PublicKey | SignatureCheck) -> GateResult:
    if isinstance(key, PublicKey):
        return GateResult(GATE, True, f"signed by key {key.fingerprint} ({key.name})")
    return GateResult(GATE, True, f"signed by {key.describe()}")


def publish_gate(store: Store, model_id: str, signer: Signer | None, *,
                 carries_signature: bool) -> list[GateResult]:
    """The signature gate decided before a byte is written: the signing key must
    be one the policy lists. A directory that arrives signed is checked later,
    by :func:`seal`, once its digests are known."""
    keys = policy.signed_by(store, model_id)
    if not keys or (signer is None and carries_signature):
        return []
    listed = {k.fingerprint: k for k in keys if isinstance(k, PublicKey)}
    if signer is None:
        return [GateResult(GATE, False, "unsigned: the policy requires a signature by "
                                        f"{_names(keys)} (give --sign-key)")]
    if signer.cert is not None:
        return [_certificate_gate(signer.cert, keys)]
    if signer.public.fingerprint not in listed:
        return [GateResult(GATE, False, f"signing key {signer.public.fingerprint} is not one "
                                        f"the policy lists ({_names(keys)})")]
    return [_passed(listed[signer.public.fingerprint])]


def _certificate_gate(cert: certs.CertSigner, keys: list[PublicKey | certs.Certificate]
                      ) -> GateResult:
    """A signing certificate passes when its chain (the bundled ``--cert-chain``)
    verifies now up to a CA the policy lists."""
    trust = Trust.of(keys)
    leaf = cert.certificate
    if not trust.cas:
        return GateResult(GATE, False, f"signing certificate {leaf.subject!r} cannot satisfy a "
                                       f"policy that lists keys only ({_names(keys)})")
    try:
        anchor = certs.verify_chain(certs.der_of(leaf.pem, *cert.chain_pems), trust.cas)
    except ValueError as e:
        return GateResult(GATE, False, f"signing certificate {leaf.subject!r} does not chain "
                                       f"to a CA the policy lists ({_names(keys)}): {e}")
    return _passed(SignatureCheck(leaf.fingerprint, anchor.name, "", "certificate",
                                  leaf.subject, anchor.subject))


def _names(keys: list[PublicKey | certs.Certificate]) -> str:
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
        cert = signer.cert
        data = sign_entries(w.entries.values(), signer.key_path, model_id=model_id,
                            version=version, cert=cert.cert_path if cert else None,
                            chain=cert.chain_paths if cert else ())
        w.write_bytes(SIGNATURE, data)
        return results
    if SIGNATURE not in w.entries:
        return results
    where = store.url_of(join(w.prefix, SIGNATURE))
    data = store.read_bytes(join(w.staging, SIGNATURE), limit=limits.MAX_SIGNATURE_BYTES)
    inspect_bytes(data, w.entries.values(), model_id=model_id, version=version, where=where)
    keys = policy.signed_by(store, model_id)
    if not keys:
        return results
    try:
        check = verify_bytes(data, w.entries.values(), model_id=model_id, version=version,
                             trust=Trust.of(keys), where=where)
    except SignatureError as e:
        raise GateFailedError(store.url_of(w.prefix),
                              [*results, GateResult(GATE, False, e.reason)]) from None
    return (*results, _passed(check))


def stored_gate(store: Store, model_id: str, version: str) -> list[GateResult]:
    """The signature gate of a committed release, from the store (small reads:
    its manifest and model.sig); [] when the policy lists no key."""
    keys = policy.signed_by(store, model_id)
    if not keys:
        return []
    prefix = release_prefix(model_id, version)
    manifest = read_manifest(store, prefix)
    try:
        check = verify_release(store, prefix, manifest, model_id=model_id, version=version,
                               trust=Trust.of(keys))
    except (SignatureError, IntegrityError) as e:
        return [GateResult(GATE, False, e.reason)]
    return [_passed(check)]


def signature_info(store: Store, model_id: str, version: str) -> dict[str, Any] | None:
    """What ``registry show`` reports: ``{"path", "kind", "fingerprint",
    "verified"}``, plus ``"subject"`` and ``"issuer"`` for ``kind ==
    "certificate"``; None for an unsigned release. ``fingerprint`` is the key
    the bundle names (``verificationMaterial.publicKey.hint``) or the sha256
    of its signing certificate's DER; ``subject``/``issuer`` are that
    certificate's (RFC 4514). ``verified`` is True/False when the model's
    policy lists keys or CAs (checked against them), else None."""
    prefix = release_prefix(model_id, version)
    manifest = read_manifest(store, prefix)
    try:
        data = read_signature(store, prefix, manifest)
    except (SignatureError, IntegrityError):
        return {"path": SIGNATURE, "kind": None, "fingerprint": None, "verified": False}
    if data is None:
        return None
    verified = None
    if policy.signed_by(store, model_id):
        verified = all(g.passed for g in stored_gate(store, model_id, version))
    cert = claimed_certificate(data)
    if cert is not None:
        return {"path": SIGNATURE, "kind": "certificate", "fingerprint": cert.fingerprint,
                "subject": cert.subject, "issuer": cert.issuer, "verified": verified}
    return {"path": SIGNATURE, "kind": "key", "fingerprint": claimed_fingerprint(data),
            "verified": verified}
