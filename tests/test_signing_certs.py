"""Releases signed with a certificate from a local CA (issue 17), on memory, local disk and S3.

What is checked, and how:

* ``registry keys ca`` / ``keys issue``: private keys mode 0600, never
  overwritten (exit 2); the issued certificate chains to the CA and carries
  the code-signing usage; a non-CA certificate cannot issue (exit 5).
* Signing (``--sign-key`` + ``--sign-cert`` [+ ``--cert-chain``], CLI and
  API, ``publish`` and ``release create``): ``model.sig`` is the library's
  certificate bundle, listed in MANIFEST.json. A certificate that is not the
  key's, expired, not yet valid, without the signing usage, a chain with
  an expired CA, or a chain that does not link the certificate to its CA
  (another CA, one with the issuer's name but not its key, an unrelated CA
  beside the issuer): one line naming both files, exit 5, nothing committed.
* Pull with trusted CAs (API, ``--trusted-ca``, ``REGISTRY_TRUSTED_CAS``):
  names the certificate's subject and fingerprint. Refused (exit 1, one line,
  nothing placed), by real processes on local disk and S3: another CA's
  certificate, a bare key where a CA is required, tampered files, a deleted
  signature, expired and not-yet-valid certificates (signed through the
  library directly, since publish refuses them), a revoked certificate.
* Interop: a pulled directory verifies with ``model_signing verify
  certificate``; a directory signed by ``model_signing sign certificate`` and
  published verifies on pull.
* Gate and index: ``policy set --require-signed-by CA.crt``; ``gate check``,
  ``show --json`` (subject + fingerprint) and ``query --passing`` respect it; a
  publish with another CA's certificate or a bare key is refused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import stat
from pathlib import Path

import pytest

from registry.api import Registry
from registry.trust.certs import load_certificates
from registry.trust.local_ca import issue, make_ca
from registry.errors import DocumentError, GateFailedError, SignatureError, UsageError
from registry.trust.keys import generate
from registry.trust import load_trust
from registry.protocol.manifest import MANIFEST
from registry.pull import pull
from registry.release import ReleaseResult
from registry.release.policy import set_policy
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.test_cli_contract import _run as run_batch
from tests.release_util import ledger_row, summary
from tests.support.pull_attacks import assert_never_downloaded, assert_pulls_refused, rewrite
from tests.test_release import checkpoint
from tests.test_signing import MODEL, _safetensors, gate_files, model_dir, \
    model_signing_cli, publish, publish_dir, release_dir_to_sign

pytest.importorskip("model_signing")

DAY = dt.timedelta(days=1)


def _forged_cert(root: Path, name: str, *, ca: str, not_before: dt.datetime,
                 not_after: dt.datetime, usage: bool = True) -> tuple[Path, Path]:
    """A key and a certificate issued by ``ca`` with any validity and usage:
    what ``registry keys issue`` never makes (expired, future, unusable)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key((root / f"{ca}.pem").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((root / f"{ca}.crt").read_bytes())
    key, _, _ = generate(root / f"{name}.pem")
    public = serialization.load_pem_public_key((root / f"{name}.pub").read_bytes())
    b = (x509.CertificateBuilder().subject_name(x509.Name.from_rfc4514_string(f"CN={name}"))
         .issuer_name(ca_cert.subject).public_key(public)  # type: ignore[arg-type]
         .serial_number(x509.random_serial_number())
         .not_valid_before(not_before).not_valid_after(not_after))
    if usage:
        b = b.add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False, crl_sign=False,
            encipher_only=False, decipher_only=False), critical=True)
    cert = root / f"{name}.crt"
    cert.write_bytes(b.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
                     .public_bytes(serialization.Encoding.PEM))
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two CAs, a release certificate of each, and certificates publish refuses."""
    root = tmp_path_factory.mktemp("pki")
    now = dt.datetime.now(dt.timezone.utc)
    make_ca(root / "ca.pem", subject="CN=Release CA,O=Acme")
    make_ca(root / "other-ca.pem", subject="CN=Attacker CA")
    make_ca(root / "twin-ca.pem", subject="CN=Release CA,O=Acme")  # ca's name, another key
    issue(root / "release.pem", ca_key=root / "ca.pem", subject="CN=release-bot,O=Acme")
    issue(root / "attacker.pem", ca_key=root / "other-ca.pem", subject="CN=release-bot,O=Acme")
    # valid once while the CA was (the library checks the chain at notBefore)
    _forged_cert(root, "expired", ca="ca", not_before=now - dt.timedelta(minutes=4),
                 not_after=now - dt.timedelta(minutes=1))
    _forged_cert(root, "future", ca="ca", not_before=now + DAY, not_after=now + 30 * DAY)
    _forged_cert(root, "nousage", ca="ca", not_before=now - DAY, not_after=now + 30 * DAY,
                 usage=False)
    generate(root / "bare.pem")
    return root


def sign_args(pki: Path, name: str = "release", *, chain: str | None = "ca") -> list[str]:
    return ["--sign-key", str(pki / f"{name}.pem"), "--sign-cert", str(pki / f"{name}.crt"),
            *(["--cert-chain", str(pki / f"{chain}.crt")] if chain else [])]


def cert_publish(store: Store, src: Path, version: str, pki: Path,
                 name: str = "release") -> ReleaseResult:
    return publish(store, src, version, pki / f"{name}.pem", sign_cert=pki / f"{name}.crt",
                   cert_chain=[pki / "ca.crt"])


def _with_checkpoint(store_url: str, tmp_path: Path) -> tuple[Store, list[str]]:
    """The store holding run r1's checkpoints (tests.test_release.checkpoint),
    and the ``--store``/``--db`` arguments of a command on it."""
    store = open_store(store_url)
    checkpoint(store)
    return store, ["--store", store_url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]


def fingerprint(pki: Path, name: str) -> str:
    return load_certificates(pki / f"{name}.crt")[0].fingerprint


# -- a local CA -----------------------------------------------------------------------------


def test_keys_ca_and_issue_modes_usage_and_refusals(tmp_path: Path) -> None:
    r = run_cli("keys", "ca", str(tmp_path / "ca.pem"), "--subject", "CN=Team CA,O=Acme",
                "--json")
    assert r.returncode == 0, r.stderr
    ca = json.loads(r.stdout)
    assert stat.S_IMODE((tmp_path / "ca.pem").stat().st_mode) == 0o600
    assert ca["certificate"] == str(tmp_path / "ca.crt") and ca["subject"] == "CN=Team CA,O=Acme"
    r = run_cli("keys", "issue", str(tmp_path / "bot.pem"), "--ca", str(tmp_path / "ca.pem"),
                "--subject", "CN=bot", "--json")
    assert r.returncode == 0, r.stderr
    leaf = json.loads(r.stdout)
    assert stat.S_IMODE((tmp_path / "bot.pem").stat().st_mode) == 0o600
    assert leaf["issuer"] == "CN=Team CA,O=Acme"
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    cert = x509.load_pem_x509_certificate((tmp_path / "bot.crt").read_bytes())
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CODE_SIGNING in eku
    assert hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest() == leaf["fingerprint"]
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    before = (tmp_path / "bot.pem").read_bytes()
    for args in (["ca", str(tmp_path / "ca.pem"), "--subject", "CN=x"],
                 ["issue", str(tmp_path / "bot.pem"), "--ca", str(tmp_path / "ca.pem"),
                  "--subject", "CN=x"]):
        r = run_cli("keys", *args)
        assert r.returncode == 2 and "refusing to overwrite" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert (tmp_path / "bot.pem").read_bytes() == before
    r = run_cli("keys", "issue", str(tmp_path / "x.pem"), "--ca", str(tmp_path / "bot.pem"),
                "--subject", "CN=x")  # a leaf certificate is no CA
    assert r.returncode == 5 and "not a CA certificate" in r.stderr
    assert not (tmp_path / "x.pem").exists()
    r = run_cli("keys", "ca", str(tmp_path / "y.pem"), "--subject", "nonsense")
    assert r.returncode == 2 and "RFC 4514" in r.stderr and not (tmp_path / "y.pem").exists()


# -- signing and pulling --------------------------------------------------------------------


def test_certificate_signed_publish_pulls_with_a_trusted_ca_only(
        store: Store, tmp_path: Path, pki: Path) -> None:
    result = cert_publish(store, model_dir(tmp_path), "1", pki)
    assert "model.sig" in {e.path for e in result.manifest.files}
    bundle = json.loads(store.read_bytes(f"models/{MODEL}/1/model.sig"))
    chain = bundle["verificationMaterial"]["x509CertificateChain"]["certificates"]
    assert len(chain) == 2 and "publicKey" not in bundle["verificationMaterial"]
    trust = load_trust(ca_files=[pki / "ca.crt"])
    r = pull(store, MODEL, "1", to=tmp_path / "out", cache=tmp_path / "c", trust=trust)
    assert r.signer == fingerprint(pki, "release")
    assert r.signed_by is not None and r.signed_by["kind"] == "certificate"
    assert r.signed_by["identity"] == "CN=release-bot,O=Acme"
    assert r.signed_by["ca"] == "CN=Release CA,O=Acme"
    refusals = {
        "other CA": (load_trust(ca_files=[pki / "other-ca.crt"]), "does not chain to a CA"),
        "keys only": (load_trust([pki / "bare.pub"]), "this host trusts no CA"),
    }
    for what, (t, why) in refusals.items():
        with pytest.raises(SignatureError, match=why):
            pull(store, MODEL, "1", to=tmp_path / "no", cache=tmp_path / "c", trust=t)
        assert not (tmp_path / "no").exists(), what
    # a bare key where a CA is required
    publish(store, model_dir(tmp_path, "b", seed=2), "2", pki / "bare.pem")
    with pytest.raises(SignatureError, match="signed by a bare key"):
        pull(store, MODEL, "2", to=tmp_path / "no", cache=tmp_path / "c", trust=trust)
    # a host trusting both keys and CAs takes either kind
    both = load_trust([pki / "bare.pub"], ca_files=[pki / "ca.crt"])
    assert pull(store, MODEL, "2", to=tmp_path / "o2", cache=tmp_path / "c",
                trust=both).signed_by["kind"] == "key"  # type: ignore[index]


@pytest.mark.parametrize("durable_store_url", ["local"], indirect=True)
def test_publish_refuses_bad_certificates_before_anything_is_committed(
        durable_store_url: str, tmp_path: Path, pki: Path) -> None:
    store, s = _with_checkpoint(durable_store_url, tmp_path)
    chain = ["--cert-chain", str(pki / "ca.crt")]
    bad = {
        "not the key's": (["--sign-key", str(pki / "bare.pem"), "--sign-cert",
                           str(pki / "release.crt"), *chain], 5, "is not the certificate of"),
        "expired": (sign_args(pki, "expired"), 5, "expired on"),
        "not yet valid": (sign_args(pki, "future"), 5, "is not valid before"),
        "no signing usage": (sign_args(pki, "nousage"), 5, "cannot sign"),
        "expired CA in the chain": (sign_args(pki, chain="expired"), 5, "expired on"),
        "a key as the certificate": (["--sign-key", str(pki / "release.pem"), "--sign-cert",
                                      str(pki / "release.pem"), *chain], 5,
                                     "holds a private key"),
        "chain without certificate": (["--sign-key", str(pki / "release.pem"), "--cert-chain",
                                       str(pki / "ca.crt")], 2, "--sign-cert"),
        "certificate without key": (["--sign-cert", str(pki / "release.crt")], 2,
                                    "--sign-key"),
        "certificate without chain": (sign_args(pki, chain=None), 2, "give --cert-chain"),
        # a chain that does not link --sign-cert to its CA: one line naming both files
        "chain of another CA": (sign_args(pki, chain="other-ca"), 5,
                                f"{pki / 'other-ca.crt'}: --cert-chain does not link "
                                f"--sign-cert {pki / 'release.crt'} to its CA: its issuer "
                                "'CN=Release CA,O=Acme' is not there"),
        "chain of a CA with the issuer's name": (
            sign_args(pki, chain="twin-ca"), 5,
            f"{pki / 'twin-ca.crt'}: --cert-chain does not link --sign-cert "
            f"{pki / 'release.crt'} to its CA: 'CN=Release CA,O=Acme' in "
            f"{pki / 'twin-ca.crt'} did not sign it"),
        "an unrelated CA beside the issuer": (
            [*sign_args(pki), "--cert-chain", str(pki / "other-ca.crt")], 5,
            f"{pki / 'other-ca.crt'}: --cert-chain certificate 'CN=Attacker CA' is not on "
            f"the path from --sign-cert {pki / 'release.crt'}"),
    }
    create = ["release", "create", "--run", "r1", "--step", "10"]
    cases = [(what, [*cmd, "--model-id", MODEL, "--version", str(i + 1), *args,
                     *gate_files(tmp_path), *s], code, why)
             for i, (what, (args, code, why)) in enumerate(bad.items())
             for cmd in (["publish", str(model_dir(tmp_path, f"s{i}", seed=i + 1))],
                         *([create] if what in ("expired", "certificate without chain",
                                                "chain of another CA") else []))]
    # one real process runs every case (registry.cli.main per case), as the CLI
    # contract test does
    for (what, argv, code, why), (got, _, err) in zip(
            cases, run_batch(tmp_path, [argv for _, argv, _, _ in cases]), strict=True):
        assert got == code and why in err, (what, argv, err)
        assert len(err.strip().splitlines()) == 1, (what, err)
    assert not store.exists(f"models/{MODEL}")  # not even a staging directory left
    with pytest.raises(DocumentError, match="expired on"):
        cert_publish(store, model_dir(tmp_path, "api"), "1", pki, "expired")
    with pytest.raises(DocumentError, match="does not link --sign-cert"):
        publish(store, model_dir(tmp_path, "api1"), "1", pki / "release.pem",
                sign_cert=pki / "release.crt", cert_chain=[pki / "other-ca.crt"])
    assert not store.exists(f"models/{MODEL}")
    with pytest.raises(UsageError):
        publish(store, model_dir(tmp_path, "api2"), "1", None, sign_cert=pki / "release.crt")


@pytest.mark.parametrize("durable_store_url", ["local"], indirect=True)
def test_cli_sign_with_certificate_pull_with_trusted_cas_and_the_library_verifies(
        durable_store_url: str, tmp_path: Path, pki: Path) -> None:
    store, s = _with_checkpoint(durable_store_url, tmp_path)
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", MODEL,
                "--version", "1", *sign_args(pki), *gate_files(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    r = run_cli("publish", str(model_dir(tmp_path)), "--model-id", MODEL, "--version", "2",
                *sign_args(pki), *gate_files(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "cas"
    folder.mkdir()
    (folder / "release-ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    for version, how in (("1", ["--trusted-ca", str(pki / "ca.crt")]), ("2", [])):
        out = tmp_path / f"pulled-{version}"
        r = run_cli("pull", f"{MODEL}@{version}", "--to", str(out), *how, "--cache",
                    str(tmp_path / "cache"), "--json", *s[:2],
                    env={"REGISTRY_TRUSTED_CAS": str(folder)} if not how else None)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["signer"] == fingerprint(pki, "release")
        assert doc["signed_by"]["identity"] == "CN=release-bot,O=Acme"
        # interoperability: the library's own verifier accepts the pulled directory
        v = model_signing_cli("verify", "certificate", "--signature", str(out / "model.sig"),
                              "--certificate_chain", str(pki / "ca.crt"), str(out))
        assert v.returncode == 0, v.stdout + v.stderr
        v = model_signing_cli("verify", "certificate", "--signature", str(out / "model.sig"),
                              "--certificate_chain", str(pki / "other-ca.crt"), str(out))
        assert v.returncode != 0
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "text"), "--trusted-ca",
                str(pki / "ca.crt"), "--cache", str(tmp_path / "cache"), *s[:2])
    assert r.returncode == 0 and "signed by certificate 'CN=release-bot,O=Acme'" in r.stdout


@pytest.mark.parametrize("durable_store_url", ["s3"], indirect=True)
def test_directory_signed_by_the_library_with_a_certificate_then_published_pulls(
        durable_store_url: str, tmp_path: Path, pki: Path) -> None:
    store = open_store(durable_store_url)
    signed_dir = release_dir_to_sign(store, tmp_path)
    v = model_signing_cli("sign", "certificate", "--private_key", str(pki / "release.pem"),
                          "--signing_certificate", str(pki / "release.crt"),
                          "--certificate_chain", str(pki / "ca.crt"),
                          "--signature", str(signed_dir / "model.sig"), str(signed_dir))
    assert v.returncode == 0, v.stdout + v.stderr
    s = ["--store", durable_store_url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = publish_dir(signed_dir, "2", *s)
    assert r.returncode == 0, r.stderr
    r = run_cli("pull", f"{MODEL}@2", "--to", str(tmp_path / "out"), "--trusted-ca",
                str(pki / "ca.crt"), "--cache", str(tmp_path / "cache"), "--json", *s[:2])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signer"] == fingerprint(pki, "release")
    r = run_cli("pull", f"{MODEL}@2", "--to", str(tmp_path / "out2"), "--trusted-ca",
                str(pki / "other-ca.crt"), "--cache", str(tmp_path / "cache"), *s[:2])
    assert r.returncode == 1 and "does not chain to a CA" in r.stderr
    assert not (tmp_path / "out2").exists()


# -- attacks --------------------------------------------------------------------------------


def _signature(store: Store, version: str, pki: Path, name: str,
               monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A bundle over the release's files made by the library's signer with
    ``name``'s key (and certificate, chained to ``chain``), bypassing the
    registry's own checks (which refuse expired and future certificates)."""
    from registry.trust import certs
    from registry.trust.model_sig import sign_entries
    m = read_manifest(store, f"models/{MODEL}/{version}")
    if name == "bare":
        return sign_entries(m.files, str(pki / "bare.pem"), model_id=MODEL, version=version)
    chain = "other-ca" if name == "attacker" else "ca"
    with monkeypatch.context() as patch:
        patch.setattr(certs, "check_signing_certificate", lambda *a, **k: None)
        return sign_entries(m.files, str(pki / f"{name}.pem"), model_id=MODEL,
                            version=version, cert=str(pki / f"{name}.crt"),
                            chain=[str(pki / f"{chain}.crt")])


