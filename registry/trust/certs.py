"""Certificates from a local CA for signed releases (issue 17).

The OpenSSF ``model_signing`` library signs offline with a private key plus
its X.509 signing certificate and chain (``model_signing sign certificate``)
and verifies against trusted root certificates. The bundle then carries
``verificationMaterial.x509CertificateChain`` (signing certificate first)
instead of a key hint. This module reads and checks such certificates;
:mod:`registry.trust.local_ca` makes them::

    registry keys ca ca.pem --subject "CN=Release CA,O=Acme"      # ca.pem (0600) + ca.crt
    registry keys issue release.pem --ca ca.pem --subject "CN=release-bot,O=Acme"
                                                  # release.pem (0600) + release.crt

A certificate's **fingerprint** is the sha256 hex of its DER encoding (what
``openssl x509 -fingerprint -sha256`` prints, without colons); its
**identity** is its subject as an RFC 4514 string.

Chains are validated with the library's own validator (OpenSSL through
pyOpenSSL, ``X509StoreContext``), at *this host's current time*: the library
alone validates at the signing certificate's ``notBefore`` (it has no
timestamp of the signing), which would accept a certificate long expired, so
an expired or not-yet-valid certificate anywhere in the chain is refused here
(see docs/decisions.md). Signing certificates need the usage the library
requires ExtendedKeyUsage ``codeSigning`` (or an EKU the operator names;
:mod:`registry.trust.cert_trust`, which also says how revocation identifies a certificate).

Needs the ``[signing]`` extra (``cryptography``, ``pyOpenSSL``).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import DocumentError, UsageError
from registry.trust.keys import PublicKey, check_private_key, fingerprint_of, public_pem
from registry.trust.keys import read_pem, require_signing, unavailable

#: default lifetimes, days.
CA_DAYS = 3650
LEAF_DAYS = 365


def _x509() -> Any:
    require_signing()
    try:
        from cryptography import x509
    except ImportError as e:
        raise unavailable(e) from None
    return x509


@dataclass(frozen=True, slots=True)
class Certificate:
    """One X.509 certificate read from a file (a trusted CA, or a signing certificate).

    Attributes:
        path: the file it came from (or ``model.sig`` for a bundled one).
        pem: its PEM encoding; ``fingerprint``: sha256 hex of its DER (a
            label: re-encoding changes it, so it never identifies a revocation);
        subject, issuer: RFC 4514 strings.
        serial: the serial number, lower-case hex (with ``issuer``: its identity).
        key_fingerprint: the fingerprint of its public key.
    """

    path: str
    pem: bytes
    fingerprint: str
    subject: str
    issuer: str
    serial: str = ""
    key_fingerprint: str = ""

    @property
    def name(self) -> str:
        return Path(self.path).name


def describe(cert: Any, path: str) -> Certificate:
    """The Certificate of a ``cryptography`` certificate object."""
    from cryptography.hazmat.primitives.serialization import Encoding

    der = cert.public_bytes(Encoding.DER)
    return Certificate(path, cert.public_bytes(Encoding.PEM), hashlib.sha256(der).hexdigest(),
                       cert.subject.rfc4514_string(), cert.issuer.rfc4514_string(),
                       format(cert.serial_number, "x"),
                       fingerprint_of(public_pem(cert.public_key())))


def _read_certs(path: str | os.PathLike[str], what: str) -> list[Any]:
    x509 = _x509()
    where, data = read_pem(path, what)
    if b"PRIVATE KEY" in data:
        raise DocumentError(where, f"holds a private key: give the {what} (PEM) instead")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise DocumentError(where, f"not a PEM certificate ({e})") from None
    return list(certs)


def load_certificates(path: str | os.PathLike[str], *, what: str = "certificate"
                      ) -> list[Certificate]:
    """Every certificate of a PEM file (a CA file may hold a root and its
    intermediates).

    Raises:
        DocumentError: unreadable, a private key, or no PEM certificate in it.
        SigningUnavailableError: the ``[signing]`` extra is not installed.
    """
    return [describe(c, os.fspath(path)) for c in _read_certs(path, what)]


def is_certificate_file(path: str | os.PathLike[str]) -> bool:
    """True when the file holds a PEM certificate (a CA for ``--require-signed-by``)."""
    try:
        return b"-----BEGIN CERTIFICATE-----" in Path(path).read_bytes()
    except OSError:
        return False


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def check_current(cert: Any, where: str, *, now: dt.datetime | None = None) -> None:
    """Refuse a certificate outside its validity period at ``now`` (default: now).

    Raises:
        DocumentError: expired, or not valid yet, naming the date.
    """
    now = now or _now()
    subject = cert.subject.rfc4514_string()
    if cert.not_valid_after_utc < now:
        raise DocumentError(where, f"certificate {subject!r} expired on "
                                   f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")
    if cert.not_valid_before_utc > now:
        raise DocumentError(where, f"certificate {subject!r} is not valid before "
                                   f"{cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}")


@dataclass(frozen=True, slots=True)
class CertSigner:
    """A checked signing certificate: the files the library's signer reads,
    and what a gate reports."""

    key_path: str
    cert_path: str
    chain_paths: tuple[str, ...]
    certificate: Certificate
    chain_pems: tuple[bytes, ...]


def check_signing_certificate(key_path: str | os.PathLike[str],
                              cert_path: str | os.PathLike[str],
                              chain_paths: Iterable[str | os.PathLike[str]] = ()) -> CertSigner:
    """Check ``--sign-key`` + ``--sign-cert`` (+ ``--cert-chain``) before anything
    is written.

    Raises:
        UsageError: no chain (the library cannot sign without one).
        DocumentError: the key is not an EC private key; the certificate file
            is not one PEM certificate, is not the key's, is expired or not
            valid yet, or lacks the signing usage; a chain file is not PEM
            certificates or holds an expired or not-yet-valid certificate; the
            chain does not link the certificate to its CA (:func:`check_links`).
        SigningUnavailableError: the ``[signing]`` extra is not installed.
    """
    chain_paths = list(chain_paths)
    if not chain_paths:
        raise UsageError(f"--sign-cert {os.fspath(cert_path)}: give --cert-chain too (at least "
                         "the issuing CA's certificate; model_signing signs with a chain)")
    key = check_private_key(key_path)
    where = os.fspath(cert_path)
    certs = _read_certs(where, "signing certificate")
    if len(certs) != 1:
        raise DocumentError(where, f"holds {len(certs)} certificates: give the signing "
                                   "certificate alone and its CAs with --cert-chain")
    leaf = certs[0]
    if fingerprint_of(public_pem(leaf.public_key())) != key.fingerprint:
        raise DocumentError(where, f"is not the certificate of {os.fspath(key_path)} (its "
                                   "public key differs from the signing key's)")
    check_current(leaf, where)
    from registry.trust.cert_trust import signing_usage_error

    why = signing_usage_error(leaf)
    if why is not None:
        raise DocumentError(where, f"cannot sign: {why}")
    chain: list[tuple[Any, str]] = []
    for p in chain_paths:
        for c in _read_certs(p, "certificate chain"):
            check_current(c, os.fspath(p))
            chain.append((c, os.fspath(p)))
    check_links(leaf, where, chain)
    return CertSigner(os.fspath(key_path), where, tuple(os.fspath(p) for p in chain_paths),
                      describe(leaf, where), tuple(describe(c, p).pem for c, p in chain))


def _issued_by(cert: Any, ca: Any) -> bool:
    """``ca`` directly issued ``cert``: its subject is ``cert``'s issuer and its
    public key verifies ``cert``'s signature."""
    from cryptography.exceptions import InvalidSignature

    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def check_links(leaf: Any, where: str, chain: Sequence[tuple[Any, str]]) -> None:
    """Refuse a chain (certificate, file) that does not link the signing
    certificate (file ``where``) to its CA: a chain certificate must have issued
    it (issuer name and signature), another that one, and so on, in any order;
    every chain certificate must be on that path.

    Raises:
        DocumentError: names the chain file(s) and ``where``.
    """
    left, current = list(chain), leaf
    while up := next((c for c in left if _issued_by(current, c[0])), None):
        left.remove(up)
        current = up[0]
    if len(left) == len(chain):
        files = ", ".join(dict.fromkeys(p for _, p in chain))
        issuer = leaf.issuer.rfc4514_string()
        named = [p for c, p in chain if c.subject == leaf.issuer]
        why = (f"{issuer!r} in {named[0]} did not sign it (the signature does not verify "
               "with that certificate's public key)") if named else (
            f"its issuer {issuer!r} is not there (the chain holds "
            f"{', '.join(repr(c.subject.rfc4514_string()) for c, _ in chain)})")
        raise DocumentError(files, f"--cert-chain does not link --sign-cert {where} to "
                                   f"its CA: {why}")
    if left:
        cert, path = left[0]
        raise DocumentError(path, f"--cert-chain certificate "
                                  f"{cert.subject.rfc4514_string()!r} is not on the path "
                                  f"from --sign-cert {where} to its CA")


