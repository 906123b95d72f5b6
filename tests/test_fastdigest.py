"""BLAKE3 beside sha256 (registry.protocol.fastdigest, issue 19 item 3).

* A release's manifest records the BLAKE3 of every file of at least 1 MiB,
  equal to the BLAKE3 of the stored bytes; checkpoints and small files get none.
* A pull from a local store checks the BLAKE3 (and not the sha256 pieces);
  a changed byte, a longer or shorter file, or a forged ``blake3`` field is
  refused with the file named, nothing placed, on the blob path and the
  one-write path, from the API and from a real ``registry pull``.
* A signed pull checks the sha256 the signature covers: an attacker who
  rewrites the weights and the ``blake3`` field is refused.
* ``REGISTRY_PULL_DIGEST=sha256`` turns the fast check off; a bad value is
  one line and exit 2. A full disk mid-copy leaves nothing behind.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import blake3
import pytest

import registry.pull.download as download
from registry.protocol import pieces
from registry.protocol.commit import commit_local_directory
from registry.errors import InsufficientSpaceError, IntegrityError
from registry.protocol.manifest import MANIFEST, parse_manifest
from registry.pull import pull
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest
from tests.conftest import run_cli

MODEL = "fast"
BIG = 3 * 1024 * 1024 + 123  # three pieces of 1 MiB and a bit


def make_dir(root: Path, seed: int = 1) -> Path:
    src = root / f"src{seed}"
    (src / "data").mkdir(parents=True)
    rng = __import__("random").Random(seed)
    (src / "data" / "big.bin").write_bytes(rng.randbytes(BIG))
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    return src


def commit(store: Store, root: Path, version: str = "1", kind: str = "release") -> Any:
    prefix = f"models/{MODEL}/{version}" if kind == "release" else f"runs/r/ckpt-{version}"
    meta = ({"model_id": MODEL, "version": version, "source": {"uri": "test"}}
            if kind == "release" else {"run_id": "r", "step": int(version)})
    return commit_local_directory(store, make_dir(root), prefix, kind=kind, **meta)


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(1024 * 1024))
    return open_store(str(tmp_path / "store"))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each BLAKE3 copy; any sha256 piece check fails the test."""
    calls: list[str] = []
    real = download._copy_local_b3

    def copy(src: str, *a: Any, **kw: Any) -> Any:
        calls.append(src)
        return real(src, *a, **kw)

    def no_pieces(*a: Any, **kw: Any) -> None:
        raise AssertionError("a sha256 piece check ran on the BLAKE3 path")

    monkeypatch.setattr(download, "_copy_local_b3", copy)
    monkeypatch.setattr(pieces, "check_fd", no_pieces)
    return calls


def test_release_records_blake3_of_large_files_only(store: Store, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(1024 * 1024))
    m = commit(store, tmp_path)
    big, cfg = m.entry("data/big.bin"), m.entry("config.json")
    data = store.read_bytes(f"models/{MODEL}/1/data/big.bin")
    assert big is not None and big.blake3 == blake3.blake3(data).hexdigest()
    assert big.pieces is not None  # the sha256 pieces stay beside it
    assert cfg is not None and cfg.blake3 is None
    stored = json.loads(store.read_bytes(f"models/{MODEL}/1/{MANIFEST}"))
    assert [f.get("blake3") for f in stored["files"]] == [None, big.blake3]
    assert parse_manifest(store.read_bytes(f"models/{MODEL}/1/{MANIFEST}"), source="t") == m
    ck = commit(store, tmp_path / "ck", "7", kind="checkpoint")
    assert all(e.blake3 is None for e in ck.files)


def test_manifest_with_a_malformed_blake3_is_refused(local: Store, tmp_path: Path) -> None:
    commit(local, tmp_path)
    key = f"models/{MODEL}/1/{MANIFEST}"
    doc = json.loads(local.read_bytes(key))
    doc["files"][1]["blake3"] = "not-hex"
    local.write_bytes(key, json.dumps(doc).encode())
    r = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "t"), "--store",
                local.url_of(""))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert MANIFEST in r.stderr and not (tmp_path / "t").exists()


