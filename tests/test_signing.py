"""Signed releases (issue 17) with OpenSSF model signing, on memory, local disk and S3.

What is checked, and how:

* ``registry keys generate``: the private key has mode 0600, an existing file
  is never overwritten (exit 2), the public key's fingerprint is the library's
  key hint.
* Signing at publish and ``release create`` (``--sign-key``): the release
  lists ``model.sig`` in MANIFEST.json, the manifest is still the commit
  marker, and the signed digests are the manifest's.
* Pull with trusted keys (Python API and ``registry pull --trusted-key`` /
  ``REGISTRY_TRUSTED_KEYS``) places the release and names the signer; the
  pulled directory verifies with the library's own ``model_signing verify``
  CLI, and a directory signed by that CLI (named ``<model_id>@<version>``),
  then published, verifies on pull.
* Attacks, each pulled by a real ``registry pull`` process on local disk and
  S3: weights and manifest rewritten consistently; re-signed by the attacker's
  key; signature deleted; an older signed release copied under the new
  version's path; an unsigned file added; the signature replaced by garbage.
  Each is refused with exit 1 and one line, and nothing is placed.
* Rotation and revocation: a release signed by a retired key still pulls while
  the host trusts that key; a revoked key is refused with its reason.
* Gate and index: ``policy set --require-signed-by``; gate check, ``show
  --json`` (signer fingerprint) and ``query --passing`` respect it; an unsigned
  or wrongly signed publish is refused before anything is committed.
* Without the ``[signing]`` extra: a clear error naming it (exit 2), and a
  plain pull never imports ``model_signing``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from registry.api import Registry
from registry.errors import GateFailedError, SignatureError, VersionExistsError
from registry.trust.keys import generate, load_public_key
from registry.trust import load_trust
from registry.protocol.manifest import MANIFEST
from registry.pull import pull
from registry.release import ModelRelease
from registry.release.policy import set_policy
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.support.pull_attacks import assert_never_downloaded, assert_pulls_refused, rewrite
from tests.test_release import checkpoint
from tests.support.forkclient import python_run

pytest.importorskip("model_signing")

MODEL = "tiny"


def keypair(tmp_path: Path, name: str) -> tuple[Path, Path]:
    priv, pub, _ = generate(tmp_path / "keys" / f"{name}.pem",
                            public_path=tmp_path / "keys" / f"{name}.pub")
    return priv, pub


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    (tmp_path / "keys").mkdir()
    return {n: keypair(tmp_path, n) for n in ("release", "old", "attacker")}


class SignedStore:
    """A local store under ``root`` and a release key pair (``key``, ``pub``)
    under ``root``; ``mirror``: the base URL of a server of it, once started."""

    def __init__(self, root: Path) -> None:
        (root / "keys").mkdir(parents=True)
        self.root = root
        self.url = str(root / "store")
        self.store: Store = open_store(self.url)
        self.key, self.pub = keypair(root, "release")
        self.mirror = ""


def model_dir(root: Path, name: str = "src", *, seed: int = 1) -> Path:
    d = root / name
    (d / "data").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(_safetensors(seed))
    (d / "config.json").write_text('{"hidden_size": 8}\n')
    (d / "data" / "extra.bin").write_bytes(bytes(range(256)) * (seed + 1))
    return d


def _safetensors(seed: int) -> bytes:
    import io

    import numpy as np

    from registry.formats.safetensors_io import write_safetensors
    buf = io.BytesIO()
    rng = np.random.default_rng(seed)
    write_safetensors(buf, {"w": rng.standard_normal((8, 8), dtype=np.float32)},
                      metadata={"format": "pt"}, path="model.safetensors")
    return buf.getvalue()


def publish(store: Store, src: Path, version: str, key: Path | None, **kw: object):  # type: ignore[no-untyped-def]
    return ModelRelease(store).publish(src, MODEL, version, ledger=[ledger_row()],
                                       eval_summary=summary(), sign_key=key, **kw)


def gate_files(tmp_path: Path) -> list[str]:
    ledger, evals = tmp_path / "ledger.json", tmp_path / "summary.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    return ["--ledger", str(ledger), "--evals", str(evals)]


def model_signing_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The library's own CLI, in a real process."""
    return python_run([sys.executable, "-m", "model_signing", *args], capture_output=True,
                          text=True, timeout=300)


