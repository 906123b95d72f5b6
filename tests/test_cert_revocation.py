"""Revocation by identity and the signing usage (issue 30, item 2).

The attacker is a store writer with full bucket rights and no key: they
rewrite ``model.sig`` (and MANIFEST.json to match, as
:func:`tests.support.pull_attacks.rewrite` does). Every refusal is checked
through the Python API and one through a real ``registry pull`` process:

* the ECDSA malleation ``(r, s) -> (r, n - s)`` of the revoked signing
  certificate (a new DER, a new sha256, no key needed);
* the same malleation of a revoked intermediate CA in the bundle;
* a revoked intermediate stripped from ``model.sig`` while the host's CA
  folder holds it (the path goes through the host's copy);
* a fresh certificate for a revoked key (re-issued by the CA, new serial);
* a TLS server certificate (EKU serverAuth only) of the trusted CA signing a
  model, unless the operator names serverAuth in ``$REGISTRY_SIGNING_EKU``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from registry.errors import DocumentError, SignatureError
from registry.trust.keys import generate
from registry.trust import load_trust, revoke
from registry.trust.certs import load_certificates
from registry.trust.local_ca import make_ca
from registry.pull import pull
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.support.pull_attacks import rewrite
from tests.test_signing import MODEL, model_dir, publish

pytest.importorskip("model_signing")

P256_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def _cert(root: Path, name: str, *, issuer: str, ca: bool = False,
          eku: list[Any] | None = None, key: str | None = None) -> Path:
    """``name``.crt issued by ``issuer`` (a CA with ``issuer``.pem/.crt), for
    the key ``key`` (default: a new ``name``.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca_key = serialization.load_pem_private_key((root / f"{issuer}.pem").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((root / f"{issuer}.crt").read_bytes())
    if key is None:
        generate(root / f"{name}.pem")
        key = name
    public = serialization.load_pem_public_key((root / f"{key}.pub").read_bytes()) \
        if (root / f"{key}.pub").exists() else \
        serialization.load_pem_private_key((root / f"{key}.pem").read_bytes(), None).public_key()
    now = dt.datetime.now(dt.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name.from_rfc4514_string(f"CN={name}"))
         .issuer_name(ca_cert.subject).public_key(public)  # type: ignore[arg-type]
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=30))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
         .add_extension(x509.KeyUsage(
             digital_signature=not ca, content_commitment=False, key_encipherment=False,
             data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
             encipher_only=False, decipher_only=False), critical=True))
    if not ca:
        b = b.add_extension(x509.ExtendedKeyUsage(eku or [ExtendedKeyUsageOID.CODE_SIGNING]),
                            critical=False)
    path = root / f"{name}.crt"
    path.write_bytes(b.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
                     .public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root CA -> intermediate CA -> signer; root -> a TLS server certificate."""
    from cryptography.x509.oid import ExtendedKeyUsageOID

    root = tmp_path_factory.mktemp("pki")
    make_ca(root / "root.pem", subject="CN=Root CA")
    _cert(root, "inter", issuer="root", ca=True)
    _cert(root, "signer", issuer="inter")
    _cert(root, "tls", issuer="root", eku=[ExtendedKeyUsageOID.SERVER_AUTH])
    return root


# -- DER surgery: what anyone can do to a certificate without a key -------------------------


def _tlv(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of content, end) of the DER element at ``at``."""
    tag, n = data[at], data[at + 1]
    if n < 0x80:
        return tag, at + 2, at + 2 + n
    k = n & 0x7F
    length = int.from_bytes(data[at + 2:at + 2 + k], "big")
    return tag, at + 2 + k, at + 2 + k + length


def _wrap(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(raw)]) + raw + content


