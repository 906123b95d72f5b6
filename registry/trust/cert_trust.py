"""Which certificates a signature depends on, and whether any of them is revoked.

A certificate's DER bytes are not its identity: anyone can re-encode a
certificate without any key -- an ECDSA signature ``(r, s)`` verifies as
``(r, n - s)`` too -- and get new DER with a new sha256 that a list of revoked
DER hashes does not hold. So a certificate is revoked here by what no
re-encoding changes (RFC 5280, section 5.3: a CRL names issuer and serial):

* its **issuer and serial number** (the issuer as an RFC 4514 string), and
* its **public key** (the key fingerprint of :mod:`registry.trust.keys`): revoking a
  certificate revokes every certificate of its key, a CA's too.

And a revoked intermediate must not come back by leaving the bundle: every
certificate on *any* path that can be built from the signing certificate to
a trusted CA -- through the bundle's chain or through the host's CA folder --
is checked (:func:`path_certificates`), not only the chain one validator chose.

Signing certificates need ExtendedKeyUsage codeSigning (RFC 5280, 4.2.1.12),
or one of the OIDs the operator names in ``$REGISTRY_SIGNING_EKU``
(comma-separated dotted OIDs); KeyUsage, when present, must allow
digitalSignature. A TLS server certificate of the same CA (serverAuth only)
cannot sign models.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from registry.errors import UsageError
from registry.trust.keys import fingerprint_of, public_pem

#: $REGISTRY_SIGNING_EKU: the ExtendedKeyUsage OIDs a signing certificate may carry
EKU_ENV = "REGISTRY_SIGNING_EKU"
CODE_SIGNING = "1.3.6.1.5.5.7.3.3"
#: the most certificates one bundle's chain may hold (registry.rules.limits style cap)
MAX_CHAIN = 16


def identity(cert: Any) -> tuple[str, str]:
    """``(issuer, serial)`` of a ``cryptography`` certificate: the issuer as an
    RFC 4514 string, the serial as lower-case hex."""
    return cert.issuer.rfc4514_string(), format(cert.serial_number, "x")


def key_of(cert: Any) -> str:
    """The fingerprint of a certificate's public key (``registry keys fingerprint``)."""
    return fingerprint_of(public_pem(cert.public_key()))


def signing_ekus(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The EKU OIDs accepted on signing certificates: codeSigning, or those in
    ``$REGISTRY_SIGNING_EKU``.

    Raises:
        UsageError: a listed value is not a dotted OID.
    """
    raw = (os.environ if env is None else env).get(EKU_ENV, "").strip()
    if not raw:
        return frozenset({CODE_SIGNING})
    oids = {v.strip() for v in raw.split(",") if v.strip()}
    for oid in oids:
        if not all(part.isdigit() for part in oid.split(".")) or oid.count(".") < 1:
            raise UsageError(f"${EKU_ENV}: {oid!r} is not a dotted OID such as {CODE_SIGNING} "
                             "(codeSigning)")
    return frozenset(oids)


def signing_usage_error(cert: Any, ekus: frozenset[str] | None = None) -> str | None:
    """Why ``cert`` may not sign models (no EKU among ``ekus``, KeyUsage without
    digitalSignature), or None when it may."""
    from cryptography import x509

    allowed = signing_ekus() if ekus is None else ekus
    try:
        ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
        if not ku.digital_signature:
            return "its KeyUsage does not allow digitalSignature"
    except x509.ExtensionNotFound:
        pass
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return ("it has no ExtendedKeyUsage (signing certificates need codeSigning, or an "
                f"EKU named in ${EKU_ENV})")
    have = {o.dotted_string for o in eku}
    if have & allowed:
        return None
    names = ", ".join(sorted(getattr(o, "_name", o.dotted_string) for o in eku)) or "none"
    return (f"its ExtendedKeyUsage ({names}) is not codeSigning or an EKU named in "
            f"${EKU_ENV}")


def _issued_by(cert: Any, ca: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def path_certificates(leaf: Any, pool: Sequence[Any]) -> list[Any]:
    """``leaf`` and every certificate of ``pool`` on some issuing path up from
    it (each one's subject names the previous one's issuer and its key
    verifies that one's signature), whatever validator would pick."""
    seen, frontier, out = set(), [leaf], [leaf]
    while frontier:
        current = frontier.pop()
        for ca in pool:
            if id(ca) not in seen and ca.subject == current.issuer and _issued_by(current, ca):
                seen.add(id(ca))
                out.append(ca)
                if ca.subject != ca.issuer:  # a root ends its path
                    frontier.append(ca)
    return out


def revoked_reason(cert: Any, revoked_keys: Mapping[str, str],
                   revoked_ids: Mapping[tuple[str, str], str], der_fingerprint: str
                   ) -> str | None:
    """Why ``cert`` is revoked (by issuer + serial, by its key, or by an old
    DER-fingerprint entry), or None."""
    by_id = revoked_ids.get(identity(cert))
    if by_id is not None:
        return by_id
    by_key = revoked_keys.get(key_of(cert))
    if by_key is not None:
        return by_key
    return revoked_keys.get(der_fingerprint)
