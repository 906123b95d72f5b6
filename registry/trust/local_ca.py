"""A local CA for signed releases: ``registry keys ca`` and ``registry keys issue``
(issue 17; split from :mod:`registry.trust.certs`, which reads and checks what these make).

    registry keys ca ca.pem --subject "CN=Release CA,O=Acme"      # ca.pem (0600) + ca.crt
    registry keys issue release.pem --ca ca.pem --subject "CN=release-bot,O=Acme"

Keys are P-256, written mode 0600 and never over an existing file; certificates
are written next to them (``.crt``). Needs the ``[signing]`` extra.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

from registry.trust.certs import (
    CA_DAYS,
    LEAF_DAYS,
    Certificate,
    _now,
    _read_certs,
    _x509,
    check_current,
    describe,
)
from registry.errors import DocumentError, UsageError
from registry.trust.keys import _create as create_exclusive
from registry.trust.keys import check_private_key, fingerprint_of, public_pem


def _name(subject: str) -> Any:
    x509 = _x509()
    try:
        name = x509.Name.from_rfc4514_string(subject)
    except ValueError as e:
        why = f" ({e})" if str(e) else ""
        raise UsageError(f"--subject {subject!r}: not an RFC 4514 name such as "
                         f"'CN=Release CA,O=Acme'{why}") from None
    if not list(name):
        raise UsageError(f"--subject {subject!r}: must not be empty")
    return name


def _cert_path(key_path: Path, cert_path: str | os.PathLike[str] | None) -> Path:
    if not key_path.name:
        raise UsageError(f"private key path {str(key_path)!r}: must name a file")
    if cert_path is not None:
        if not str(cert_path).strip():
            raise UsageError("--cert: must name a file")
        return Path(cert_path)
    if key_path.suffix == ".crt":
        raise UsageError(f"{key_path}: the certificate would be written over the key "
                         "(the default --cert is the key's path with .crt); give --cert")
    return key_path.with_suffix(".crt")


def _refuse_existing(*paths: Path) -> None:
    for p in paths:
        if p.exists() or p.is_symlink():
            raise UsageError(f"{p}: exists; refusing to overwrite a key or certificate")


def _write_pair(key_path: Path, cert_path: Path, key: Any, cert: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    create_exclusive(key_path, private, 0o600)
    try:
        create_exclusive(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    except BaseException:
        key_path.unlink(missing_ok=True)
        raise


#: the longest validity accepted, days (100 years; X.509 dates end in 9999).
MAX_DAYS = 36525


def _days(days: int) -> dt.timedelta:
    if not 1 <= days <= MAX_DAYS:
        raise UsageError(f"--days {days}: must be from 1 to {MAX_DAYS}")
    return dt.timedelta(days=days)


def _builder(x509: Any, name: Any, issuer: Any, key: Any, now: dt.datetime,
             not_after: dt.datetime, *, ca: bool) -> Any:
    """A certificate of ``key`` named ``name``: a CA's (keyCertSign, cRLSign) or a
    signer's (digitalSignature), valid from five minutes before ``now``."""
    return (x509.CertificateBuilder().subject_name(name).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=not ca, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=ca,
                crl_sign=ca, encipher_only=False, decipher_only=False), critical=True))


def make_ca(key_path: str | os.PathLike[str], *, subject: str,
            cert_path: str | os.PathLike[str] | None = None, days: int = CA_DAYS,
            ) -> tuple[Path, Path, Certificate]:
    """Create a self-signed CA: a P-256 private key (mode 0600) and its
    certificate (CA:TRUE, keyCertSign), valid from now for ``days``.

    Args:
        cert_path: default ``<key_path without .pem>.crt``.

    Returns:
        ``(key_path, cert_path, certificate)``.

    Raises:
        UsageError: a file exists (never overwritten), a bad subject, days outside
            1..MAX_DAYS, an empty key path.
        DocumentError: a file cannot be created.
    """
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key_p = Path(key_path)
    cert_p = _cert_path(key_p, cert_path)
    name, lifetime = _name(subject), _days(days)
    _refuse_existing(key_p, cert_p)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (_builder(x509, name, name, key, now, now + lifetime, ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_pair(key_p, cert_p, key, cert)
    return key_p, cert_p, describe(cert, str(cert_p))


def issue(key_path: str | os.PathLike[str], *, ca_key: str | os.PathLike[str],
          subject: str, ca_cert: str | os.PathLike[str] | None = None,
          cert_path: str | os.PathLike[str] | None = None, days: int = LEAF_DAYS,
          ) -> tuple[Path, Path, Certificate]:
    """Create a signing key (P-256, mode 0600) and its certificate issued by a
    local CA: CA:FALSE, KeyUsage digitalSignature, ExtendedKeyUsage codeSigning,
    valid from now for ``days`` (never past the CA's own expiry).

    Args:
        ca_key: the CA's private key; ``ca_cert`` default ``<ca_key>.crt``.
        cert_path: default ``<key_path without .pem>.crt``.

    Returns:
        ``(key_path, cert_path, certificate)``.

    Raises:
        UsageError: a file exists, a bad subject, days outside 1..MAX_DAYS, an
            empty key path.
        DocumentError: the CA key or certificate is unreadable, they do not
            match, the CA certificate is not a CA (BasicConstraints CA:TRUE)
            or not valid now.
    """
    x509 = _x509()
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_p = Path(key_path)
    cert_p = _cert_path(key_p, cert_path)
    name, lifetime = _name(subject), _days(days)
    ca_pub = check_private_key(ca_key)
    ca_cert_p = _cert_path(Path(ca_key), ca_cert)
    cas = _read_certs(ca_cert_p, "CA certificate")
    authority = cas[0]
    if fingerprint_of(public_pem(authority.public_key())) != ca_pub.fingerprint:
        raise DocumentError(str(ca_cert_p), f"is not the certificate of {os.fspath(ca_key)}")
    try:
        is_ca = authority.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise DocumentError(str(ca_cert_p), "is not a CA certificate (BasicConstraints CA:TRUE)")
    check_current(authority, str(ca_cert_p))
    _refuse_existing(key_p, cert_p)
    signing = serialization.load_pem_private_key(Path(ca_key).read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (_builder(x509, name, authority.subject, key, now,
                     min(now + lifetime, authority.not_valid_after_utc), ca=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CODE_SIGNING]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                authority.public_key()), critical=False)
            .sign(signing, hashes.SHA256()))
    _write_pair(key_p, cert_p, key, cert)
    return key_p, cert_p, describe(cert, str(cert_p))