def malleate(der: bytes) -> bytes:
    """The certificate with its ECDSA signature ``(r, s)`` replaced by the
    equally valid ``(r, n - s)``: same TBS, same issuer and serial, new DER."""
    from cryptography.hazmat.primitives.asymmetric.utils import (
        decode_dss_signature,
        encode_dss_signature,
    )

    _, body, end = _tlv(der, 0)
    _, _, tbs_end = _tlv(der, body)
    _, _, alg_end = _tlv(der, tbs_end)
    tag, bits, bits_end = _tlv(der, alg_end)
    assert tag == 0x03 and der[bits] == 0 and bits_end == end
    r, s = decode_dss_signature(der[bits + 1:bits_end])
    sig = encode_dss_signature(r, P256_N - s)
    return _wrap(0x30, der[body:alg_end] + _wrap(0x03, b"\x00" + sig))


def _bundle_chain(store: Store, version: str) -> tuple[dict[str, Any], list[bytes]]:
    doc = json.loads(store.read_bytes(f"models/{MODEL}/{version}/model.sig"))
    ders = [base64.b64decode(c["rawBytes"])
            for c in doc["verificationMaterial"]["x509CertificateChain"]["certificates"]]
    return doc, ders


def _plant_chain(store: Store, version: str, ders: list[bytes]) -> None:
    """The store writer: model.sig with another chain, MANIFEST.json rewritten."""
    doc, _ = _bundle_chain(store, version)
    doc["verificationMaterial"]["x509CertificateChain"]["certificates"] = [
        {"rawBytes": base64.b64encode(d).decode()} for d in ders]
    rewrite(store, MODEL, version, {"model.sig": json.dumps(doc).encode()})


def _publish(store: Store, tmp_path: Path, version: str, pki: Path, name: str = "signer",
             chain: tuple[str, ...] = ("inter", "root")) -> None:
    publish(store, model_dir(tmp_path, f"v{version}", seed=int(version)), version,
            pki / f"{name}.pem", sign_cert=pki / f"{name}.crt",
            cert_chain=[pki / f"{c}.crt" for c in chain])


def _cas(tmp_path: Path, pki: Path, *names: str) -> Path:
    cas = tmp_path / "cas"
    cas.mkdir(exist_ok=True)
    for n in names:
        (cas / f"{n}.crt").write_bytes((pki / f"{n}.crt").read_bytes())
    return cas


def _refused(store: Store, version: str, cas: Path, tmp_path: Path, why: str) -> None:
    out = tmp_path / f"out-{version}"
    with pytest.raises(SignatureError, match=why):
        pull(store, MODEL, version, to=out, cache=tmp_path / "c",
             trust=load_trust(ca_folder=cas))
    assert not out.exists()


@pytest.fixture()
def local(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store"))


def test_malleated_revoked_signing_certificate_stays_revoked(local: Store, tmp_path: Path,
                                                             pki: Path) -> None:
    _publish(local, tmp_path, "1", pki)
    cas = _cas(tmp_path, pki, "root")
    pull(local, MODEL, "1", to=tmp_path / "ok", cache=tmp_path / "c",
         trust=load_trust(ca_folder=cas))
    revoke(cas, load_certificates(pki / "signer.crt")[0], "signer key leaked")
    _refused(local, "1", cas, tmp_path, "revoked certificate 'CN=signer'.*signer key leaked")
    _, ders = _bundle_chain(local, "1")
    forged = malleate(ders[0])
    assert forged != ders[0]
    from cryptography import x509
    a, b = x509.load_der_x509_certificate(ders[0]), x509.load_der_x509_certificate(forged)
    assert (a.issuer, a.serial_number) == (b.issuer, b.serial_number)
    b.verify_directly_issued_by(x509.load_pem_x509_certificate((pki / "inter.crt").read_bytes()))
    _plant_chain(local, "1", [forged, *ders[1:]])
    _refused(local, "1", cas, tmp_path, "revoked certificate 'CN=signer'")
    # a real pull process, the host's CA folder from the environment
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "cli"), "--cache",
                str(tmp_path / "c"), "--store", local.url,
                env={"REGISTRY_TRUSTED_CAS": str(cas)})
    assert r.returncode == 1 and "revoked certificate 'CN=signer'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "cli").exists()


