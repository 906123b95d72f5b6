"""Protected aliases (issue 32 item 6): a model's policy names aliases whose moves must
be signed by listed keys; a host pulling with trusted keys refuses an alias whose
current move is unsigned, signed by another key, tampered with, or signed for
another manifest -- the attack tested is a store writer (no signing key) rewriting
the alias pointer and its history directly in the bucket/dir. Local disk and S3,
CLI and API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.refs.alias_history import AliasMove, encode, read_head, walk  # noqa: E402
from registry.refs.aliases import set_alias  # noqa: E402
from registry.api import Registry  # noqa: E402
from registry.errors import SignatureError  # noqa: E402
from registry.trust.keys import load_public_key  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.store import open_store  # noqa: E402
from registry.trust import load_trust  # noqa: E402
from registry.protocol.verify import read_manifest  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.test_signing import MODEL, keypair, model_dir, publish  # noqa: E402


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    (tmp_path / "keys").mkdir()
    return {n: keypair(tmp_path, n) for n in ("release", "attacker")}


def setup(url: str, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:
    store = open_store(url)
    publish(store, model_dir(tmp_path, "a", seed=1), "1", keys["release"][0])
    publish(store, model_dir(tmp_path, "b", seed=2), "2", keys["release"][0])
    r = run_cli("policy", "set", MODEL, "--protect", f"prod={keys['release'][1]}",
                "--store", url, "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert r.returncode == 0, r.stderr


def test_writer_needs_a_listed_key(durable_store_url: str, tmp_path: Path,
                                   keys: dict[str, tuple[Path, Path]]) -> None:
    setup(durable_store_url, tmp_path, keys)
    s = ["--store", durable_store_url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]
    r = run_cli("alias", "set", MODEL, "prod", "1", *s)
    assert r.returncode == 1 and "protected by its policy" in r.stderr, r.stderr
    r = run_cli("alias", "set", MODEL, "prod", "1", "--sign-key", str(keys["attacker"][0]), *s)
    assert r.returncode == 1 and "protected" in r.stderr
    store = open_store(durable_store_url)
    assert read_head(store, MODEL, "prod").version is None  # nothing moved
    r = run_cli("alias", "set", MODEL, "prod", "1", "--sign-key", str(keys["release"][0]), *s)
    assert r.returncode == 0, r.stderr
    [move] = walk(store, MODEL, "prod")
    fp = load_public_key(keys["release"][1]).fingerprint
    assert move.doc["signature"]["key"] == fp and move.doc["actor"]["key"] == fp
    r = run_cli("alias", "rm", MODEL, "prod", *s)  # a removal is a move too
    assert r.returncode == 1 and "protected" in r.stderr
    # an unprotected alias moves unsigned as before
    assert run_cli("alias", "set", MODEL, "staging", "1", *s).returncode == 0
    r = run_cli("alias", "log", MODEL, "prod", "--store", durable_store_url)
    # without trusted keys a signature is a claim, never "signed by" (issue 50)
    assert f"claims key {fp[:16]}, not verified" in r.stdout, r.stdout
    r = run_cli("alias", "log", MODEL, "prod", "--store", durable_store_url,
                "--trusted-key", str(keys["release"][1]))
    assert f"verified: key {fp[:16]}" in r.stdout, r.stdout
    r = run_cli("alias", "log", MODEL, "prod", "--store", durable_store_url,
                "--trusted-key", str(keys["attacker"][1]))
    assert "refused:" in r.stdout and "verified: key" not in r.stdout, r.stdout


def test_store_writer_cannot_repoint_prod(durable_store_url: str, tmp_path: Path,
                                         keys: dict[str, tuple[Path, Path]]) -> None:
    setup(durable_store_url, tmp_path, keys)
    store = open_store(durable_store_url)
    trust = load_trust([keys["release"][1]])
    set_alias(store, MODEL, "prod", "1", sign_key=keys["release"][0])
    assert pull(store, MODEL, "prod", to=tmp_path / "ok", trust=trust).version == "1"
    good = read_head(store, MODEL, "prod").move
    assert good is not None

    def forge(doc: dict[str, object]) -> None:
        """The store writer rewrites the pointer and writes a matching history entry."""
        raw = encode(doc)
        move = AliasMove(raw, dict(doc))
        store.write_bytes(f"ledger/aliases/{MODEL}/prod/{move.name}", raw)
        store.write_bytes(f"models/{MODEL}/refs/prod", raw)

    def refused(match: str) -> None:
        with pytest.raises(SignatureError, match=match):
            pull(store, MODEL, "prod", to=tmp_path / "x", trust=trust)
        r = run_cli("pull", f"{MODEL}@prod", "--to", str(tmp_path / "y"), "--trusted-key",
                    str(keys["release"][1]), "--store", durable_store_url)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()

    base = {**good.doc, "seq": 2, "old": "1", "new": "2", "prev": good.name}
    base["manifest_sha256"] = read_manifest(store, f"models/{MODEL}/2").digest
    forge({**base, "signature": None})
    refused("is not signed")
    from registry.trust.alias_sign import sign_move
    forge({**base, "signature": sign_move(base, keys["attacker"][0])})
    refused("which the model's policy does not list")
    # the attacker also rewrites policy.json to list its own key: the host still
    # trusts only its own keys
    atk = load_public_key(keys["attacker"][1]).fingerprint
    store.write_bytes(f"models/{MODEL}/policy.json",
                      json.dumps({"require": [], "protected_aliases": {"prod": [atk]}}).encode())
    refused("does not trust")
    store.delete(f"models/{MODEL}/policy.json")  # or removes the protection entirely
    refused("does not trust")
    # the good signature transplanted onto a move to 2: does not verify
    forge({**base, "signature": good.doc["signature"]})
    refused("does not verify")
    # a pointer in the old format (no entry at all)
    store.write_bytes(f"models/{MODEL}/refs/prod", b"2\n")
    refused("set before moves were signed")
    # the good, signed move restored, but release 1's manifest swapped for 2's
    store.write_bytes(f"models/{MODEL}/refs/prod", good.raw)
    store.write_bytes(f"models/{MODEL}/1/MANIFEST.json",
                      store.read_bytes(f"models/{MODEL}/2/MANIFEST.json"))
    with pytest.raises(SignatureError, match="was signed for manifest"):
        pull(store, MODEL, "prod", to=tmp_path / "z", trust=trust)
    assert not (tmp_path / "z").exists()


def test_api_signed_move_and_pull_by_version_unaffected(durable_store_url: str, tmp_path: Path,
                                                        keys: dict[str, tuple[Path, Path]]
                                                        ) -> None:
    setup(durable_store_url, tmp_path, keys)
    trust = load_trust([keys["release"][1]])
    with Registry(durable_store_url, db=f"sqlite:///{tmp_path / 'i.db'}") as reg:
        with pytest.raises(SignatureError):
            reg.set_alias(MODEL, "prod", "2")
        reg.set_alias(MODEL, "prod", "2", sign_key=keys["release"][0])
        assert pull(reg.store, MODEL, "prod", to=tmp_path / "p", trust=trust).version == "2"
        reg.set_alias(MODEL, "staging", "1")  # unprotected, unsigned
        with pytest.raises(SignatureError, match="is not signed"):
            pull(reg.store, MODEL, "staging", to=tmp_path / "s", trust=trust)
        assert pull(reg.store, MODEL, "1", to=tmp_path / "v", trust=trust).version == "1"
        assert pull(reg.store, MODEL, "staging", to=tmp_path / "u").version == "1"  # no trust
