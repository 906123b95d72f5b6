"""Signing keys: generation, loading and fingerprints (issue 17).

Keys are elliptic-curve (NIST P-256 by default; P-384 and P-521 are what the
OpenSSF ``model_signing`` library also accepts), PEM encoded: the private key
as unencrypted PKCS #8 in a file of mode 0600, the public key as
SubjectPublicKeyInfo. A key's **fingerprint** is the sha256 hex of its public
PEM, exactly the ``verificationMaterial.publicKey.hint`` the library writes
into every bundle, so a signature names its key without any key at hand.

A serving host's trust in keys and CA certificates is :mod:`registry.trust`.

Needs the ``[signing]`` extra (``cryptography`` comes with ``model-signing``);
importing this module does not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import DocumentError, SigningUnavailableError, UsageError

CURVES = ("secp256r1", "secp384r1", "secp521r1")
_EXTRA_HINT = "install the signing extra: pip install 'modeldir-registry[signing]'"


def require_signing() -> None:
    """Raise SigningUnavailableError unless ``model_signing`` is installed.

    Finds the packages without importing them: the library's import costs
    about a second, paid only where it is used (often on a helper thread)."""
    for name in ("model_signing", "cryptography"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # blocked or broken: sys.modules[name] is None
            found = False
        if not found:
            raise SigningUnavailableError(f"signing needs the model-signing package ({name} "
                                          f"is missing): {_EXTRA_HINT}")


def unavailable(e: ImportError) -> SigningUnavailableError:
    """The error for an installed but unimportable library (a missing dependency)."""
    return SigningUnavailableError(f"signing needs the model-signing package, which cannot "
                                   f"be imported ({e}): {_EXTRA_HINT}")


def _crypto() -> Any:
    require_signing()
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as e:
        raise unavailable(e) from None

    return serialization, ec


def public_pem(key: Any) -> bytes:
    """The SubjectPublicKeyInfo PEM of a public key object."""
    serialization, _ = _crypto()
    return key.public_bytes(serialization.Encoding.PEM,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint_of(pem: bytes) -> str:
    """sha256 hex of a canonical public PEM (the library's key hint)."""
    return hashlib.sha256(pem).hexdigest()


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A public key read from a file: its canonical PEM, fingerprint and source."""

    path: str
    pem: bytes
    fingerprint: str

    @property
    def name(self) -> str:
        return Path(self.path).name


def read_pem(path: str | os.PathLike[str], what: str) -> tuple[str, bytes]:
    """The path as a string and the bytes of a key or certificate file.

    Raises:
        DocumentError: the file cannot be read (naming it and ``what`` it holds).
    """
    where = os.fspath(path)
    try:
        return where, Path(where).read_bytes()
    except OSError as e:
        raise DocumentError(where, f"cannot read the {what}: {e.strerror}") from None


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    """Read an EC public key (PEM). A private key file is refused, never used.

    Raises:
        DocumentError: the file is missing, not a PEM public key, or not on a
            curve the library supports.
        SigningUnavailableError: the ``[signing]`` extra is not installed.
    """
    serialization, ec = _crypto()
    where, data = read_pem(path, "public key")
    if b"PRIVATE KEY" in data:
        raise DocumentError(where, "is a private key: give the public key (.pub) instead")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise DocumentError(where, f"not a PEM public key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVES:
        raise DocumentError(where, f"not an elliptic-curve key on {', '.join(CURVES)}")
    pem = public_pem(key)
    return PublicKey(where, pem, fingerprint_of(pem))


def check_private_key(path: str | os.PathLike[str]) -> PublicKey:
    """Check a signing key file before anything is written; returns its public half.

    Raises:
        DocumentError: unreadable, not an unencrypted PEM EC private key on a
            supported curve.
    """
    serialization, ec = _crypto()
    where, data = read_pem(path, "signing key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise DocumentError(where, f"not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in CURVES:
        raise DocumentError(where, f"not an elliptic-curve key on {', '.join(CURVES)}")
    pem = public_pem(key.public_key())
    return PublicKey(where, pem, fingerprint_of(pem))


def sign_bytes(key_path: str | os.PathLike[str], data: bytes) -> tuple[str, bytes]:
    """ECDSA-SHA256 signature of ``data`` by the EC private key at ``key_path``:
    (the key's sha256 fingerprint, the DER-encoded signature).

    Raises:
        DocumentError, SigningUnavailableError: see :func:`check_private_key`.
    """
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = check_private_key(key_path)
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)  # checked just above
    return public.fingerprint, key.sign(data, ec.ECDSA(hashes.SHA256()))


def generate(private_path: str | os.PathLike[str], *, public_path: str | os.PathLike[str]
             | None = None, curve: str = "secp256r1") -> tuple[Path, Path, str]:
    """Generate a key pair: ``private_path`` (mode 0600) and its public key.

    Args:
        private_path: the private key file to create.
        public_path: default ``<private_path without .pem>.pub``.
        curve: one of :data:`CURVES`.

    Returns:
        ``(private_path, public_path, fingerprint)``.

    Raises:
        UsageError: an unknown curve, or either file exists (never overwritten).
        DocumentError: a file cannot be created (missing folder, permissions).

    Notes:
        Both files are created with ``O_EXCL``; the private key is never
        readable by others, even for an instant (mode set at creation).
    """
    serialization, ec = _crypto()
    if curve not in CURVES:
        raise UsageError(f"--curve {curve!r}: expected one of {', '.join(CURVES)}")
    priv = Path(private_path)
    pub = Path(public_path) if public_path is not None else priv.with_suffix(".pub")
    for p in (priv, pub):
        if p.exists() or p.is_symlink():
            raise UsageError(f"{p}: exists; refusing to overwrite a key")
    key = ec.generate_private_key(getattr(ec, curve.upper())())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    pem = public_pem(key.public_key())
    _create(priv, private, 0o600)
    try:
        _create(pub, pem, 0o644)
    except BaseException:
        priv.unlink(missing_ok=True)
        raise
    return priv, pub, fingerprint_of(pem)


def _create(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise UsageError(f"{path}: exists; refusing to overwrite a key") from None
    except OSError as e:
        raise DocumentError(str(path), f"cannot create: {e.strerror}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
