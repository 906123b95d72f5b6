"""A release's ``model.sig``: signing and verifying it with OpenSSF model signing
(sigstore/model-transparency), issue 17. The release-time side (the ``signature``
gate, sealing a commit) is :mod:`registry.release.signature_gate`.

A signed release holds ``model.sig``: the library's standard Sigstore bundle
(``application/vnd.dev.sigstore.bundle.v0.3+json``) around a DSSE envelope whose
in-toto statement lists every other file of the release with its sha256
(serialization ``files``, ``sha256``, ``ignore_paths`` = ``model.sig`` and
``MANIFEST.json``). ``model.sig`` is itself listed in ``MANIFEST.json`` (so it
is committed, downloaded, cached and checked like every file) and the manifest
stays the commit marker, written last.

**Binding.** The statement's subject name is ``<model_id>@<version>``. DSSE
signs the whole statement, so a validly signed older release copied under a
new version's path names the old version and is refused. A directory signed
with the library's own CLI binds the same way when it is named
``<model_id>@<version>`` (the library takes the subject name from the
directory's name).

**Certificates.** Signed with a key and its X.509 certificate from a local CA
(``--sign-key`` + ``--sign-cert``, the library's certificate signer), the
bundle carries the certificate chain instead of a key hint; a host that
trusts the CA (``--trusted-ca``) validates the chain at its current time
(:mod:`registry.trust.certs`) and the library verifies the signature with it. A
bundle is checked against keys or CAs by its kind, never across: a bare-key
signature does not pass for a host that trusts only CAs.

**No second hash pass.** Signing builds the library's manifest from the
digests the commit computed while writing; verifying compares the signed
digests with ``MANIFEST.json``'s, and the pull then refuses any byte that
does not hash to them while it downloads (as every pull does).

Needs the ``[signing]`` extra, imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.trust import cert_trust, certs
from registry.rules import limits
from registry.errors import IntegrityError, SignatureError
from registry.trust.keys import PublicKey, check_private_key, require_signing, unavailable
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest
from registry.obs.tracing import traced
from registry.store import Store, join
from registry.trust import Trust

#: the library's standard signature file name (its CLI's default ``--signature``).
SIGNATURE = "model.sig"
#: files a signature's file list leaves out (the bundle itself, and MANIFEST.json).
IGNORED = (SIGNATURE, MANIFEST)


def subject(model_id: str, version: str) -> str:
    """The statement's subject name that binds a signature to one release."""
    return f"{model_id}@{version}"


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """A verified signature: which trusted key made it, for which release.

    Attributes:
        fingerprint: the key's fingerprint, or the signing certificate's
            (sha256 of its DER) for ``kind == "certificate"``.
        key: the trusted key's file name, or the trusted CA's.
        subject: the statement's subject, ``<model_id>@<version>``.
        identity: the signing certificate's subject (RFC 4514); ``ca``: the
            subject of the trusted CA it chains to (certificates only).
    """

    fingerprint: str
    key: str
    subject: str
    kind: str = "key"
    identity: str | None = None
    ca: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "key": self.key, "subject": self.subject,
                "kind": self.kind, "identity": self.identity, "ca": self.ca}

    def describe(self) -> str:
        """``key <fp> (<file>)`` or ``certificate '<subject>' (<fp>) from CA '<subject>'``."""
        if self.kind == "certificate":
            return (f"certificate {self.identity!r} ({self.fingerprint}) from CA {self.ca!r} "
                    f"({self.key})")
        return f"key {self.fingerprint} ({self.key})"


def _lib() -> Any:
    require_signing()
    try:
        from model_signing import manifest as ms_manifest
        from model_signing._hashing import hashing as ms_hashing
        from model_signing._signing import sign_ec_key, sign_sigstore_pb
        from model_signing._signing import signing as ms_signing
    except ImportError as e:
        raise unavailable(e) from None

    return ms_manifest, ms_hashing, ms_signing, sign_ec_key, sign_sigstore_pb


def _cert_lib() -> Any:
    _lib()
    try:
        from model_signing._signing import sign_certificate
    except ImportError as e:
        raise unavailable(e) from None
    return sign_certificate


