"""registry.load.direct: local reads that land in the tensors' own pages (issue 43).

Each way a chunk can be read (the page cache with RWF_NOWAIT, O_DIRECT, plain
preadv, and a page cache holding only part of the chunk) must put exactly
the file's bytes into every destination and hand the hasher the file's bytes
in order; a file shorter than asked stops early; nothing outside the
destinations' spans is written into them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import registry.load.direct as direct
from registry.load.pieces import Target

MIB = 1024 * 1024


def _file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = hashlib.shake_256(b"direct").digest(size)
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    return path, data


def _evict(path: Path, start: int = 0, length: int = 0) -> None:
    """Drop the file's clean pages from the page cache (all, or a span)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _targets(spans: list[tuple[int, int]], aligned: bool) -> list[Target]:
    out = []
    for s, e in spans:
        if aligned:
            mem, off = direct.aligned(s, e)
            whole = memoryview(mem)
            out.append(Target(s, e, whole[off:off + e - s], whole, s - off))
        else:
            out.append(Target(s, e, memoryview(bytearray(e - s))))
    return out


MODES = ["cached", "direct", "plain", "partly-cached"]


def _mode(mode: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode in ("direct", "plain"):
        monkeypatch.setattr(direct, "_NOWAIT", 0)
    if mode == "plain":
        monkeypatch.setattr(direct, "_DIRECT", 0)
    if mode == "direct":
        _evict(path)
    if mode == "partly-cached":
        _evict(path, 3 * MIB, 2 * MIB)  # a hole in the middle of the first chunk


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_every_destination_gets_the_file_bytes(tmp_path: Path, mode: str, aligned: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors with unaligned edges, two sharing a page, one spanning chunks,
    one ending at the file's unaligned end; a header buffer; gaps no one asks
    for: each gets exactly its bytes, and the hashed stream is the file."""
    size = 20 * MIB + 1234
    path, data = _file(tmp_path, size)
    _mode(mode, path, monkeypatch)
    spans = [(0, 100), (200, 5000), (5000, 9 * MIB + 17), (12 * MIB + 3, 12 * MIB + 70_000),
             (16 * MIB + 8, size)]
    targets = _targets(spans, aligned)
    targets[0] = Target(0, 100, memoryview(bytearray(100)))  # a header: ordinary memory
    d = direct.Descriptors(os.open(path, os.O_RDONLY))
    try:
        if mode == "direct":
            assert d.direct >= 0  # ext4 takes O_DIRECT; tmpfs would not
        h = hashlib.sha256()
        n = 0
        for block in direct.chunks(d, 0, size, size, targets):
            h.update(block)
            n += len(block)
    finally:
        d.close()
    assert n == size and h.hexdigest() == hashlib.sha256(data).hexdigest()
    for t in targets:
        assert bytes(t.view) == data[t.start:t.end], (t.start, t.end)


@pytest.mark.parametrize("mode", ["cached", "direct", "plain"])
def test_a_piece_inside_the_file_writes_nothing_outside_it(
        tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading piece [4 MiB, 8 MiB) fills only the bytes of the destinations
    inside it: a destination spanning the piece's edges keeps zeros outside."""
    size = 12 * MIB
    path, data = _file(tmp_path, size)
    _mode(mode, path, monkeypatch)
    (t,) = _targets([(3 * MIB + 5, 9 * MIB - 7)], aligned=True)
    d = direct.Descriptors(os.open(path, os.O_RDONLY))
    try:
        got = b"".join(bytes(b) for b in direct.chunks(d, 4 * MIB, 8 * MIB, size, [t]))
    finally:
        d.close()
    assert got == data[4 * MIB:8 * MIB]
    view = bytes(t.view)
    inside = slice(4 * MIB - t.start, 8 * MIB - t.start)
    assert view[inside] == data[4 * MIB:8 * MIB]
    assert view[:inside.start] == bytes(inside.start)
    assert view[inside.stop:] == bytes(len(view) - inside.stop)


@pytest.mark.parametrize("mode", ["cached", "direct", "plain"])
def test_a_short_file_stops_where_it_ends(tmp_path: Path, mode: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest says 10 MiB + 5 but the file holds 9 MiB + 3: the bytes
    handed to the hasher stop at the file's end (the piece reader then
    reports the truncation)."""
    path, data = _file(tmp_path, 9 * MIB + 3)
    _mode(mode, path, monkeypatch)
    size = 10 * MIB + 5
    targets = _targets([(MIB, size)], aligned=True)
    d = direct.Descriptors(os.open(path, os.O_RDONLY))
    try:
        got = b"".join(bytes(b) for b in direct.chunks(d, 0, size, size, targets))
    finally:
        d.close()
    assert got == data


def test_the_direct_twin_is_the_open_file_not_the_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The O_DIRECT descriptor is reopened from the open file: a file renamed
    over the path afterwards is not what it reads."""
    monkeypatch.setattr(direct, "_NOWAIT", 0)
    path, data = _file(tmp_path, 2 * MIB)
    d = direct.Descriptors(os.open(path, os.O_RDONLY))
    assert d.direct >= 0
    try:
        other = tmp_path / "other.bin"
        other.write_bytes(bytes(2 * MIB))
        os.replace(other, path)
        targets: list[Any] = _targets([(0, 2 * MIB)], aligned=True)
        _evict(path)
        got = b"".join(bytes(b) for b in direct.chunks(d, 0, 2 * MIB, 2 * MIB, targets))
    finally:
        d.close()
    assert got == data and bytes(targets[0].view) == data