def test_malleated_or_stripped_revoked_intermediate_stays_revoked(local: Store, tmp_path: Path,
                                                                  pki: Path) -> None:
    _publish(local, tmp_path, "1", pki)
    _publish(local, tmp_path, "2", pki)
    cas = _cas(tmp_path, pki, "root", "inter")  # the host holds the intermediate too
    revoke(cas, load_certificates(pki / "inter.crt")[0], "intermediate compromised")
    _refused(local, "1", cas, tmp_path, "revoked CA 'CN=inter'.*intermediate compromised")
    _, ders = _bundle_chain(local, "1")
    _plant_chain(local, "1", [ders[0], malleate(ders[1]), *ders[2:]])
    _refused(local, "1", cas, tmp_path, "revoked CA 'CN=inter'")
    _plant_chain(local, "2", [ders[0]])  # stripped: the path goes through the host's copy
    _refused(local, "2", cas, tmp_path, "revoked CA 'CN=inter'")


def test_a_new_certificate_for_a_revoked_key_is_refused(local: Store, tmp_path: Path,
                                                        pki: Path) -> None:
    _cert(pki, "signer2", issuer="inter", key="signer")  # same key, new serial and subject
    _publish(local, tmp_path, "1", pki, name="signer")
    cas = _cas(tmp_path, pki, "root")
    revoke(cas, load_certificates(pki / "signer.crt")[0], "key leaked")
    # the attacker re-signs with the re-issued certificate's chain: same key
    _, ders = _bundle_chain(local, "1")
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    again = x509.load_pem_x509_certificate((pki / "signer2.crt").read_bytes())
    _plant_chain(local, "1", [again.public_bytes(Encoding.DER), *ders[1:]])
    _refused(local, "1", cas, tmp_path, "revoked certificate 'CN=signer2'.*key leaked")


def test_revoked_json_records_identity_and_key_not_der_hash(tmp_path: Path, pki: Path) -> None:
    cas = _cas(tmp_path, pki, "root")
    cert = load_certificates(pki / "signer.crt")[0]
    entry = revoke(cas, cert, "r")
    doc = json.loads((cas / "revoked.json").read_text())
    assert list(doc) == [cert.key_fingerprint] == [entry["fingerprint"]]
    assert doc[cert.key_fingerprint]["certificate"]["issuer"] == "CN=inter"
    assert doc[cert.key_fingerprint]["certificate"]["serial"] == cert.serial
    trust = load_trust(ca_folder=cas)
    assert trust.revoked_ids == {("CN=inter", cert.serial): "r"}
    (cas / "revoked.json").write_text('{"x": {"reason": "r", "certificate": 5}}')
    with pytest.raises(DocumentError, match="revoked.json"):
        load_trust(ca_folder=cas)


def test_a_tls_server_certificate_cannot_sign_models(local: Store, tmp_path: Path, pki: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DocumentError, match="cannot sign: its ExtendedKeyUsage"):
        _publish(local, tmp_path, "9", pki, name="tls", chain=("root",))
    assert not local.exists(f"models/{MODEL}/9/MANIFEST.json")
    # the store writer plants a bundle signed with it (made by the library directly)
    _publish(local, tmp_path, "1", pki)
    from registry.trust import certs
    from registry.trust.model_sig import sign_entries
    m = read_manifest(local, f"models/{MODEL}/1")
    with monkeypatch.context() as patch:
        patch.setattr(certs, "check_signing_certificate", lambda *a, **k: None)
        sig = sign_entries(m.files, str(pki / "tls.pem"), model_id=MODEL, version="1",
                           cert=str(pki / "tls.crt"), chain=[str(pki / "root.crt")])
    rewrite(local, MODEL, "1", {"model.sig": sig})
    cas = _cas(tmp_path, pki, "root")
    _refused(local, "1", cas, tmp_path, "may not sign models: its ExtendedKeyUsage")
    monkeypatch.setenv("REGISTRY_SIGNING_EKU", "1.3.6.1.5.5.7.3.1")  # the operator allows it
    assert pull(local, MODEL, "1", to=tmp_path / "ok", cache=tmp_path / "c",
                trust=load_trust(ca_folder=cas)).signed_by is not None