#: attack -> (version, what the refusal says)
ATTACKS = {
    "rewrite-weights": ("2", "model.safetensors differs from the signed sha256"),
    "re-sign-other-ca": ("3", "does not chain to a CA"),
    "re-sign-bare-key": ("4", "signed by a bare key"),
    "delete-signature": ("5", "unsigned: no model.sig"),
    "expired-certificate": ("6", "certificate has expired"),
    "future-certificate": ("7", "certificate is not yet valid"),
    "revoked-certificate": ("8", "revoked certificate 'CN=revoked'"),
}


def _attack(store: Store, attack: str, version: str, pki: Path,
            monkeypatch: pytest.MonkeyPatch) -> None:
    evil = _safetensors(99)
    if attack == "rewrite-weights":
        rewrite(store, MODEL, version, {"model.safetensors": evil})
        return
    if attack == "delete-signature":
        rewrite(store, MODEL, version, {"model.safetensors": evil, "model.sig": None})
        return
    signer = {"re-sign-other-ca": "attacker", "re-sign-bare-key": "bare",
              "expired-certificate": "expired", "future-certificate": "future",
              "revoked-certificate": "revoked"}[attack]
    if attack in ("re-sign-other-ca", "re-sign-bare-key"):
        rewrite(store, MODEL, version, {"model.safetensors": evil})
    rewrite(store, MODEL, version,
            {"model.sig": _signature(store, version, pki, signer, monkeypatch)})