def test_local_pull_checks_blake3_not_sha256(local: Store, tmp_path: Path,
                                             spy: list[str]) -> None:
    m = commit(local, tmp_path)
    r = pull(local, MODEL, "1", to=tmp_path / "t", cache=tmp_path / "c", blobs=False)
    assert r.placed and len(spy) == 1 and spy[0].endswith("data/big.bin")
    for e in m.files:
        assert (tmp_path / "t" / e.path).read_bytes() == local.read_bytes(
            f"models/{MODEL}/1/{e.path}")
    blobs = tmp_path / "c" / "blobs" / "sha256"
    assert not blobs.exists() or os.listdir(blobs) == []


def test_a_blob_is_kept_only_after_its_sha256_was_checked(local: Store, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob is named by its sha256, so a pull that keeps blobs checks the
    sha256 (by pieces), never the BLAKE3 alone: else a release whose manifest
    pairs another release's sha256 with its own bytes' BLAKE3 would plant
    those bytes under the other release's digest, and every later pull of
    the other release, signed or not, would place them (break-test, this
    round)."""
    calls: list[str] = []
    real = download._copy_local_b3
    monkeypatch.setattr(download, "_copy_local_b3",
                        lambda src, *a, **k: calls.append(src) or real(src, *a, **k))
    victim = commit(local, tmp_path)  # models/fast/1
    victim_big = victim.entry("data/big.bin")
    assert victim_big is not None
    # the attacker's release: its own bytes, the victim's sha256, its bytes' blake3
    evil = b"EVIL" * (BIG // 4) + b"E" * (BIG % 4)
    src = make_dir(tmp_path / "evil", seed=2)
    (src / "data" / "big.bin").write_bytes(evil)
    commit_local_directory(local, src, f"models/{MODEL}/2", kind="release", model_id=MODEL,
                           version="2", source={"uri": "evil"})
    mkey = f"models/{MODEL}/2/{MANIFEST}"
    doc = json.loads(local.read_bytes(mkey))
    for f in doc["files"]:
        if f["path"] == "data/big.bin":
            f["sha256"], f["pieces"] = victim_big.sha256, victim_big.pieces.to_dict()
    local.write_bytes(mkey, json.dumps(doc).encode())
    cache = tmp_path / "c"
    with pytest.raises(IntegrityError, match="data/big.bin"):
        pull(local, MODEL, "2", to=tmp_path / "t2", cache=cache, blobs=True)
    assert calls == []
    blob = cache / "blobs" / "sha256" / victim_big.sha256
    assert not blob.exists()
    pull(local, MODEL, "1", to=tmp_path / "t1", cache=cache, blobs=True)
    assert (tmp_path / "t1" / "data" / "big.bin").read_bytes() == \
        local.read_bytes(f"models/{MODEL}/1/data/big.bin")


def _placed_nothing(tmp_path: Path, target: Path) -> None:
    assert not target.exists()
    blobs = tmp_path / "c" / "blobs" / "sha256"
    assert not blobs.exists() or len(os.listdir(blobs)) <= 1  # at most config.json's
    if target.parent.exists():
        assert not [p for p in os.listdir(target.parent) if p.startswith(target.name)]


@pytest.mark.parametrize("kind", ["flip-middle", "longer", "shorter", "forged-field"])
def test_changed_bytes_or_forged_digest_are_refused(local: Store, tmp_path: Path, spy: list[str],
                                                    kind: str) -> None:
    blobs = False
    m = commit(local, tmp_path)
    key = f"models/{MODEL}/1/data/big.bin"
    data = bytearray(local.read_bytes(key))
    if kind == "flip-middle":
        data[BIG // 2] ^= 0x01
        local.write_bytes(key, bytes(data))
    elif kind == "longer":
        local.write_bytes(key, bytes(data) + b"\0")
    elif kind == "shorter":
        local.write_bytes(key, bytes(data[:-1]))
    else:  # the bytes are intact; the manifest's blake3 is not theirs
        mkey = f"models/{MODEL}/1/{MANIFEST}"
        doc = json.loads(local.read_bytes(mkey))
        doc["files"][1]["blake3"] = blake3.blake3(b"other").hexdigest()
        local.write_bytes(mkey, json.dumps(doc).encode())
    target = tmp_path / "t"
    with pytest.raises(IntegrityError) as info:
        pull(local, MODEL, "1", to=target, cache=tmp_path / "c", blobs=blobs)
    assert info.value.path == "data/big.bin"
    want = "blake3" if kind in ("flip-middle", "forged-field") else "size"
    assert want in str(info.value), str(info.value)
    assert spy, "the BLAKE3 path was not taken"
    _placed_nothing(tmp_path, target)
    # a real process says the same in one line, exit 1
    r = run_cli("pull", f"{MODEL}@1", "--to", str(target), "--cache", str(tmp_path / "c2"),
                "--store", local.url_of(""), "--no-blobs" if not blobs else "--blobs")
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "data/big.bin" in lines[0] and want in lines[0], r.stderr
    assert not target.exists()
    assert m.entry("data/big.bin") is not None


def test_digest_mode_sha256_and_bad_value(local: Store, tmp_path: Path, spy: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    commit(local, tmp_path)
    monkeypatch.setattr(pieces, "check_fd", pieces.check_fd.__wrapped__
                        if hasattr(pieces.check_fd, "__wrapped__") else _real_check_fd)
    monkeypatch.setenv("REGISTRY_PULL_DIGEST", "sha256")
    r = pull(local, MODEL, "1", to=tmp_path / "t", cache=tmp_path / "c")
    assert r.placed and spy == []
    # sha256 mode still refuses a changed byte (by its pieces), naming the piece
    key = f"models/{MODEL}/1/data/big.bin"
    data = bytearray(local.read_bytes(key))
    data[BIG // 2] ^= 0x01
    local.write_bytes(key, bytes(data))
    with pytest.raises(IntegrityError, match="data/big.bin.*piece 1"):
        pull(local, MODEL, "1", to=tmp_path / "t2", cache=tmp_path / "c2")
    for bad in ("blake3", "fast", "1"):
        p = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "t3"), "--store",
                    local.url_of(""), env={"REGISTRY_PULL_DIGEST": bad})
        assert p.returncode == 2, (p.stdout, p.stderr)
        assert p.stderr.strip().splitlines() == [
            f"error: REGISTRY_PULL_DIGEST={bad!r}: expected auto or sha256"]
    assert not (tmp_path / "t3").exists()


_real_check_fd = pieces.check_fd


def test_disk_full_during_the_blake3_copy(local: Store, tmp_path: Path, spy: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    commit(local, tmp_path)
    real = os.copy_file_range
    calls = [0]

    def full(src: int, dst: int, count: int, offset_src: Any = None,
             offset_dst: Any = None) -> int:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, min(count, 1024 * 1024), offset_src, offset_dst)

    monkeypatch.setattr(download.os, "copy_file_range", full)
    target = tmp_path / "t"
    for blobs in (False,):
        calls[0] = 0
        with pytest.raises(InsufficientSpaceError, match="no space left"):
            pull(local, MODEL, "1", to=target, cache=tmp_path / "c", blobs=blobs)
        _placed_nothing(tmp_path, target)
        tmp = tmp_path / "c" / "tmp"
        assert not tmp.exists() or os.listdir(tmp) == []
    monkeypatch.setattr(download.os, "copy_file_range", real)
    assert pull(local, MODEL, "1", to=target, cache=tmp_path / "c", blobs=False).placed


def test_signed_pull_checks_the_sha256_the_signature_covers(local: Store, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            ) -> None:
    """The attacker rewrites the weights and the ``blake3`` field (not the
    sha256, which the signature covers): a signed pull is not fooled."""
    pytest.importorskip("model_signing")
    from registry.trust.keys import generate
    from registry.trust import load_trust
    from registry.release import ModelRelease
    from tests.release_util import ledger_row, summary

    (tmp_path / "keys").mkdir()
    priv, pub, _ = generate(tmp_path / "keys" / "k.pem", public_path=tmp_path / "keys" / "k.pub")
    src = make_dir(tmp_path)
    (src / "model.safetensors").write_bytes(_safetensors())
    ModelRelease(local).publish(src, MODEL, "1", ledger=[ledger_row()],
                                eval_summary=summary(), sign_key=priv)
    rewrite_weights_and_blake3(local, "1")
    assert read_manifest(local, f"models/{MODEL}/1").entry("data/big.bin") is not None
    target = tmp_path / "t"
    with pytest.raises(IntegrityError, match="data/big.bin"):
        pull(local, MODEL, "1", to=target, cache=tmp_path / "c", trust=load_trust([pub]))
    assert not target.exists()
    r = run_cli("pull", f"{MODEL}@1", "--to", str(target), "--cache", str(tmp_path / "c2"),
                "--store", local.url_of(""), "--trusted-key", str(pub))
    assert r.returncode == 1 and "data/big.bin" in r.stderr, (r.stdout, r.stderr)
    assert not target.exists()


def rewrite_weights_and_blake3(store: Store, version: str) -> None:
    """The attacker: flip a byte in the middle of ``data/big.bin`` and rewrite
    its ``blake3`` field to match, keeping its sha256 (which a signature covers)."""
    key = f"models/{MODEL}/{version}/data/big.bin"
    evil = bytearray(store.read_bytes(key))
    evil[BIG // 2] ^= 0x01
    store.write_bytes(key, bytes(evil))
    mkey = f"models/{MODEL}/{version}/{MANIFEST}"
    doc = json.loads(store.read_bytes(mkey))
    for f in doc["files"]:
        if f["path"] == "data/big.bin":
            assert f.get("blake3")
            f["blake3"] = blake3.blake3(bytes(evil)).hexdigest()
    store.write_bytes(mkey, json.dumps(doc).encode())


def _safetensors() -> bytes:
    import io

    import numpy as np

    from registry.formats.safetensors_io import write_safetensors
    buf = io.BytesIO()
    write_safetensors(buf, {"w": np.ones((8, 8), dtype=np.float32)},
                      metadata={"format": "pt"}, path="model.safetensors")
    return buf.getvalue()


def test_a_signed_repull_rehashes_what_a_blake3_pull_placed(local: Store, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             ) -> None:
    """A target placed by an unsigned pull (checked by BLAKE3) is not taken as
    verified by a signed pull of the same release: the signed pull re-hashes
    those files with sha256 once. Untampered: a no-op that records the sha256
    check. Weights and blake3 rewritten before the unsigned pull (the
    signature still matches the manifest's sha256): the signed re-pull refuses
    the target."""
    pytest.importorskip("model_signing")
    monkeypatch.setenv("REGISTRY_CACHE_TRUST_STAMPS", "1")  # else every re-pull re-hashes
    from registry.errors import CommitConflictError
    from registry.trust.keys import generate
    from registry.trust import load_trust
    from registry.release import ModelRelease
    from tests.release_util import ledger_row, summary

    (tmp_path / "keys").mkdir()
    priv, pub, _ = generate(tmp_path / "keys" / "k.pem", public_path=tmp_path / "keys" / "k.pub")
    trust = load_trust([pub])
    rel = ModelRelease(local)
    for version in ("1", "2"):
        src = make_dir(tmp_path / version, seed=int(version))
        (src / "model.safetensors").write_bytes(_safetensors())
        rel.publish(src, MODEL, version, ledger=[ledger_row()], eval_summary=summary(),
                    sign_key=priv)
    import importlib
    mat = importlib.import_module("registry.pull.materialize")
    hashed: list[str] = []
    real_hash = mat.hash_file
    monkeypatch.setattr(mat, "hash_file", lambda p: (hashed.append(str(p)), real_hash(p))[1])
    cache = tmp_path / "c"
    ok = tmp_path / "ok"
    assert pull(local, MODEL, "1", to=ok, cache=cache, blobs=False).placed
    hashed.clear()
    r = pull(local, MODEL, "1", to=ok, cache=cache, trust=trust)
    assert not r.placed and any(h.endswith("big.bin") for h in hashed)
    hashed.clear()
    assert not pull(local, MODEL, "1", to=ok, cache=cache, trust=trust).placed
    assert hashed == []  # checked once, recorded
    # the attack: version 2's weights and blake3 rewritten, its sha256 (signed) kept
    rewrite_weights_and_blake3(local, "2")
    bad = tmp_path / "bad"
    pull(local, MODEL, "2", to=bad, cache=cache, blobs=False)  # unsigned: the manifest rules
    with pytest.raises((CommitConflictError, IntegrityError), match="data/big.bin"):
        pull(local, MODEL, "2", to=bad, cache=cache, trust=trust)
    with pytest.raises(IntegrityError, match="data/big.bin"):
        pull(local, MODEL, "2", to=bad, cache=cache, trust=trust, force=True)