def release_dir_to_sign(store: Store, tmp_path: Path) -> Path:
    """MODEL@1 published unsigned, then pulled without its MANIFEST.json into a
    folder named MODEL@2 (the library's subject name binds the folder's name):
    a complete release directory (card, ledger, evals) to sign."""
    publish(store, model_dir(tmp_path), "1", None)
    signed_dir = tmp_path / f"{MODEL}@2"
    pull(store, MODEL, "1", to=signed_dir, cache=tmp_path / "cache")
    (signed_dir / MANIFEST).unlink()
    return signed_dir


def publish_dir(release_dir: Path, version: str, *s: str) -> subprocess.CompletedProcess[str]:
    """``registry publish`` of a release directory as MODEL@version, with the
    ledger and evals it holds."""
    return run_cli("publish", str(release_dir), "--model-id", MODEL, "--version", version,
                   "--ledger", str(release_dir / "ledger.json"),
                   "--evals", str(release_dir / "evals" / "summary.json"), *s)


# -- keys ---------------------------------------------------------------------------------


def test_keys_generate_mode_refuses_overwrite_and_fingerprint(tmp_path: Path) -> None:
    priv, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    r = run_cli("keys", "generate", str(priv), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert out["public_key"] == str(pub) and b"PRIVATE" not in pub.read_bytes()
    assert out["fingerprint"] == hashlib.sha256(pub.read_bytes()).hexdigest()
    r = run_cli("keys", "fingerprint", str(pub))
    assert r.returncode == 0 and r.stdout.strip() == out["fingerprint"]
    before = priv.read_bytes()
    r = run_cli("keys", "generate", str(priv))
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and priv.read_bytes() == before
    (tmp_path / "only.pub").write_text("x")  # the public half exists: refused too
    r = run_cli("keys", "generate", str(tmp_path / "only.pem"))
    assert r.returncode == 2 and not (tmp_path / "only.pem").exists()
    r = run_cli("keys", "fingerprint", str(priv))  # a private key is never "trusted"
    assert r.returncode == 5 and "is a private key" in r.stderr


# -- signing at publish, pull with trust ------------------------------------------------------


def test_publish_signed_pull_verifies_and_names_the_signer(
        store: Store, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    priv, pub = keys["release"]
    result = publish(store, model_dir(tmp_path), "1", priv)
    listed = {e.path: e for e in result.manifest.files}
    assert "model.sig" in listed and store.exists(f"models/{MODEL}/1/model.sig")
    bundle = json.loads(store.read_bytes(f"models/{MODEL}/1/model.sig"))
    statement = json.loads(__import__("base64").b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["subject"][0]["name"] == "tiny@1"
    signed = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    assert signed == {p: e.sha256 for p, e in listed.items() if p != "model.sig"}
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == load_public_key(pub).fingerprint
    trust = load_trust([pub])
    r = pull(store, MODEL, "1", to=tmp_path / "out", cache=tmp_path / "cache", trust=trust)
    assert r.signer == load_public_key(pub).fingerprint
    assert (tmp_path / "out" / "model.sig").exists()
    with pytest.raises(SignatureError, match="not signed by a trusted key"):
        pull(store, MODEL, "1", to=tmp_path / "out2", cache=tmp_path / "cache",
             trust=load_trust([keys["attacker"][1]]))
    assert not (tmp_path / "out2").exists()
    publish(store, model_dir(tmp_path, "plain", seed=2), "2", None)
    with pytest.raises(SignatureError, match="unsigned: no model.sig"):
        pull(store, MODEL, "2", to=tmp_path / "out3", cache=tmp_path / "cache", trust=trust)
    assert not (tmp_path / "out3").exists()
    assert pull(store, MODEL, "2", to=tmp_path / "out4", cache=tmp_path / "cache").signer is None


@pytest.mark.parametrize("durable_store_url", ["local"], indirect=True)
def test_cli_release_create_and_publish_sign_and_library_verifies_the_pull(
        durable_store_url: str, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    priv, pub = keys["release"]
    store = open_store(durable_store_url)
    checkpoint(store)
    s = ["--store", durable_store_url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = run_cli("release", "create", "--run", "r1", "--step", "10", "--model-id", MODEL,
                "--version", "1", "--sign-key", str(priv), *gate_files(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    r = run_cli("publish", str(model_dir(tmp_path)), "--model-id", MODEL, "--version", "2",
                "--sign-key", str(priv), *gate_files(tmp_path), *s)
    assert r.returncode == 0, r.stderr
    for version in ("1", "2"):
        out = tmp_path / f"pulled-{version}"
        r = run_cli("pull", f"{MODEL}@{version}", "--to", str(out), "--trusted-key", str(pub),
                    "--cache", str(tmp_path / "cache"), "--json", *s[:2])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["signer"] == load_public_key(pub).fingerprint
        # interoperability: the library's own verifier accepts the pulled directory
        v = model_signing_cli("verify", "key", "--signature", str(out / "model.sig"),
                              "--public_key", str(pub), str(out))
        assert v.returncode == 0, v.stdout + v.stderr
        v = model_signing_cli("verify", "key", "--signature", str(out / "model.sig"),
                              "--public_key", str(keys["attacker"][1]), str(out))
        assert v.returncode != 0
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    r = run_cli("publish", str(model_dir(tmp_path, "src3")), "--model-id", MODEL, "--version",
                "3", "--sign-key", str(bad), *gate_files(tmp_path), *s)
    assert r.returncode == 5 and "bad.pem" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not store.exists(f"models/{MODEL}/3/MANIFEST.json")


@pytest.mark.parametrize("durable_store_url", ["s3"], indirect=True)
def test_directory_signed_by_the_library_cli_then_published_verifies_on_pull(
        durable_store_url: str, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    priv, pub = keys["release"]
    store = open_store(durable_store_url)
    # A complete release directory, named <model_id>@<version>, signed by the library's CLI.
    signed_dir = release_dir_to_sign(store, tmp_path)
    v = model_signing_cli("sign", "key", "--private_key", str(priv), "--signature",
                          str(signed_dir / "model.sig"), str(signed_dir))
    assert v.returncode == 0, v.stdout + v.stderr
    s = ["--store", durable_store_url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = publish_dir(signed_dir, "2", *s)
    assert r.returncode == 0, r.stderr
    assert store.read_bytes(f"models/{MODEL}/2/model.sig") == (signed_dir / "model.sig").read_bytes()
    r = run_cli("pull", f"{MODEL}@2", "--to", str(tmp_path / "out"), "--trusted-key", str(pub),
                "--cache", str(tmp_path / "cache"), *s[:2])
    assert r.returncode == 0, r.stderr
    # The same signature published under another version is refused at publish.
    r = publish_dir(signed_dir, "3", *s)
    assert r.returncode == 1 and "not 'tiny@3'" in r.stderr, r.stderr
    assert not store.exists(f"models/{MODEL}/3/MANIFEST.json")
    # ... and so is a signed directory whose files changed after signing.
    changed = signed_dir.rename(tmp_path / f"{MODEL}@4")
    v = model_signing_cli("sign", "key", "--private_key", str(priv), "--signature",
                          str(changed / "model.sig"), str(changed))
    assert v.returncode == 0, v.stdout + v.stderr
    (changed / "config.json").write_text('{"hidden_size": 8, "x": 1}\n')
    r = publish_dir(changed, "4", *s)
    assert r.returncode == 1 and "config.json differs from the signed sha256" in r.stderr
    assert not store.exists(f"models/{MODEL}/4/MANIFEST.json")


# -- attacks ------------------------------------------------------------------------------


def _attacker_signature(store: Store, version: str, key: Path) -> bytes:
    from registry.trust.model_sig import sign_entries
    m = read_manifest(store, f"models/{MODEL}/{version}")
    return sign_entries(m.files, str(key), model_id=MODEL, version=version)


#: attack -> (version it is applied to, what the refusal says)
ATTACKS = {
    "rewrite-weights": ("2", "model.safetensors differs from the signed sha256"),
    "re-sign": ("3", "not signed by a trusted key"),
    "delete-signature": ("4", "unsigned: no model.sig"),
    "swap-older-release": ("5", "the signature is for 'tiny@1', not 'tiny@5'"),
    "add-unsigned-file": ("6", "tokenizer.json is not signed"),
    "garbage-signature": ("7", "malformed signature bundle"),
    # the bundle lies about its key: passes the JSON pre-check, so the weights
    # download, but the library's verification fails before anything is placed
    "forged-key-hint": ("8", "not signed by a trusted key"),
}


def _attack(store: Store, attack: str, version: str, evil: bytes, attacker_key: Path) -> None:
    if attack == "rewrite-weights":
        rewrite(store, MODEL, version, {"model.safetensors": evil})
    elif attack == "re-sign":
        rewrite(store, MODEL, version, {"model.safetensors": evil})
        rewrite(store, MODEL, version,
                {"model.sig": _attacker_signature(store, version, attacker_key)})
    elif attack == "delete-signature":
        rewrite(store, MODEL, version, {"model.safetensors": evil, "model.sig": None})
    elif attack == "swap-older-release":  # v1's files, manifest and signature under v5
        prefix, old = f"models/{MODEL}/{version}", f"models/{MODEL}/1"
        for e in read_manifest(store, prefix).files:
            store.delete(f"{prefix}/{e.path}")
        for e in read_manifest(store, old).files:
            store.write_bytes(f"{prefix}/{e.path}", store.read_bytes(f"{old}/{e.path}"))
        store.write_bytes(f"{prefix}/{MANIFEST}", store.read_bytes(f"{old}/{MANIFEST}"))
    elif attack == "add-unsigned-file":
        rewrite(store, MODEL, version, {"tokenizer.json": b'{"evil": true}'})
    elif attack == "forged-key-hint":
        rewrite(store, MODEL, version, {"model.safetensors": _safetensors(98)})
        bundle = json.loads(_attacker_signature(store, version, attacker_key))
        trusted = hashlib.sha256(attacker_key.with_name("release.pub").read_bytes()).hexdigest()
        bundle["verificationMaterial"]["publicKey"]["hint"] = trusted
        rewrite(store, MODEL, version, {"model.sig": json.dumps(bundle).encode()})
    else:
        rewrite(store, MODEL, version, {"model.sig": b'{"mediaType": "nonsense"}'})


def test_attacks_are_refused_by_a_real_pull(durable_store_url: str, tmp_path: Path,
                                            keys: dict[str, tuple[Path, Path]]) -> None:
    """Every attack on its own version of one model; each pulled by a real
    ``registry pull`` process that must refuse it and place nothing."""
    priv, pub = keys["release"]
    store = open_store(durable_store_url)
    for version in ("1", *(v for v, _ in ATTACKS.values())):
        publish(store, model_dir(tmp_path, f"v{version}", seed=int(version)), version, priv)
    evil = _safetensors(99)
    for attack, (version, _) in ATTACKS.items():
        _attack(store, attack, version, evil, keys["attacker"][0])
    common = ["--trusted-key", str(pub), "--cache", str(tmp_path / "cache"), "--store",
              durable_store_url]
    serving = tmp_path / "serving"
    assert_pulls_refused(MODEL, ATTACKS, serving, *common)
    assert_never_downloaded(tmp_path / "cache", evil)
    # the untouched release still pulls, and an unsigned pull still "verifies" a
    # forged release: only the trusted key stops it
    assert run_cli("pull", f"{MODEL}@1", "--to", str(serving / "tiny-1"), *common
                   ).returncode == 0
    r = run_cli("pull", f"{MODEL}@2", "--to", str(tmp_path / "unsigned-pull"),
                "--cache", str(tmp_path / "cache"), "--store", durable_store_url)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "unsigned-pull" / "model.safetensors").read_bytes() == evil


# -- rotation and revocation ------------------------------------------------------------------


@pytest.mark.parametrize("durable_store_url", ["local"], indirect=True)
def test_retired_key_still_verifies_and_a_revoked_key_is_refused_with_its_reason(
        durable_store_url: str, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    """Trust and revocation live on the host, the same for every store: local disk."""
    store = open_store(durable_store_url)
    publish(store, model_dir(tmp_path, "v1", seed=1), "1", keys["old"][0])
    publish(store, model_dir(tmp_path, "v2", seed=2), "2", keys["release"][0])
    folder = tmp_path / "trusted"
    folder.mkdir()
    for name in ("old", "release"):
        (folder / f"{name}.pub").write_bytes(keys[name][1].read_bytes())
    env = {"REGISTRY_TRUSTED_KEYS": str(folder)}
    common = ["--cache", str(tmp_path / "cache"), "--store", durable_store_url, "--json"]
    for version in ("1", "2"):
        r = run_cli("pull", f"{MODEL}@{version}", "--to", str(tmp_path / f"a{version}"),
                    *common, env=env)
        assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["signer"] == load_public_key(keys["release"][1]).fingerprint
    r = run_cli("keys", "revoke", str(keys["old"][1]), "--reason", "laptop stolen", env=env)
    assert r.returncode == 0, r.stderr
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "b1"), *common, env=env)
    assert r.returncode == 1 and "revoked key" in r.stderr and "laptop stolen" in r.stderr
    assert not (tmp_path / "b1").exists()
    assert run_cli("pull", f"{MODEL}@2", "--to", str(tmp_path / "b2"), *common,
                   env=env).returncode == 0
    # revoked also when the host no longer holds the key's PEM at all
    (folder / "old.pub").unlink()
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "c1"), *common, env=env)
    assert r.returncode == 1 and "laptop stolen" in r.stderr
    # and when the revoked key is also given explicitly
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "d1"), "--trusted-key",
                str(keys["old"][1]), *common, env=env)
    assert r.returncode == 1 and "laptop stolen" in r.stderr


# -- gate and index ------------------------------------------------------------------------


@pytest.mark.parametrize("durable_store_url", ["s3"], indirect=True)
def test_policy_requires_a_signature_gate_show_and_query(
        durable_store_url: str, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    """On S3 (the gate reads model.sig and the manifest from the store); the
    publish-time gate runs on every backend in test_publish_gate_api_errors."""
    store = open_store(durable_store_url)
    db = f"sqlite:///{tmp_path / 'i.db'}"
    s = ["--store", durable_store_url, "--db", db]
    reg = Registry(store, db)
    for version, key in (("1", None), ("2", "old"), ("3", "release")):
        reg.publish(model_dir(tmp_path, f"v{version}", seed=int(version)), MODEL, version,
                    ledger=[ledger_row()], eval_summary=summary(),
                    sign_key=keys[key][0] if key else None)
    fp = load_public_key(keys["release"][1]).fingerprint
    r = run_cli("policy", "set", MODEL, "--require-signed-by", str(keys["release"][1]), *s)
    assert r.returncode == 0 and fp in r.stdout, r.stderr
    r = run_cli("query", MODEL, "--passing", "--json", *s)
    assert [row["version"] for row in json.loads(r.stdout)] == ["3"], r.stdout
    # ls says "passing" as query does: the signature gate is read from --store
    r = run_cli("ls", MODEL, "--json", *s)
    assert {row["version"]: row["passing"] for row in json.loads(r.stdout)} == \
        {"1": False, "2": False, "3": True}, r.stdout
    r = run_cli("ls", "--json", *s)
    assert [(m["model_id"], m["newest_passing"]) for m in json.loads(r.stdout)] == \
        [(MODEL, "3")], r.stdout
    r = run_cli("gate", "check", f"{MODEL}@3", "--json", *s[:2])
    assert r.returncode == 0, r.stdout
    r = run_cli("show", f"{MODEL}@3", "--json", *s)
    doc = json.loads(r.stdout)
    assert doc["signature"] == {"path": "model.sig", "kind": "key", "fingerprint": fp,
                                "verified": True}
    assert {"gate": "signature", "passed": True,
            "reason": f"signed by key {fp} (release.pub)"} in doc["gates"] and doc["passed"]
    doc = reg.show(MODEL, "2")
    assert doc["signature"]["verified"] is False and not doc["passed"]
    assert doc["signature"]["fingerprint"] == load_public_key(keys["old"][1]).fingerprint
    assert reg.show(MODEL, "1")["signature"] is None
    assert {"gate": "signature", "passed": False, "reason": "unsigned: no model.sig in the "
            "release (this host accepts only releases signed by a trusted key)"} in \
        reg.show(MODEL, "1")["gates"]
    r = run_cli("gate", "check", f"{MODEL}@2", *s[:2])
    assert r.returncode == 1 and "FAIL signature: not signed by a trusted key" in r.stdout
    # publishing with a key the policy does not list: refused, nothing committed
    r = run_cli("publish", str(model_dir(tmp_path, "v5", seed=5)), "--model-id", MODEL,
                "--version", "5", "--sign-key", str(keys["old"][0]), *gate_files(tmp_path), *s)
    assert r.returncode == 1 and "FAIL signature: signing key" in r.stdout, r.stdout + r.stderr
    assert not store.exists(f"models/{MODEL}/5/MANIFEST.json")
    r = run_cli("publish", str(model_dir(tmp_path, "v6", seed=6)), "--model-id", MODEL,
                "--version", "6", "--sign-key", str(keys["release"][0]), *gate_files(tmp_path), *s)
    assert r.returncode == 0 and "PASS signature" in r.stdout
    assert [row["version"] for row in reg.passing(MODEL, latest=True)] == ["6"]
    # the policy cleared: no signature gate, every version passes again
    reg.set_policy(MODEL, [])
    assert sorted(row["version"] for row in reg.passing(MODEL)) == ["1", "2", "3", "6"]
    reg.close()


def test_publish_gate_api_errors(store: Store, tmp_path: Path,
                                 keys: dict[str, tuple[Path, Path]]) -> None:
    set_policy(store, MODEL, [], [load_public_key(keys["release"][1])])
    with pytest.raises(GateFailedError, match="unsigned"):
        publish(store, model_dir(tmp_path), "1", None)
    assert not store.exists(f"models/{MODEL}/1/{MANIFEST}")
    publish(store, model_dir(tmp_path, "b"), "1", keys["release"][0])
    with pytest.raises(VersionExistsError):
        publish(store, model_dir(tmp_path, "c"), "1", keys["release"][0])


# -- without the [signing] extra ------------------------------------------------------------


def test_without_the_extra_signing_options_fail_clearly_and_pull_works(
        tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    store_url = str(tmp_path / "store")
    publish(open_store(store_url), model_dir(tmp_path), "1", None)
    block = ("import sys; sys.modules['model_signing'] = None; "
             "sys.argv = ['registry'] + sys.argv[1:]; from registry.cli import main; main()")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", block, *args], capture_output=True,
                              text=True, timeout=300, env=dict(os.environ))

    r = cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "o1"), "--trusted-key",
            str(keys["release"][1]), "--cache", str(tmp_path / "c"), "--store", store_url)
    assert r.returncode == 2 and "modeldir-registry[signing]" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o1").exists()
    r = cli("keys", "generate", str(tmp_path / "n.pem"))
    assert r.returncode == 2 and "modeldir-registry[signing]" in r.stderr
    r = cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "o2"), "--cache", str(tmp_path / "c"),
            "--store", store_url)
    assert r.returncode == 0, r.stderr
    code = ("import sys; from registry.pull import pull; from registry.store import open_store; "
            f"pull(open_store({store_url!r}), 'tiny', '1', to={str(tmp_path / 'o3')!r}, "
            f"cache={str(tmp_path / 'c')!r}); print('model_signing' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