def test_certificate_attacks_are_refused_by_a_real_pull(
        durable_store_url: str, tmp_path: Path, pki: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every attack on its own version; each pulled by a real ``registry pull``
    process trusting the release CA (REGISTRY_TRUSTED_CAS) that must refuse it."""
    store = open_store(durable_store_url)
    if not (pki / "revoked.crt").exists():
        issue(pki / "revoked.pem", ca_key=pki / "ca.pem", subject="CN=revoked")
    for version in ("1", *(v for v, _ in ATTACKS.values())):
        cert_publish(store, model_dir(tmp_path, f"v{version}", seed=int(version)), version,
                     pki, "revoked" if version == ATTACKS["revoked-certificate"][0]
                     else "release")
    for attack, (version, _) in ATTACKS.items():
        _attack(store, attack, version, pki, monkeypatch)
    cas = tmp_path / "cas"
    cas.mkdir()
    (cas / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    env = {"REGISTRY_TRUSTED_CAS": str(cas)}
    r = run_cli("keys", "revoke", str(pki / "revoked.crt"), "--reason", "key leaked",
                "--trusted-keys", str(cas))
    assert r.returncode == 0, r.stderr
    common = ["--cache", str(tmp_path / "cache"), "--store", durable_store_url]
    serving = tmp_path / "serving"
    refused = assert_pulls_refused(MODEL, ATTACKS, serving, *common, env=env)
    assert "key leaked" in refused["revoked-certificate"].stderr
    assert_never_downloaded(tmp_path / "cache", _safetensors(99))
    r = run_cli("pull", f"{MODEL}@1", "--to", str(serving / "1"), *common, env=env)
    assert r.returncode == 0, r.stderr
    # The library alone validates a chain at the signing certificate's notBefore
    # (it has no timestamp): it accepts the expired certificate's bundle. This
    # host's check at its own time is what refuses it.
    from model_signing._signing import sign_certificate, sign_sigstore_pb
    sig = tmp_path / "expired.sig"
    sig.write_bytes(store.read_bytes(f"models/{MODEL}/{ATTACKS['expired-certificate'][0]}"
                                     "/model.sig"))
    sign_certificate.Verifier([pki / "ca.crt"]).verify(sign_sigstore_pb.Signature.read(sig))


# -- gate and index -------------------------------------------------------------------------


@pytest.mark.parametrize("durable_store_url", ["s3"], indirect=True)
def test_policy_requires_a_ca_gate_show_and_query(durable_store_url: str, tmp_path: Path,
                                                 pki: Path) -> None:
    store = open_store(durable_store_url)
    db = f"sqlite:///{tmp_path / 'i.db'}"
    s = ["--store", durable_store_url, "--db", db]
    reg = Registry(store, db)
    reg.publish(model_dir(tmp_path, "v1", seed=1), MODEL, "1", ledger=[ledger_row()],
                eval_summary=summary(), sign_key=pki / "bare.pem")
    reg.publish(model_dir(tmp_path, "v2", seed=2), MODEL, "2", ledger=[ledger_row()],
                eval_summary=summary(), sign_key=pki / "release.pem",
                sign_cert=pki / "release.crt", cert_chain=[pki / "ca.crt"])
    r = run_cli("policy", "set", MODEL, "--require-signed-by", str(pki / "ca.crt"), "--json", *s)
    assert r.returncode == 0, r.stderr
    ca_fp = fingerprint(pki, "ca")
    assert json.loads(r.stdout)["signed_by"] == [{"name": "ca.crt", "fingerprint": ca_fp,
                                                 "kind": "ca",
                                                 "subject": "CN=Release CA,O=Acme"}]
    r = run_cli("query", MODEL, "--passing", "--json", *s)
    assert [row["version"] for row in json.loads(r.stdout)] == ["2"], r.stdout
    r = run_cli("show", f"{MODEL}@2", "--json", *s)
    doc = json.loads(r.stdout)
    fp = fingerprint(pki, "release")
    assert doc["signature"] == {"path": "model.sig", "kind": "certificate", "fingerprint": fp,
                                "subject": "CN=release-bot,O=Acme",
                                "issuer": "CN=Release CA,O=Acme", "verified": True}
    reason = (f"signed by certificate 'CN=release-bot,O=Acme' ({fp}) from CA "
              "'CN=Release CA,O=Acme' (ca.crt)")
    assert {"gate": "signature", "passed": True, "reason": reason} in doc["gates"]
    r = run_cli("show", f"{MODEL}@2", *s)
    assert f"by certificate 'CN=release-bot,O=Acme' ({fp}" in r.stdout
    r = run_cli("gate", "check", f"{MODEL}@1", *s[:2])
    assert r.returncode == 1 and "FAIL signature: signed by a bare key" in r.stdout
    assert all(g.passed for g in reg.gate_check(MODEL, "2"))
    # publishing with another CA's certificate, or a bare key: refused, nothing committed
    r = run_cli("publish", str(model_dir(tmp_path, "v3", seed=3)), "--model-id", MODEL,
                "--version", "3", *sign_args(pki, "attacker", chain="other-ca"),
                *gate_files(tmp_path), *s)
    assert r.returncode == 1 and "FAIL signature: signing certificate" in r.stdout, r.stdout
    with pytest.raises(GateFailedError, match="is not one the policy lists"):
        reg.publish(model_dir(tmp_path, "v4", seed=4), MODEL, "4", ledger=[ledger_row()],
                    eval_summary=summary(), sign_key=pki / "bare.pem")
    for version in ("3", "4"):
        assert not store.exists(f"models/{MODEL}/{version}/{MANIFEST}")
    r = run_cli("publish", str(model_dir(tmp_path, "v5", seed=5)), "--model-id", MODEL,
                "--version", "5", *sign_args(pki), *gate_files(tmp_path), *s)
    assert r.returncode == 0 and "PASS signature: signed by certificate" in r.stdout
    assert [row["version"] for row in reg.passing(MODEL, latest=True)] == ["5"]
    # keys and CAs together: either kind passes
    reg.set_policy(MODEL, [], signed_by=[*load_certificates(pki / "ca.crt"),
                                         *load_trust([pki / "bare.pub"]).keys])
    assert sorted(row["version"] for row in reg.passing(MODEL)) == ["1", "2", "5"]
    reg.close()


def test_publish_gate_with_a_ca_policy_api(store: Store, tmp_path: Path, pki: Path) -> None:
    set_policy(store, MODEL, [], load_certificates(pki / "ca.crt"))
    with pytest.raises(GateFailedError, match="unsigned"):
        publish(store, model_dir(tmp_path), "1", None)
    with pytest.raises(GateFailedError, match="does not chain to a CA the policy lists"):
        publish(store, model_dir(tmp_path, "a"), "1", pki / "attacker.pem",
                sign_cert=pki / "attacker.crt", cert_chain=[pki / "other-ca.crt"])
    assert not store.exists(f"models/{MODEL}/1/{MANIFEST}")
    result = cert_publish(store, model_dir(tmp_path, "b"), "1", pki)
    assert [g.reason for g in result.gates if g.name == "signature"] == [
        f"signed by certificate 'CN=release-bot,O=Acme' ({fingerprint(pki, 'release')}) "
        "from CA 'CN=Release CA,O=Acme' (ca.crt)"]
