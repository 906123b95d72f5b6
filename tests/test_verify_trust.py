"""``registry verify --trusted-key``: the verify door refuses what pull refuses
(issue 50's one trust path; found by the break-test: verify said OK for a
release whose shard and manifest a store writer re-hashed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.protocol.layout import release_prefix
from registry.store import Store, join, open_store
from tests.conftest import make_store_url, run_cli
from tests.test_load import MODEL, keys, publish  # noqa: F401  (keys: a fixture)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return open_store(make_store_url(request.param, request, tmp_path))


def _rehash(store: Store, version: str, scratch: Path) -> None:
    """A store writer's swap: new weights bytes, and a manifest re-hashed to
    match them (no signing key: model.sig still names the old digests)."""
    from registry.protocol.manifest import MANIFEST, hash_entry, parse_manifest

    prefix = release_prefix(MODEL, version)
    key = join(prefix, "model.safetensors")
    data = bytearray(store.read_bytes(key))
    data[-10] ^= 0xFF
    store.write_bytes(key, bytes(data))
    m = parse_manifest(store.read_bytes(join(prefix, MANIFEST)), source=prefix)
    tmp = scratch / "rehashed.safetensors"
    tmp.write_bytes(bytes(data))
    new = hash_entry(tmp, "model.safetensors")
    files = [new if e.path == "model.safetensors" else e for e in m.files]
    doc = json.loads(store.read_bytes(join(prefix, MANIFEST)))
    doc["files"] = [e.to_dict() for e in sorted(files, key=lambda e: e.path)]
    store.write_bytes(join(prefix, MANIFEST), json.dumps(doc).encode())


def test_verify_checks_the_signature_when_keys_are_given(
        store: Store, tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:  # noqa: F811
    publish(store, tmp_path, "1", key=keys["release"][0])
    publish(store, tmp_path, "2")
    good = store.url_of(release_prefix(MODEL, "1"))
    pub = str(keys["release"][1])

    p = run_cli("verify", good, "--trusted-key", pub, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signature"].startswith("key ")

    # unsigned, or signed by a key this host does not trust: refused (exit 1, as pull)
    p = run_cli("verify", store.url_of(release_prefix(MODEL, "2")), "--trusted-key", pub,
                cwd=tmp_path)
    assert p.returncode == 1 and "unsigned" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("verify", good, "--trusted-key", str(keys["attacker"][1]), cwd=tmp_path)
    assert p.returncode == 1, p.stderr

    # a shard and its manifest re-hashed by a store writer: bytes match the
    # manifest (verify without keys says OK), the signature does not
    _rehash(store, "1", tmp_path)
    p = run_cli("verify", good, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = run_cli("verify", good, "--trusted-key", pub, cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1


def test_a_signed_release_copied_under_another_version_is_refused(
        tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> None:  # noqa: F811
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", key=keys["release"][0])
    src = tmp_path / "store" / release_prefix(MODEL, "1")
    dst = tmp_path / "store" / release_prefix(MODEL, "7")
    import shutil

    shutil.copytree(src, dst)
    p = run_cli("verify", str(dst), "--trusted-key", str(keys["release"][1]), cwd=tmp_path)
    assert p.returncode == 1 and "copied under another name" in p.stderr, p.stderr
