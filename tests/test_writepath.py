"""A local store's write path (direct or buffered, buffer size) is measured on
its own filesystem at the first large write, recorded, and followed by every
writer (issue 19, item 4)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from registry.protocol.commit import commit_local_directory
from registry.store import open_store
from registry.store import local as local_mod
from registry.store import writepath
from registry.protocol.verify import verify_directory

MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REGISTRY_WRITE_PATH", raising=False)
    monkeypatch.setattr(writepath, "_memo", {})
    monkeypatch.setattr(writepath, "PROBE_BYTES", 4 * MIB)


def test_measure_records_the_fastest_variant(tmp_path: Path) -> None:
    wp = writepath.measure(tmp_path)
    assert wp.source == "measured" and wp.seconds
    assert set(wp.seconds) <= {"buffered", "direct-2", "direct-8"} and "buffered" in wp.seconds
    best = min(wp.seconds, key=lambda k: wp.seconds[k])
    assert wp.direct == (best != "buffered")
    if wp.direct:
        assert wp.chunk == int(best.split("-")[1]) * MIB
    doc = json.loads((tmp_path / writepath.RECORD).read_text())
    assert doc["direct"] == wp.direct and doc["st_dev"] == os.stat(tmp_path).st_dev
    assert [p.name for p in (tmp_path / ".registry").iterdir()] == ["write-path.json"]


def test_the_record_is_used_until_the_store_moves_to_another_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / writepath.RECORD
    record.parent.mkdir()
    st_dev = os.stat(tmp_path).st_dev
    record.write_text(json.dumps({"direct": False, "chunk": 2 * MIB, "st_dev": st_dev}))
    measured: list[str] = []
    monkeypatch.setattr(writepath, "measure",
                        lambda root: measured.append(str(root)) or writepath.WritePath(True))
    wp = writepath.write_path(str(tmp_path))
    assert (wp.direct, wp.source, measured) == (False, "recorded", [])
    monkeypatch.setattr(writepath, "_memo", {})
    record.write_text(json.dumps({"direct": False, "chunk": 2 * MIB, "st_dev": st_dev + 1}))
    assert writepath.write_path(str(tmp_path)).direct and measured == [str(tmp_path)]
    monkeypatch.setenv("REGISTRY_WRITE_PATH", "buffered")
    assert writepath.write_path(str(tmp_path)).source == "env"


@pytest.mark.parametrize("direct", [True, False])
def test_writers_follow_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   direct: bool) -> None:
    """Streamed writes and copies of large files go direct only when chosen;
    the bytes and the manifest are the same either way."""
    root = tmp_path / "store"
    root.mkdir()
    (root / ".registry").mkdir()
    (root / writepath.RECORD).write_text(json.dumps(
        {"direct": direct, "chunk": 2 * MIB, "st_dev": os.stat(root).st_dev}))
    opened: list[str] = []
    real = local_mod._DurableFile._open_direct_fd

    def spy(self: local_mod._DurableFile) -> int | None:
        opened.append(self.name)
        return real(self)

    monkeypatch.setattr(local_mod._DurableFile, "_open_direct_fd", spy)
    src = tmp_path / "src"
    src.mkdir()
    payload = random.Random(1).randbytes(20 * MIB + 123)
    (src / "model.safetensors").write_bytes(payload)
    store = open_store(str(root))
    commit_local_directory(store, src, "models/m/1", kind="release", model_id="m",
                           version="1", source={"uri": "x"})
    with store.open_write("models/m/streamed.bin") as f:
        for at in range(0, len(payload), 3 * MIB):
            f.write(payload[at:at + 3 * MIB])
    assert bool(opened) == direct
    assert (root / "models/m/1/model.safetensors").read_bytes() == payload
    assert (root / "models/m/streamed.bin").read_bytes() == payload
    assert verify_directory(store, "models/m/1", full=True).ok