def warm_up() -> None:
    """Import the library on a daemon thread, so that its import overlaps the
    writing of a release; any error resurfaces where the library is used."""
    def run() -> None:
        try:
            _lib()
        except Exception:  # noqa: BLE001 - reported by the real call
            pass
    threading.Thread(target=run, name="signing-import", daemon=True).start()


def _signed_entries(entries: Iterable[FileEntry]) -> list[FileEntry]:
    return sorted((e for e in entries if e.path not in IGNORED), key=lambda e: e.path)


def sign_entries(entries: Iterable[FileEntry], key_path: str, *, model_id: str,
                 version: str, cert: str | None = None,
                 chain: Iterable[str] = ()) -> bytes:
    """The bundle (bytes of ``model.sig``) signing ``entries`` as ``model_id@version``.

    Args:
        entries: the release's files with the sha256 computed while writing
            them (``model.sig`` and ``MANIFEST.json`` are skipped).
        key_path: PEM EC private key (``registry keys generate`` / ``issue``).
        cert: the key's PEM signing certificate: the bundle then carries
            ``cert`` and ``chain`` (the library's certificate signer).
        chain: PEM files of the CA certificates above ``cert``.

    Raises:
        DocumentError: the key file is unreadable or not a supported EC key;
            the certificate does not match it, is expired or cannot sign, or
            ``chain`` does not link it to its CA
            (:func:`registry.trust.certs.check_signing_certificate`).
        SigningUnavailableError: the ``[signing]`` extra is not installed.
    """
    chain = list(chain)
    if cert is None:
        check_private_key(key_path)
    else:
        certs.check_signing_certificate(key_path, cert, chain)
    ms_manifest, ms_hashing, ms_signing, sign_ec_key, _ = _lib()
    serialization = ms_manifest.SerializationType.from_args(
        {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
         "ignore_paths": list(IGNORED)})
    items = [ms_manifest.FileManifestItem(
        path=Path(e.path), digest=ms_hashing.Digest("sha256", bytes.fromhex(e.sha256)))
        for e in _signed_entries(entries)]
    lib_manifest = ms_manifest.Manifest(subject(model_id, version), items, serialization)
    if cert is None:
        signer = sign_ec_key.Signer(Path(key_path))
    else:
        signer = _cert_lib().Signer(Path(key_path), Path(cert), [Path(c) for c in chain])
    signature = signer.sign(ms_signing.Payload(lib_manifest))
    return str(signature.bundle.to_json()).encode()


def _read_bundle(data: bytes, where: str) -> Any:
    _, _, _, _, sign_sigstore_pb = _lib()
    # The library parses bundles from a path only; the bytes are small.
    with tempfile.TemporaryDirectory(prefix="registry-sig-") as d:
        p = Path(d) / SIGNATURE
        p.write_bytes(data)
        try:
            return sign_sigstore_pb.Signature.read(p)
        except Exception as e:  # noqa: BLE001 - any parse failure is "malformed"
            raise SignatureError(where, f"malformed signature bundle ({type(e).__name__}: "
                                        f"{e})") from None


def claimed_fingerprint(data: bytes) -> str | None:
    """The key fingerprint a bundle names (``verificationMaterial.publicKey.hint``),
    or its signing certificate's fingerprint, unverified; None when the bytes
    are not such a bundle."""
    claimed = claimed_certificate(data)
    if claimed is not None:
        return claimed.fingerprint
    try:
        hint = json.loads(data)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, TypeError, KeyError):
        return None
    return hint if isinstance(hint, str) and hint else None


def claimed_certificate(data: bytes) -> certs.Certificate | None:
    """The signing certificate a bundle carries, unverified; None for a key
    bundle or bytes that are not a bundle."""
    try:
        ders = certs.bundle_chain(json.loads(data))
        return certs.parse_der(ders[:1])[0] if ders else None
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return None


