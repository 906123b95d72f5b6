"""Signed metadata envelopes (TUF's shape) with the registry's own EC keys.

A signed document is stored as ``{"signed": {...}, "signatures": [{"keyid",
"sig"}]}`` -- the envelope of TUF's metadata -- where ``keyid`` is the
signing key's fingerprint (:mod:`registry.trust.keys`: sha256 of its public PEM)
and ``sig`` the base64 ECDSA/SHA-256 signature over :func:`canonical` of
``signed`` (sorted keys, no spaces, UTF-8), exactly the scheme of signed
alias moves (:mod:`registry.trust.alias_sign`). Needs the ``[signing]`` extra
(``cryptography``) to sign or verify; parsing needs nothing.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from registry.errors import SignatureError
from registry.trust.keys import sign_bytes
from registry.trust import Trust


def canonical(signed: dict[str, Any]) -> bytes:
    """What a signature covers: ``signed`` as canonical JSON bytes."""
    return json.dumps(signed, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def encode(envelope: dict[str, Any]) -> bytes:
    """The stored bytes of an envelope (canonical JSON and a newline)."""
    return json.dumps(envelope, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode() + b"\n"


def sign(signed: dict[str, Any], key_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The envelope of ``signed``, signed by the EC private key at ``key_path``.

    Raises:
        DocumentError, SigningUnavailableError: see :func:`registry.trust.keys.check_private_key`.
    """
    fingerprint, value = sign_bytes(key_path, canonical(signed))
    return {"signed": signed,
            "signatures": [{"keyid": fingerprint,
                            "sig": base64.b64encode(value).decode()}]}


def verify(envelope: object, trust: Trust, *, what: str, where: str) -> str:
    """Check that ``envelope`` carries a valid signature of a key ``trust``
    holds and has not revoked; returns that key's fingerprint.

    Raises:
        SignatureError: not an envelope, unsigned, signed only by keys this
            host does not trust or revoked, or no signature verifies (the
            document was changed after it was signed).
    """
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(envelope, dict) or not isinstance(envelope.get("signed"), dict) \
            or not isinstance(envelope.get("signatures"), list):
        raise SignatureError(where, f"{what}: not a signed document "
                                    '({"signed": {...}, "signatures": [...]})')
    data = canonical(envelope["signed"])
    why = "it carries no signature"
    for sig in envelope["signatures"][:16]:
        if not isinstance(sig, dict) or not isinstance(sig.get("keyid"), str):
            continue
        fp = sig["keyid"]
        if fp in trust.revoked:
            why = f"signed by key {fp[:16]}, revoked on this host ({trust.revoked[fp]})"
            continue
        key = next((k for k in trust.keys if k.fingerprint == fp), None)
        if key is None:
            why = (f"signed by key {fp[:16]}, which this host does not trust "
                   f"(it trusts {trust.describe()})")
            continue
        try:
            public = serialization.load_pem_public_key(key.pem)
            assert isinstance(public, ec.EllipticCurvePublicKey)
            public.verify(base64.b64decode(str(sig.get("sig", "")), validate=True), data,
                          ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            why = (f"the signature of key {fp[:16]} does not verify (the document was "
                   "changed after it was signed)")
            continue
        return fp
    raise SignatureError(where, f"{what}: {why}")


__all__ = ["canonical", "encode", "sign", "verify"]
