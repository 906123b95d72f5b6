"""Piece digests (issue 19, item 2): the SHA-256 state at every piece boundary,
recorded at commit, checked piece by piece on every core by verify, pull and
checkpoint resume; a manifest without them still verifies the old way.

Pieces are 64 KiB here (``REGISTRY_PIECE_SIZE``) so a three-piece file is small.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from pathlib import Path

import pytest

from registry.protocol import pieces as pc
from registry.checkpoint.tree import CheckpointSkippedWarning, CheckpointTree
from registry.protocol.commit import DirectoryWriter, commit_local_directory
from registry.errors import (
    IntegrityError,
    ManifestError,
    NoValidCheckpointError,
    PieceMismatchError,
)
from registry.protocol.manifest import MANIFEST, FileEntry, Manifest, build_manifest, parse_manifest
from registry.protocol.pieces import ChainHasher, Pieces, check_piece
from registry.pull import pull
from registry.store import Store, join
from registry.protocol.verify import verify_directory
from tests.conftest import run_cli

PIECE = 64 * 1024
SIZE = 2 * PIECE + 1000  # three pieces: 64 KiB, 64 KiB, 1000 bytes
MIDDLE = PIECE + 500  # a byte of the middle piece


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(PIECE))


def big() -> bytes:
    return random.Random(7).randbytes(SIZE)


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("size", [0, 1, 63, 64, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE, SIZE])
def test_chain_hasher_is_sha256_and_its_states_check_each_piece(size: int) -> None:
    data = random.Random(size).randbytes(size)
    h = ChainHasher(PIECE)
    for at in range(0, size, 7777):  # blocks that straddle piece boundaries
        h.update(memoryview(data)[at:at + 7777])
    assert h.hexdigest() == sha(data) and h.size == size
    if size <= PIECE:
        assert h.pieces is None
        return
    p = h.pieces
    assert p is not None and p.size == PIECE and p.count() == -(-size // PIECE) and p.fits(size)
    for k, (a, b) in enumerate(p.bounds(size)):
        assert check_piece(p, sha(data), size, k, [data[a:b]]) is None
        bad = flip(data, (a + b) // 2)
        assert check_piece(p, sha(data), size, k, [bad[a:b]]) is not None


def write_dir(root: Path, payload: bytes) -> Path:
    root.mkdir(parents=True)
    (root / "model.safetensors").write_bytes(payload)
    (root / "config.json").write_text('{"hidden_size": 8}\n')
    return root


def commit_release(store: Store, tmp_path: Path, payload: bytes) -> Manifest:
    src = write_dir(tmp_path / "src", payload)
    return commit_local_directory(store, src, "models/tiny/1", kind="release", model_id="tiny",
                                  version="1", source={"uri": str(src)})


def test_commit_records_piece_states_beside_the_sha256(store: Store, tmp_path: Path) -> None:
    payload = big()
    m = commit_release(store, tmp_path, payload)
    e = m.entry("model.safetensors")
    assert e is not None and e.sha256 == sha(payload) and e.pieces is not None
    assert e.pieces.size == PIECE and len(e.pieces.states) == 2
    small = m.entry("config.json")
    assert small is not None and small.pieces is None  # one piece: nothing to add
    doc = json.loads(store.read_bytes(join("models/tiny/1", MANIFEST)))
    listed = {f["path"]: f for f in doc["files"]}
    assert listed["model.safetensors"]["pieces"] == {"size": PIECE,
                                                     "states": list(e.pieces.states)}
    assert "pieces" not in listed["config.json"]
    # The same states whichever way the file was hashed: streaming writes,
    # the commit's copy, a manifest built from a local directory.
    with DirectoryWriter(store, "models/tiny/2", kind="release",
                         meta={"model_id": "tiny", "version": "2",
                               "source": {"uri": "x"}}) as w:
        with w.open("model.safetensors") as f:
            for at in range(0, SIZE, 5000):
                f.write(payload[at:at + 5000])
        assert w.entries["model.safetensors"] == e
    built = build_manifest(tmp_path / "src", "release", model_id="tiny", version="1",
                           source={"uri": "x"})
    assert built.entry("model.safetensors") == e
    assert parse_manifest(m.to_bytes(), source="m") == m


def test_states_that_do_not_fit_the_size_are_refused() -> None:
    e = FileEntry("w.bin", SIZE, "0" * 64, Pieces(PIECE, ("1" * 64,)))  # needs two states
    with pytest.raises(ManifestError, match=r"w.bin.*1 piece states"):
        Manifest.build("release", [e], model_id="tiny", version="1", source={"uri": "x"})
    doc = json.loads(Manifest.build("release", [FileEntry("w.bin", 3, "0" * 64)], model_id="t",
                                    version="1", source={"uri": "x"}).to_bytes())
    doc["files"][0]["pieces"] = {"size": 100, "states": ["a" * 64]}  # not a multiple of 64
    with pytest.raises(ManifestError, match="multiple"):
        parse_manifest(json.dumps(doc).encode(), source="M")


def tamper(store: Store, key: str, at: int) -> bytes:
    bad = flip(store.read_bytes(key), at)
    store.write_bytes(key, bad)
    return bad


def assert_names_middle_piece(err: IntegrityError, entry: FileEntry, bad: bytes) -> None:
    assert isinstance(err, PieceMismatchError)
    assert entry.pieces is not None
    assert err.path == "model.safetensors" and err.piece == 1
    assert (err.start, err.end) == (PIECE, 2 * PIECE)
    assert err.expected_state == entry.pieces.states[1]
    h = ChainHasher(PIECE)
    h.update(bad[:2 * PIECE])
    assert err.actual_state == h.states[1] != err.expected_state
    for fact in ("model.safetensors", "piece 1", err.expected_state, err.actual_state):
        assert fact in str(err)


def test_one_tampered_byte_in_the_middle_piece_is_named(store: Store, tmp_path: Path) -> None:
    m = commit_release(store, tmp_path, big())
    entry = m.entry("model.safetensors")
    assert entry is not None
    assert verify_directory(store, "models/tiny/1", full=True).ok
    bad = tamper(store, "models/tiny/1/model.safetensors", MIDDLE)
    report = verify_directory(store, "models/tiny/1", full=True)
    assert not report.ok and len(report.problems) == 1
    assert_names_middle_piece(report.problems[0], entry, bad)
    # pull refuses it too, naming the same piece, and places nothing
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    with pytest.raises(PieceMismatchError) as e:
        pull(store, "tiny", "1", to=serve, cache=cache)
    assert_names_middle_piece(e.value, entry, bad)
    assert not serve.exists()
    blobs = {p.name for p in (cache / "blobs").rglob("*") if p.is_file()}
    assert entry.sha256 not in blobs and sha(bad) not in blobs
    # repaired: the pull places it, and --verify re-checks the placed pieces
    store.write_bytes("models/tiny/1/model.safetensors", flip(bad, MIDDLE))
    r = pull(store, "tiny", "1", to=serve, cache=cache, verify=True)
    assert r.placed and (serve / "model.safetensors").read_bytes() == flip(bad, MIDDLE)


def test_cli_verify_names_file_piece_and_both_states(durable_store_url: str,
                                                     tmp_path: Path) -> None:
    from registry.store import open_store

    store = open_store(durable_store_url)
    m = commit_release(store, tmp_path, big())
    entry = m.entry("model.safetensors")
    assert entry is not None and entry.pieces is not None
    bad = tamper(store, "models/tiny/1/model.safetensors", MIDDLE)
    p = run_cli("verify", store.url_of("models/tiny/1"), "--full")
    assert p.returncode == 1, p.stderr
    h = ChainHasher(PIECE)
    h.update(bad[:2 * PIECE])
    line = [ln for ln in (p.stdout + p.stderr).splitlines() if "model.safetensors" in ln]
    assert line and "piece 1" in line[0]
    assert entry.pieces.states[1] in line[0] and h.states[1] in line[0]


def test_a_manifest_without_pieces_verifies_whole_files(store: Store, tmp_path: Path) -> None:
    """Older releases and foreign trees: no ``pieces``, the whole-file sha256."""
    payload = big()
    with DirectoryWriter(store, "runs/r/ckpt/step-000001", kind="checkpoint",
                         meta={"run_id": "r", "step": 1}) as w:
        w.write_bytes("model.safetensors", payload)
        w.entries["model.safetensors"] = FileEntry("model.safetensors", SIZE, sha(payload))
        w.commit()
    m = parse_manifest(store.read_bytes("runs/r/ckpt/step-000001/MANIFEST.json"), source="m")
    assert all(e.pieces is None for e in m.files)
    assert verify_directory(store, "runs/r/ckpt/step-000001", full=True).ok
    bad = tamper(store, "runs/r/ckpt/step-000001/model.safetensors", MIDDLE)
    [err] = verify_directory(store, "runs/r/ckpt/step-000001", full=True).problems
    assert not isinstance(err, PieceMismatchError)
    assert (err.expected_sha256, err.actual_sha256) == (sha(payload), sha(bad))


def test_forged_states_never_pass_other_bytes(store: Store, tmp_path: Path) -> None:
    """States recomputed for tampered bytes, beside the original sha256 (what
    a signature covers): the last piece must finalize to that sha256, so the
    file fails; all pieces verified is the whole-file sha256 verified."""
    payload = big()
    m = commit_release(store, tmp_path, payload)
    bad = flip(payload, MIDDLE)
    forged = ChainHasher(PIECE)
    forged.update(bad)
    assert forged.pieces is not None
    doc = json.loads(m.to_bytes())
    for f in doc["files"]:
        if f["path"] == "model.safetensors":
            f["pieces"]["states"] = list(forged.pieces.states)
    store.write_bytes("models/tiny/1/model.safetensors", bad)
    store.write_bytes("models/tiny/1/MANIFEST.json", json.dumps(doc).encode())
    [err] = verify_directory(store, "models/tiny/1", full=True).problems
    assert isinstance(err, PieceMismatchError) and err.piece == 2
    assert err.expected_state == sha(payload) and err.actual_state == sha(bad)


def test_resume_skips_a_step_with_a_tampered_piece(store: Store) -> None:
    tree = CheckpointTree(store, "runs/r/ckpt")
    for step in (1, 2):
        with DirectoryWriter(store, tree.prefix(step), kind="checkpoint",
                             meta={"run_id": "r", "step": step}) as w:
            w.write_bytes("model.safetensors", big())
            w.write_json("trainer_state.json", {"step": step})
            w.commit()
        tree.set_latest(step)
    tamper(store, join(tree.prefix(2), "model.safetensors"), MIDDLE)
    with pytest.warns(CheckpointSkippedWarning, match=r"step-000002.*piece 1"):
        step, _ = tree.resumable()
    assert step == 1
    with pytest.raises(NoValidCheckpointError, match="piece 1"):
        tree.resumable(2, fallback=False)


def test_pieces_are_checked_on_several_threads(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece is its own task: one large file verifies on every core."""
    from registry.store import open_store

    store = open_store(str(tmp_path / "store"))
    commit_release(store, tmp_path, random.Random(3).randbytes(8 * PIECE))
    seen: set[str] = set()
    real = pc.check_fd

    def spy(*args: object) -> str | None:
        seen.add(threading.current_thread().name)
        time.sleep(0.05)  # hold this thread: the next piece goes to another
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(pc, "check_fd", spy)
    assert verify_directory(store, "models/tiny/1", full=True, workers=2).ok
    assert len(seen) >= 2