def _certificate_claims(data: bytes, trust: Trust, where: str
                        ) -> tuple[certs.Certificate, certs.Certificate] | None:
    """For a certificate bundle: its signing certificate and the trusted CA its
    chain ends in, validated now (revocations first); None for a key bundle.

    Raises:
        SignatureError: a malformed chain; a revoked key, certificate or CA; no
            trusted CA; a chain that does not verify now (another CA, expired,
            not yet valid).
    """
    try:
        ders = certs.bundle_chain(json.loads(data))
        if ders is None:
            return None
        chain = certs.parse_der(ders)
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as e:
        raise SignatureError(where, f"malformed certificate chain in the signature bundle "
                                    f"({type(e).__name__}: {e})") from None
    leaf = chain[0]
    what = f"certificate {leaf.subject!r} ({leaf.fingerprint})"
    if len(ders) > cert_trust.MAX_CHAIN:
        raise SignatureError(where, f"the signature bundle's chain holds {len(ders)} "
                                    f"certificates (at most {cert_trust.MAX_CHAIN})",
                             fingerprint=leaf.fingerprint)
    _refuse_revoked(ders, trust, where)
    if not trust.cas:
        raise SignatureError(where, f"signed with {what}, but this host trusts no CA (give "
                                    f"--trusted-ca; it trusts {trust.describe()})",
                             fingerprint=leaf.fingerprint)
    try:
        anchor = certs.verify_chain(ders, trust.cas)
    except ValueError as e:
        raise SignatureError(where, f"{what} does not chain to a CA this host trusts, now: "
                                    f"{e} (this host trusts {trust.describe()})",
                             fingerprint=leaf.fingerprint) from None
    from cryptography import x509

    why = cert_trust.signing_usage_error(x509.load_der_x509_certificate(ders[0]))
    if why is not None:
        raise SignatureError(where, f"{what} may not sign models: {why}",
                             fingerprint=leaf.fingerprint)
    return leaf, anchor


def _refuse_revoked(ders: list[bytes], trust: Trust, where: str) -> None:
    """Refuse a bundle when any certificate on any path from its signing
    certificate to a trusted CA -- through the bundle's chain or the host's
    CAs -- is revoked, by issuer + serial or by its key (never by DER hash
    alone: :mod:`registry.trust.cert_trust`).

    Raises:
        SignatureError: names the revoked certificate and the reason.
    """
    from cryptography import x509

    objs = [x509.load_der_x509_certificate(d) for d in ders]
    pool = objs[1:] + [x509.load_pem_x509_certificate(c.pem) for c in trust.cas]
    for c in cert_trust.path_certificates(objs[0], pool):
        info = certs.describe(c, "")
        why = cert_trust.revoked_reason(c, trust.revoked, trust.revoked_ids, info.fingerprint)
        if why is not None:
            name = (f"certificate {info.subject!r}" if c is objs[0]
                    else f"CA {info.subject!r} (issuer {info.issuer!r}, serial {info.serial})")
            raise SignatureError(where, f"signed by revoked {name}: {why}",
                                 fingerprint=certs.describe(objs[0], "").fingerprint)


def _verify_certificate(signature: Any, leaf: certs.Certificate, anchor: certs.Certificate,
                        trust: Trust, where: str) -> tuple[SignatureCheck, Any]:
    """The library's certificate verifier over the host's CAs."""
    sign_certificate = _cert_lib()
    with tempfile.TemporaryDirectory(prefix="registry-ca-") as d:
        p = Path(d) / "cas.pem"
        p.write_bytes(b"".join(c.pem for c in trust.cas))
        try:
            signed = sign_certificate.Verifier([p]).verify(signature)
        except Exception as e:  # noqa: BLE001 - any failure is "does not verify"
            raise SignatureError(where, f"the signature of certificate {leaf.subject!r} does "
                                        f"not verify ({type(e).__name__}: {e})",
                                 fingerprint=leaf.fingerprint) from None
    return SignatureCheck(leaf.fingerprint, anchor.name or anchor.subject, signed.model_name,
                          "certificate", leaf.subject, anchor.subject), signed


