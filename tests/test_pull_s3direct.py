"""An S3 pull through direct ranged GETs (issue 43 item 9, registry.pull.s3fetch).

Real S3 servers (moto, SeaweedFS) and the fault proxy in front of moto. Pieces
of 64 KiB (``REGISTRY_PIECE_SIZE``) so a 1.3 MiB file has 21 of them, each its
own ranged GET. Checked: the bytes placed, the requests sent (each piece once,
the last asking one byte past the size), a tampered / truncated / longer /
swapped object refused with nothing placed (target, blob, temp), a corrupted
answer refused, transient faults retried, and the s3fs stream still there
behind ``REGISTRY_PULL_S3_DIRECT=0``.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from registry.errors import IntegrityError, PieceMismatchError
from registry.protocol.verify import read_manifest
from registry.pull import pull
from registry.pull import s3fetch
from registry.release import ModelRelease
from registry.store import Store, join, open_store
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request
from tests.test_pull import ReadLog, _safetensors

PIECE = 64 * 1024
SIZE = 20 * PIECE + 999
MODEL = "tiny"
PREFIX = "models/tiny/1"


@pytest.fixture(params=["s3", "seaweed"])
def s3_url(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(PIECE))
    monkeypatch.delenv(s3fetch.ENV, raising=False)
    if request.param == "seaweed":
        return f"s3://{request.getfixturevalue('seaweed_bucket')}/root"
    return f"s3://{request.getfixturevalue('s3_bucket')}/root"


def _publish(url: str, tmp_path: Path) -> dict[str, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    files = {"weights.bin": random.Random(7).randbytes(SIZE),
             "small.bin": random.Random(8).randbytes(3000),
             "empty.bin": b"",
             "config.json": b'{"hidden_size": 8}\n',
             "model.safetensors": _safetensors()}
    for name, data in files.items():
        (src / name).write_bytes(data)
    ModelRelease(url).publish(src, MODEL, "1", ledger=[ledger_row()], eval_summary=summary())
    store = open_store(url)  # the released bytes (publish rewrites the safetensors header)
    released = {e.path: store.read_bytes(join(PREFIX, e.path))
                for e in read_manifest(store, PREFIX).files}
    assert released["weights.bin"] == files["weights.bin"]
    return released


def _nothing_placed(cache: Path, target: Path, digest: str) -> None:
    assert not target.exists()
    assert not (cache / "blobs" / "sha256" / digest).exists()
    if (cache / "tmp").exists():
        assert os.listdir(cache / "tmp") == []
    parent = target.parent
    if parent.exists():  # no staging directory left beside the target
        assert [p for p in os.listdir(parent) if ".pull-" in p] == []


@pytest.mark.parametrize("blobs", [True, False])
def test_each_piece_is_one_ranged_get_and_the_bytes_are_placed(
        s3_url: str, tmp_path: Path, blobs: bool) -> None:
    files = _publish(s3_url, tmp_path)
    store = open_store(s3_url)
    m = read_manifest(store, PREFIX)
    entry = m.entry("weights.bin")
    assert entry is not None and entry.pieces is not None and entry.pieces.count() == 21
    log = ReadLog(store)
    cache, target = tmp_path / "cache", tmp_path / "model"
    got: list[int] = []
    r = pull(store, MODEL, "1", to=target, cache=cache, workers=4, blobs=blobs,
             progress=got.append)
    for name, data in files.items():
        assert (target / name).read_bytes() == data, name
    assert r.transferred == sum(len(d) for d in files.values()) == sum(got)
    blob = cache / "blobs" / "sha256" / entry.sha256
    assert blob.exists() == blobs
    if blobs:
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == entry.sha256
    # every data byte came through the direct GETs, none through s3fs
    assert not [k for meth, k, _ in log.reads if meth != "read_into"
                and "/models/tiny/1/" in "/" + k and not k.endswith("MANIFEST.json")
                and not k.endswith(".json")]
    ranges = sorted(rng for meth, k, rng, _ in log.requests
                    if meth == "get_object" and k and k.endswith("/weights.bin"))
    want = sorted(f"bytes={a}-{b - 1 + (b == SIZE)}" for a, b in entry.pieces.bounds(SIZE))
    assert ranges == want  # one GET per piece, each once; the last asks one byte more
    assert log.data_bytes("1")["weights.bin"] == SIZE


@pytest.mark.parametrize("kind", ["flip", "truncate", "longer", "swapped"])
@pytest.mark.parametrize("blobs", [True, False])
def test_a_tampered_object_is_refused_and_nothing_is_placed(
        s3_url: str, tmp_path: Path, kind: str, blobs: bool) -> None:
    files = _publish(s3_url, tmp_path)
    store = open_store(s3_url)
    entry = read_manifest(store, PREFIX).entry("weights.bin")
    assert entry is not None
    data = files["weights.bin"]
    if kind == "flip":  # one bit in piece 7
        pos = 7 * PIECE + 100
        bad = data[:pos] + bytes([data[pos] ^ 1]) + data[pos + 1:]
    elif kind == "truncate":
        bad = data[:SIZE - 500]
    elif kind == "longer":
        bad = data + b"x"
    else:  # another file of the same size
        bad = random.Random(99).randbytes(SIZE)
    store.write_bytes(join(PREFIX, "weights.bin"), bad)
    cache, target = tmp_path / "cache", tmp_path / "model"
    with pytest.raises(IntegrityError) as e:
        pull(store, MODEL, "1", to=target, cache=cache, workers=4, blobs=blobs)
    assert e.value.path == "weights.bin"
    if kind == "flip":
        assert isinstance(e.value, PieceMismatchError) and "piece 7" in str(e.value)
    if kind == "swapped":
        assert isinstance(e.value, PieceMismatchError) and "piece 0" in str(e.value)
    if kind in ("truncate", "longer"):
        assert "size" in str(e.value)
    _nothing_placed(cache, target, entry.sha256)
    # repaired: the next pull places the released bytes
    store.write_bytes(join(PREFIX, "weights.bin"), data)
    pull(store, MODEL, "1", to=target, cache=cache, workers=4, blobs=blobs)
    assert (target / "weights.bin").read_bytes() == data


@pytest.fixture
def proxied(s3_bucket: str, proxy: FaultProxy, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, dict[str, bytes]]]:
    """A release on moto, and a store that reaches moto through the fault proxy."""
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(PIECE))
    monkeypatch.delenv(s3fetch.ENV, raising=False)
    url = f"s3://{s3_bucket}/root"
    files = _publish(url, tmp_path)
    store = open_store(url, retry_delay=0.01, client_kwargs={"endpoint_url": proxy.endpoint},
                       config_kwargs={"read_timeout": 2, "connect_timeout": 2})
    yield store, files
    store.close()


def _piece_get(k: int) -> Callable[[Request], bool]:
    start = f"bytes={k * PIECE}-"

    def match(req: Request) -> bool:
        return (req.op == "GetObject" and req.key.endswith("weights.bin")
                and req.headers.get("Range", req.headers.get("range", "")).startswith(start))
    return match


@pytest.mark.parametrize("fault", ["503", "reset", "reset_after"])
def test_a_failed_piece_get_is_sent_again(proxied: tuple[Store, dict[str, bytes]],
                                          proxy: FaultProxy, tmp_path: Path,
                                          fault: str) -> None:
    store, files = proxied
    action = {"503": Action("error", status=503, code="SlowDown"),
              "reset": Action("reset"), "reset_after": Action("reset_after")}[fault]
    hit = _piece_get(5)
    fired: list[int] = []

    def rule(req: Request) -> Action | None:
        if hit(req) and not fired:
            fired.append(req.seq)
            return action
        return None
    proxy.rules.append(rule)
    target = tmp_path / "model"
    pull(store, MODEL, "1", to=target, cache=tmp_path / "cache", workers=4)
    assert fired, "the fault never fired"
    assert (target / "weights.bin").read_bytes() == files["weights.bin"]
    assert len([r for r in proxy.log if hit(r)]) == 2  # the piece's GET, sent again once


def test_bytes_changed_in_flight_are_refused(proxied: tuple[Store, dict[str, bytes]],
                                             proxy: FaultProxy, tmp_path: Path) -> None:
    """A store (or a cache on the way) answering other bytes for one piece's range."""
    store, _ = proxied
    entry = read_manifest(store, PREFIX).entry("weights.bin")
    assert entry is not None
    hit = _piece_get(12)
    proxy.rules.append(lambda req: Action("corrupt") if hit(req) else None)
    cache, target = tmp_path / "cache", tmp_path / "model"
    with pytest.raises(PieceMismatchError) as e:
        pull(store, MODEL, "1", to=target, cache=cache, workers=4)
    assert e.value.path == "weights.bin" and "piece 12" in str(e.value)
    _nothing_placed(cache, target, entry.sha256)


def test_the_s3fs_stream_is_kept_behind_the_switch(proxied: tuple[Store, dict[str, bytes]],
                                                   proxy: FaultProxy, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store, files = proxied
    monkeypatch.setenv(s3fetch.ENV, "0")
    target = tmp_path / "model"
    pull(store, MODEL, "1", to=target, cache=tmp_path / "cache", workers=4)
    assert (target / "weights.bin").read_bytes() == files["weights.bin"]
    gets = [r for r in proxy.log if r.op == "GetObject" and r.key.endswith("weights.bin")]
    assert len(gets) == 1  # one stream (a file this small is never split)