def bundle_chain(bundle: dict[str, Any]) -> list[bytes] | None:
    """The DER certificates of a bundle's ``x509CertificateChain`` (signing
    certificate first), or None for a bundle without one (a key bundle).

    Raises:
        ValueError, KeyError, TypeError: a malformed chain.
    """
    material = bundle["verificationMaterial"]
    chain = material.get("x509CertificateChain")
    if chain is None:
        return None
    ders = [base64.b64decode(c["rawBytes"], validate=True) for c in chain["certificates"]]
    if not ders:
        raise ValueError("empty x509CertificateChain")
    return ders


def der_of(*pems: bytes) -> list[bytes]:
    """The DER encodings of PEM certificates (one each)."""
    x509 = _x509()
    from cryptography.hazmat.primitives.serialization import Encoding

    return [x509.load_pem_x509_certificate(p).public_bytes(Encoding.DER) for p in pems]


def parse_der(ders: Sequence[bytes]) -> list[Certificate]:
    """Certificates of DER bytes (from a bundle).

    Raises:
        ValueError: not a DER certificate.
    """
    x509 = _x509()
    return [describe(x509.load_der_x509_certificate(d), "model.sig") for d in ders]


def verify_chain(ders: Sequence[bytes], cas: Sequence[Certificate], *,
                 now: dt.datetime | None = None) -> Certificate:
    """Validate a signing chain (DER, signing certificate first) against trusted
    CAs at ``now`` (default: now), as the library does but at this host's time.

    Returns:
        The trusted CA certificate the chain ends in.

    Raises:
        ValueError: the chain does not verify, with OpenSSL's reason and the
            subject of the certificate it failed on (another CA, expired,
            not yet valid, bad signature).
    """
    x509 = _x509()
    try:
        from OpenSSL import crypto
    except ImportError as e:
        raise unavailable(e) from None
    store = crypto.X509Store()
    anchors: dict[str, Certificate] = {}
    for ca in cas:
        store.add_cert(crypto.X509.from_cryptography(x509.load_pem_x509_certificate(ca.pem)))
        anchors[ca.fingerprint] = ca
    store.set_time(now or _now())
    certs = [crypto.X509.from_cryptography(x509.load_der_x509_certificate(d)) for d in ders]
    ctx = crypto.X509StoreContext(store, certs[0], certs[1:])
    try:
        verified = ctx.get_verified_chain()
    except crypto.X509StoreContextError as e:
        failed = e.certificate.to_cryptography().subject.rfc4514_string() \
            if e.certificate is not None else "?"
        raise ValueError(f"{e} (certificate {failed!r})") from None
    root = describe(verified[-1].to_cryptography(), "")
    return anchors.get(root.fingerprint, root)


def key_fingerprint(cert_pem: bytes) -> str:
    """The key fingerprint (as ``registry keys fingerprint``) of a certificate's
    public key: revoking a key revokes every certificate of it."""
    x509 = _x509()
    return fingerprint_of(public_pem(x509.load_pem_x509_certificate(cert_pem).public_key()))


def load_anchor(path: str | os.PathLike[str]) -> list[PublicKey | Certificate]:
    """A ``--require-signed-by`` file: a public key, or the CA certificate(s)
    of a PEM file.

    Raises:
        DocumentError: neither a public key nor PEM certificates.
    """
    from registry.trust.keys import load_public_key

    if is_certificate_file(path):
        return list(load_certificates(path, what="CA certificate"))
    return [load_public_key(path)]