def _untrusted_key(hint: str | None, trust: Trust, where: str) -> SignatureError:
    if hint is not None and hint in trust.revoked:
        return SignatureError(where, f"signed by revoked key {hint}: {trust.revoked[hint]}",
                              fingerprint=hint)
    if not trust.keys:
        return SignatureError(where, f"signed by a bare key ({hint or 'none'}), not with a "
                                     "certificate from a CA this host trusts (it trusts "
                                     f"{trust.describe()})", fingerprint=hint)
    return SignatureError(where, f"not signed by a trusted key (the signature names key "
                                 f"{hint or 'none'}; this host trusts {trust.describe()})",
                          fingerprint=hint)


def verify_bytes(data: bytes, entries: Iterable[FileEntry], *, model_id: str, version: str,
                 trust: Trust, where: str) -> SignatureCheck:
    """Check a bundle against a release's listed files and this host's trust.

    Args:
        data: the bytes of ``model.sig``.
        entries: the release's manifest entries (path, size, sha256).
        trust: the keys this host trusts, and those it revoked.
        where: the release, for messages.

    Returns:
        The SignatureCheck of the trusted key that verified it.

    Raises:
        SignatureError: malformed; made by a revoked key (with its reason) or
            by a key not trusted; for a certificate bundle, one that does not
            chain to a trusted CA now, or is revoked; bound to another model
            id or version; or signing files or digests other than exactly the
            listed ones.
    """
    signature = _read_bundle(data, where)
    claims = _certificate_claims(data, trust, where)
    if claims is not None:
        check, signed = _verify_certificate(signature, *claims, trust, where)
        check_coverage(signed, entries, model_id=model_id, version=version, where=where)
        return check
    _, _, _, sign_ec_key, _ = _lib()
    hint = claimed_fingerprint(data)
    signed = None
    used: PublicKey | None = None
    for key in trust.keys:
        if key.fingerprint in trust.revoked:
            continue
        try:
            with tempfile.TemporaryDirectory(prefix="registry-key-") as d:
                p = Path(d) / "key.pub"
                p.write_bytes(key.pem)
                signed = sign_ec_key.Verifier(p).verify(signature)
        except Exception:  # noqa: BLE001 - not this key (or not a valid signature)
            continue
        used = key
        break
    if used is None or signed is None:
        raise _untrusted_key(hint, trust, where)
    check = SignatureCheck(used.fingerprint, used.name, signed.model_name)
    check_coverage(signed, entries, model_id=model_id, version=version, where=where)
    return check



def check_coverage(signed: Any, entries: Iterable[FileEntry], *, model_id: str,
                   version: str, where: str) -> None:
    """The signed manifest must name ``model_id@version`` and list exactly the
    release's files (bar model.sig) with the same sha256.

    Raises:
        SignatureError: naming the first differences.
    """
    have = {rd.identifier: rd.digest.digest_hex for rd in signed.resource_descriptors()}
    _compare(signed.model_name, signed.serialization_type, have, entries, model_id=model_id,
             version=version, where=where)


def _compare(name: str, params: dict[str, Any], have: dict[str, str],
             entries: Iterable[FileEntry], *, model_id: str, version: str,
             where: str) -> None:
    want = subject(model_id, version)
    if name != want:
        raise SignatureError(where, f"the signature is for {name!r}, not {want!r} "
                                    "(a release copied from another version?)")
    if params.get("method") != "files" or params.get("hash_type") != "sha256":
        raise SignatureError(where, f"the signature uses serialization {params.get('method')}/"
                                    f"{params.get('hash_type')}; only files/sha256 can be "
                                    "checked against the manifest (sign with the defaults)")
    listed = {e.path: e.sha256 for e in _signed_entries(entries)}
    problems = [f"{p} is not signed" for p in sorted(set(listed) - set(have))]
    problems += [f"{p} is signed but not in the release" for p in sorted(set(have) - set(listed))]
    problems += [f"{p} differs from the signed sha256" for p in sorted(set(have) & set(listed))
                 if have[p] != listed[p]]
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise SignatureError(where, "the signature does not cover exactly the release's "
                                    f"files: {'; '.join(problems[:3])}{more}")


def inspect_bytes(data: bytes, entries: Iterable[FileEntry], *, model_id: str, version: str,
                  where: str) -> str | None:
    """Check a bundle's binding and coverage without any key (before publishing a
    directory that arrived signed); returns the fingerprint it names.

    Raises:
        SignatureError: malformed, bound elsewhere, or not covering the files.
    """
    _, _, ms_signing, _, _ = _lib()
    signature = _read_bundle(data, where)
    try:
        envelope = signature.bundle.dsse_envelope
        payload = json.loads(envelope.payload)
        signed = ms_signing.dsse_payload_to_manifest(payload)
    except Exception as e:  # noqa: BLE001 - any parse failure is "malformed"
        raise SignatureError(where, f"malformed signature payload ({e})") from None
    check_coverage(signed, entries, model_id=model_id, version=version, where=where)
    return claimed_fingerprint(data)


def read_signature(store: Store, prefix: str, manifest: Manifest) -> bytes | None:
    """The bytes of a release's ``model.sig`` checked against its manifest entry;
    None when the release lists none.

    Raises:
        SignatureError: the entry is larger than MAX_SIGNATURE_BYTES.
        IntegrityError: the stored bytes differ from the manifest entry.
    """
    entry = manifest.entry(SIGNATURE)
    if entry is None:
        return None
    where = store.url_of(join(prefix, SIGNATURE))
    if entry.size > limits.MAX_SIGNATURE_BYTES:
        raise SignatureError(where, f"{entry.size} bytes: larger than any signature bundle "
                                    f"({limits.MAX_SIGNATURE_BYTES} bytes at most)")
    data = store.read_bytes(join(prefix, SIGNATURE), limit=limits.MAX_SIGNATURE_BYTES)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size or digest != entry.sha256:
        raise IntegrityError(where, expected_size=entry.size, actual_size=len(data),
                             expected_sha256=entry.sha256, actual_sha256=digest)
    return data


def precheck(data: bytes, entries: Iterable[FileEntry], *, model_id: str, version: str,
             trust: Trust, where: str) -> str:
    """The checks that need no signature verification, from the bundle alone: it
    names a trusted, unrevoked key (or carries a certificate chain that is
    valid now up to a trusted CA, with nothing in it revoked),
    ``model_id@version``, and exactly the release's files and digests.
    Returns the named fingerprint (the key's, or the signing certificate's).

    This refuses every forged release whose bundle tells the truth about its
    key before a weight is downloaded, without loading the library (about a
    second of imports). It proves nothing: :func:`verify_bytes` (the
    library's verifier) is what accepts a release.

    Raises:
        SignatureError: as :func:`verify_bytes` would for the same reasons.
    """
    try:
        bundle = json.loads(data)
        envelope = bundle["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"], validate=True))
        subjects = statement["subject"]
        predicate = statement["predicate"]
        resources = {r["name"]: r["digest"] for r in predicate["resources"]}
        params = predicate["serialization"]
        name = subjects[0]["name"]
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error) as e:
        raise SignatureError(where, f"malformed signature bundle ({type(e).__name__}: "
                                    f"{e})") from None
    claims = _certificate_claims(data, trust, where)
    if claims is not None:
        _compare(name, params, resources, entries, model_id=model_id, version=version,
                 where=where)
        return claims[0].fingerprint
    hint = claimed_fingerprint(data)
    if hint is None or hint in trust.revoked or hint not in {k.fingerprint
                                                             for k in trust.keys}:
        raise _untrusted_key(hint, trust, where)
    _compare(name, params, resources, entries, model_id=model_id, version=version,
             where=where)
    return hint


@traced("registry.signature")
def verify_release(store: Store, prefix: str, manifest: Manifest, *, model_id: str,
                   version: str, trust: Trust) -> SignatureCheck:
    """Verify a committed release's signature from the store (small reads only).

    Raises:
        SignatureError: unsigned, or see :func:`verify_bytes`.
        IntegrityError: ``model.sig`` differs from its manifest entry.
    """
    where = store.url_of(prefix)
    data = read_signature(store, prefix, manifest)
    if data is None:
        raise SignatureError(where, f"unsigned: no {SIGNATURE} in the release (this host "
                                    "accepts only releases signed by a trusted key)")
    return verify_bytes(data, manifest.files, model_id=model_id, version=version,
                        trust=trust, where=where)
