"""Copying a local directory into a local store: direct I/O, the kernel copy,
the user-space copy, and several files at once. Each path must store exactly
the source bytes and a manifest of the bytes it wrote."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from registry.protocol import hashing
from registry.protocol.commit import DirectoryWriter, commit_local_directory
from registry.errors import (
    InsufficientSpaceError,
    ObjectNotFoundError,
    StorageError,
    UsageError,
)
from registry.store import open_store
from registry.store import local as local_mod
from registry.store.local import _DurableFile
from registry.protocol.verify import verify_directory
from tests.support.forkclient import python_run

MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def _direct_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the direct path's mechanics: the store's
    measured choice (registry.store.writepath, tests/test_writepath.py)
    is pinned to direct I/O in 8 MiB buffers."""
    monkeypatch.setenv("REGISTRY_WRITE_PATH", "direct")


def _big_dir(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"big.bin": os.urandom(37 * MIB + 5), "sub/small.txt": b"x" * 10,
             "empty": b""}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    return src, files


def _commit(tmp_path: Path, src: Path):
    store = open_store(str(tmp_path / "store"))
    m = commit_local_directory(store, src, "m/1", kind="release", model_id="m", version="1",
                               source={"uri": str(src)})
    return store, m


def _assert_stored(tmp_path: Path, store, m, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        stored = (tmp_path / "store" / "m" / "1" / rel).read_bytes()
        assert stored == data, rel
        entry = m.entry(rel)
        assert entry is not None and entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert verify_directory(store, "m/1", full=True).ok


def _no_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a filesystem without O_DIRECT (tmpfs)."""
    monkeypatch.setattr(_DurableFile, "open_direct", lambda self: None)


def _spy_direct_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record ``(offset, length)`` of every direct write, which still happens."""
    writes: list[tuple[int, int]] = []
    real = _DurableFile.pwrite_direct

    def spy(self: _DurableFile, view: memoryview, offset: int) -> None:
        writes.append((offset, len(view)))
        real(self, view, offset)
    monkeypatch.setattr(_DurableFile, "pwrite_direct", spy)
    return writes


# -- direct I/O -----------------------------------------------------------------------

@pytest.mark.parametrize("size", [hashing.DIRECT_MIN, hashing.DIRECT_CHUNK * 3,
                                  hashing.DIRECT_CHUNK * 5 + 4095, 37 * MIB + 5])
def test_large_files_are_written_with_direct_io(tmp_path: Path, size: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes on and off the chunk and alignment boundaries: the padding of the
    last direct write is cut off, every byte is the source's."""
    src = tmp_path / "src"
    src.mkdir()
    files = {"big.bin": os.urandom(size), "small.json": b"{}"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    writes = _spy_direct_writes(monkeypatch)
    store, m = _commit(tmp_path, src)
    _assert_stored(tmp_path, store, m, files)
    chunks = -(-size // hashing.DIRECT_CHUNK)
    assert [o for o, _ in writes] == [i * hashing.DIRECT_CHUNK for i in range(chunks)]
    assert all(n % 4096 == 0 for _, n in writes)  # every direct write aligned


def test_a_file_below_the_direct_threshold_is_copied_by_the_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {"w.bin": os.urandom(hashing.DIRECT_MIN - 1)}
    (src / "w.bin").write_bytes(files["w.bin"])
    opened = []
    real = _DurableFile.open_direct
    monkeypatch.setattr(_DurableFile, "open_direct",
                        lambda self: opened.append(self.name) or real(self))
    store, m = _commit(tmp_path, src)
    _assert_stored(tmp_path, store, m, files)
    assert opened == []


def test_a_refused_first_direct_write_falls_back_with_nothing_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem that opens O_DIRECT but refuses the alignment (EINVAL):
    the file is copied by the next path, from its first byte, hashed once."""
    src, files = _big_dir(tmp_path)
    refused = []

    def refuse(self: _DurableFile, view: memoryview, offset: int) -> None:
        refused.append(offset)
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(_DurableFile, "pwrite_direct", refuse)
    store, m = _commit(tmp_path, src)
    assert refused == [0]
    _assert_stored(tmp_path, store, m, files)


def test_a_direct_write_failing_midway_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full in the middle of a direct copy: an error naming the disk
    problem, no committed directory, no staging left behind."""
    src, _ = _big_dir(tmp_path)
    real = _DurableFile.pwrite_direct

    def full(self: _DurableFile, view: memoryview, offset: int) -> None:
        if offset >= 2 * hashing.DIRECT_CHUNK:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, view, offset)
    monkeypatch.setattr(_DurableFile, "pwrite_direct", full)
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(InsufficientSpaceError, match=r"big\.bin: no space left on device"):
        commit_local_directory(store, src, "m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    assert not (tmp_path / "store" / "m" / "1").exists()
    assert [p.name for p in (tmp_path / "store" / "m").iterdir()] == []


def test_a_direct_copy_hashes_the_buffer_it_wrote(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest is of what reached the disk: a source that changes while it
    is read still yields a manifest that verifies against the stored bytes.

    The before/after stat check (registry.host.sourcecheck, issue 29) refuses such
    a change when the file's timestamps show it; within the filesystem's
    timestamp granularity they do not, and then this hashing is what keeps the
    manifest true. The stat check is switched off here so that this path is
    tested every time (tests/test_source_confine.py tests the refusal)."""
    from registry.protocol import commit as commit_module

    monkeypatch.setattr(commit_module, "check_local", lambda *a, **k: None)
    src, files = _big_dir(tmp_path)
    real_fill = hashing._fill
    calls = []

    def changing(f, view):  # the source changes after its first chunk was read
        n = real_fill(f, view)
        calls.append(n)
        if len(calls) == 1:
            with open(src / "big.bin", "r+b") as g:
                g.seek(hashing.DIRECT_CHUNK + 7)
                g.write(b"CHANGED")
        return n
    monkeypatch.setattr(hashing, "_fill", changing)
    store, m = _commit(tmp_path, src)
    stored = (tmp_path / "store" / "m" / "1" / "big.bin").read_bytes()
    assert stored[hashing.DIRECT_CHUNK + 7:hashing.DIRECT_CHUNK + 14] == b"CHANGED"
    assert m.entry("big.bin").sha256 == hashlib.sha256(stored).hexdigest()
    assert verify_directory(store, "m/1", full=True).ok


# -- the kernel copy and the user-space copy -------------------------------------------

def test_without_direct_io_the_kernel_copies_and_the_landed_bytes_are_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without direct I/O, files are copied with copy_file_range and hashed
    back from the destination: the manifest describes the bytes written, so
    a copy that went wrong is caught by readers instead of being vouched for."""
    _no_direct(monkeypatch)
    src, files = _big_dir(tmp_path)
    calls = []
    real = os.copy_file_range

    def corrupting(src_fd: int, dst_fd: int, count: int, offset_src: int | None = None,
                   offset_dst: int | None = None) -> int:
        calls.append(count)
        n = real(src_fd, dst_fd, count, offset_src, offset_dst)
        if offset_dst == 0 and n and count > 10:  # big.bin lands with its first byte flipped
            first = os.pread(src_fd, 1, offset_src or 0)
            os.pwrite(dst_fd, bytes([first[0] ^ 0xFF]), 0)
        return n
    monkeypatch.setattr(os, "copy_file_range", corrupting)
    store, m = _commit(tmp_path, src)
    assert calls  # the kernel path was taken
    stored = (tmp_path / "store" / "m" / "1" / "big.bin").read_bytes()
    entry = m.entry("big.bin")
    assert entry is not None and entry.size == len(files["big.bin"])
    assert entry.sha256 == hashlib.sha256(stored).hexdigest()  # what landed...
    assert entry.sha256 != hashlib.sha256(files["big.bin"]).hexdigest()  # ...not the source
    assert verify_directory(store, "m/1", full=True).ok


def test_without_direct_io_or_kernel_copy_user_space_copies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_direct(monkeypatch)
    src, files = _big_dir(tmp_path)

    def refuse(*a: object, **kw: object) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")
    monkeypatch.setattr(os, "copy_file_range", refuse)
    store, m = _commit(tmp_path, src)
    _assert_stored(tmp_path, store, m, files)


# -- several files at once -----------------------------------------------------------

def test_files_are_copied_several_at_once_largest_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {f"shard-{i}.bin": os.urandom((i + 1) * MIB) for i in range(4)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    started: list[str] = []
    active = [0]
    peak = [0]
    lock = threading.Lock()
    real = DirectoryWriter.put_file

    def tracked(self: DirectoryWriter, relpath: str, local_path: str, **kw):
        with lock:
            started.append(relpath)
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)  # long enough that the other worker starts meanwhile
        try:
            return real(self, relpath, local_path, **kw)
        finally:
            with lock:
                active[0] -= 1
    monkeypatch.setattr(DirectoryWriter, "put_file", tracked)
    store = open_store(str(tmp_path / "store"))
    monkeypatch.setattr(type(store), "files_in_flight", 2)
    m = commit_local_directory(store, src, "m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    assert peak[0] == 2
    assert started[:2] == ["shard-3.bin", "shard-2.bin"]
    _assert_stored(tmp_path, store, m, files)


def test_a_failing_file_stops_the_others_and_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"shard-{i}.bin").write_bytes(os.urandom(MIB + i))
    real = DirectoryWriter.put_file
    copied = []

    def failing(self: DirectoryWriter, relpath: str, local_path: str, **kw):
        if relpath == "shard-4.bin":
            raise OSError(errno.EIO, "Input/output error", local_path)
        time.sleep(0.1)
        entry = real(self, relpath, local_path, **kw)
        copied.append(relpath)
        return entry
    monkeypatch.setattr(DirectoryWriter, "put_file", failing)
    store = open_store(str(tmp_path / "store"))
    monkeypatch.setattr(type(store), "files_in_flight", 2)
    with pytest.raises(OSError, match="Input/output error"):
        commit_local_directory(store, src, "m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    assert len(copied) < 5  # the files not yet started were never copied
    assert [p.name for p in (tmp_path / "store" / "m").iterdir()] == []


# -- S3: one budget of parts in flight per store --------------------------------------

def test_s3_parts_in_flight_are_bounded_across_writers(
        s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two files written at once (as a checkpoint's model and optimizer
    files are) share one budget of parts in flight, so memory does not grow
    with the writers."""
    from registry.store import s3upload as s3mod
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * MIB)  # S3's minimum part
    store = open_store(f"s3://{s3_bucket}/p")
    store.part_slots = threading.BoundedSemaphore(2)
    lock = threading.Lock()
    in_flight = [0, 0]  # now, peak
    parts: list[str] = []
    real_submit = store.submit

    def submit(method: str, **kw):
        fut = real_submit(method, **kw)
        if method == "upload_part":
            with lock:
                parts.append(kw["Key"].rsplit("/", 1)[-1])
                in_flight[0] += 1
                in_flight[1] = max(in_flight[1], in_flight[0])

            def done(_):
                with lock:
                    in_flight[0] -= 1
            fut.add_done_callback(done)
        return fut
    monkeypatch.setattr(store, "submit", submit)
    blobs = {"a.bin": os.urandom(21 * MIB), "b.bin": os.urandom(21 * MIB + 1)}

    def write(name: str) -> None:
        with store.open_write(f"m/{name}") as f:
            for i in range(0, len(blobs[name]), MIB):
                f.write(blobs[name][i:i + MIB])
    threads = [threading.Thread(target=write, args=(name,)) for name in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert parts.count("a.bin") == 5 and parts.count("b.bin") == 5
    assert in_flight[1] <= 2  # never more than the budget
    for name, data in blobs.items():
        assert store.read_bytes(f"m/{name}") == data


# -- streamed writes to a local store: direct I/O past the first buffer -----------------

@pytest.mark.parametrize("size", [local_mod.DIRECT_AFTER - 1, local_mod.DIRECT_AFTER,
                                  local_mod.DIRECT_AFTER + 1,
                                  local_mod.DIRECT_AFTER + 3 * local_mod.DIRECT_BUFFER,
                                  local_mod.DIRECT_AFTER + 2 * local_mod.DIRECT_BUFFER + 4095])
def test_streamed_writes_go_direct_past_the_first_buffer(
        tmp_path: Path, size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes of odd sizes: whole aligned buffers go to the disk with
    O_DIRECT at aligned offsets, the head and the tail through the page
    cache; the file holds exactly the bytes written."""
    writes = _spy_direct_writes(monkeypatch)
    blob = os.urandom(size)
    store = open_store(str(tmp_path / "store"))
    with store.open_write("d/w.bin") as f:
        for i in range(0, size, MIB + 3):
            f.write(blob[i:i + MIB + 3])
    assert (tmp_path / "store" / "d" / "w.bin").read_bytes() == blob
    whole = max(0, size - local_mod.DIRECT_AFTER) // local_mod.DIRECT_BUFFER
    assert writes == [(local_mod.DIRECT_AFTER + k * local_mod.DIRECT_BUFFER,
                       local_mod.DIRECT_BUFFER) for k in range(whole)]


def test_a_refused_direct_stream_goes_on_buffered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: _DurableFile, view: memoryview, offset: int) -> None:
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(_DurableFile, "pwrite_direct", refuse)
    blob = os.urandom(local_mod.DIRECT_AFTER + 2 * local_mod.DIRECT_BUFFER + 17)
    store = open_store(str(tmp_path / "store"))
    with store.open_write("d/w.bin") as f:
        for i in range(0, len(blob), 3 * MIB):
            f.write(blob[i:i + 3 * MIB])
    assert (tmp_path / "store" / "d" / "w.bin").read_bytes() == blob


@pytest.mark.parametrize("buffers", [2, 3])
def test_a_failing_direct_stream_leaves_no_file(
        tmp_path: Path, buffers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second buffer's write (on the helper thread) fails: its error is
    raised by the next write, or by the close when it was the last buffer."""
    real = _DurableFile.pwrite_direct

    def full(self: _DurableFile, view: memoryview, offset: int) -> None:
        if offset > local_mod.DIRECT_AFTER:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, view, offset)
    monkeypatch.setattr(_DurableFile, "pwrite_direct", full)
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(OSError, match="No space left"), store.open_write("d/w.bin") as f:
        f.write(os.urandom(local_mod.DIRECT_AFTER + buffers * local_mod.DIRECT_BUFFER))
    assert not (tmp_path / "store" / "d" / "w.bin").exists()


def test_a_checkpoint_saved_through_direct_writes_verifies(tmp_path: Path) -> None:
    """A DirectoryWriter file streamed past the first buffer (a checkpoint's
    weights) is committed with the sha256 of exactly its bytes."""
    store = open_store(str(tmp_path / "store"))
    blob = os.urandom(local_mod.DIRECT_AFTER + local_mod.DIRECT_BUFFER * 2 + 12345)
    with DirectoryWriter(store, "runs/r/step-1", kind="checkpoint",
                         meta={"run_id": "r", "step": 1}) as w:
        with w.open("model.safetensors") as f:
            f.write(blob[:100])
            f.write(blob[100:])  # one large write: hashed while written
        m = w.commit()
    assert m.entry("model.safetensors").sha256 == hashlib.sha256(blob).hexdigest()
    assert (tmp_path / "store/runs/r/step-1/model.safetensors").read_bytes() == blob
    assert verify_directory(store, "runs/r/step-1", full=True).ok


# -- what a commit refuses, before or after writing ------------------------------------

def test_a_fifo_or_a_dangling_symlink_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    """A FIFO would block the copy forever; a symlink to nowhere cannot be
    read. Both are named in one clear error and nothing is staged."""
    src, _ = _big_dir(tmp_path)
    os.mkfifo(src / "sub" / "pipe")
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(UsageError, match=r"pipe: not a regular file"):
        commit_local_directory(store, src, "m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    os.unlink(src / "sub" / "pipe")
    os.symlink(tmp_path / "nowhere", src / "dangling")
    with pytest.raises(ObjectNotFoundError, match=r"dangling: not found"):
        commit_local_directory(store, src, "m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*.bin"))


def test_a_staging_directory_emptied_by_another_process_is_not_committed(
        durable_store_url: str) -> None:
    """``registry gc --older-than 0s`` running beside a commit removes its
    staged files; the commit must fail, not commit a directory with a file
    missing (found by a break-test)."""
    from registry.store.base import join
    from registry.protocol.verify import is_committed
    store = open_store(durable_store_url)
    w = DirectoryWriter(store, "m/1", kind="release",
                        meta={"model_id": "m", "version": "1", "source": {"uri": "x"}})
    with w:
        w.write_bytes("model.safetensors", b"w" * 1000)
        w.write_bytes("config.json", b"{}")
        staged = w.staging if store.atomic_rename else w.prefix
        store.delete(join(staged, "model.safetensors"))  # what gc would do
        with pytest.raises(StorageError, match=r"missing: model\.safetensors"):
            w.commit()
    assert not is_committed(store, "m/1")
    assert store.walk_files("m") == {}


# -- the same refusals through the CLI: one line, an exit code, nothing committed -----

def _publish_args(tmp_path: Path, model: Path, store_url: str) -> list[str]:
    import json

    from tests.release_util import ledger_row, summary
    lpath, epath = tmp_path / "ledger.json", tmp_path / "summary.json"
    lpath.write_text(json.dumps([ledger_row("wiki")]))
    epath.write_text(json.dumps(summary(0.9, 0.5)))
    return ["publish", str(model), "--model-id", "m", "--version", "1", "--ledger", str(lpath),
            "--evals", str(epath), "--store", store_url]


def test_cli_publish_refuses_a_fifo_with_one_line(tmp_path: Path) -> None:
    from tests.conftest import run_cli
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    os.mkfifo(model / "pipe")
    r = run_cli(*_publish_args(tmp_path, model, str(tmp_path / "store")))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and "pipe: not a regular file" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "store" / "models" / "m" / "1").exists()


def test_cli_publish_onto_a_full_disk_is_one_line_exit_6(tmp_path: Path) -> None:
    """A real small filesystem (tmpfs of 12 MiB) fills up in the middle of a
    direct write: `error: <file>: no space left on device`, exit 6, and the
    space comes back."""
    import shutil

    from tests.conftest import run_cli
    from tests.support.tmpfs import small_tmpfs
    with small_tmpfs(tmp_path / "small", "12m") as small:
        model = tmp_path / "model"
        model.mkdir()
        (model / "config.json").write_text("{}")
        import numpy as np
        from safetensors.numpy import save_file
        save_file({"w": np.zeros((4, 4), np.float32)}, str(model / "model.safetensors"))
        (model / "tokenizer.bin").write_bytes(os.urandom(20 * MIB))
        r = run_cli(*_publish_args(tmp_path, model, str(small / "store")))
        assert r.returncode == 6, r.stderr
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "tokenizer.bin: no space left on device" in r.stderr
        assert not (small / "store" / "models" / "m" / "1").exists()
        assert shutil.disk_usage(small).used < MIB  # nothing staged is left


# -- helper threads after fork and at interpreter exit; close that fails ---------------

def _write_big(store_root: str, key: str, size: int = 40 * MIB) -> None:
    store = open_store(store_root)
    with store.open_write(key) as f:
        for _ in range(size // MIB):
            f.write(b"\x5a" * MIB)


def test_a_forked_child_writes_large_files_after_the_parent_did(tmp_path: Path) -> None:
    """The helper threads of the parent do not exist in a forked child: the
    child's pools must start anew instead of waiting on them forever (found
    by a break-test: the child hung at exactly 16 MiB)."""
    import multiprocessing
    root = str(tmp_path / "store")
    _write_big(root, "parent.bin")
    child = multiprocessing.get_context("fork").Process(target=_write_big,
                                                        args=(root, "child.bin"))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    assert (tmp_path / "store" / "child.bin").read_bytes() == b"\x5a" * (40 * MIB)


def test_an_async_checkpoint_still_saving_at_exit_is_committed(tmp_path: Path) -> None:
    """A script that ends without close() while an async save is in flight:
    the save is finished during interpreter shutdown, when no new helper
    thread may start (found by a break-test: it was silently lost)."""
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import numpy as np
        from registry.checkpoint import CheckpointManager
        from tests.ckpt_util import adamw, trainer_state
        params = {{f"w{{i}}": np.full((1024, 1024), i, np.float32) for i in range(10)}}
        m = CheckpointManager({str(tmp_path / "store")!r}, "r1", keep_ckpts=0, async_save=True)
        m.save(7, params, adamw(params), optimizer="adamw", config={{"d": 1}},
               trainer_state=trainer_state(7))
    """)
    r = python_run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    store = open_store(str(tmp_path / "store"))
    assert verify_directory(store, "runs/r1/ckpt/step-000007", full=True).ok


def test_a_close_that_fails_removes_the_file_and_a_second_close_does_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = _DurableFile.pwrite_direct

    def failing(self: _DurableFile, view: memoryview, offset: int) -> None:
        if offset >= local_mod.DIRECT_AFTER + 2 * local_mod.DIRECT_BUFFER:  # the last one
            raise OSError(errno.EIO, "Input/output error")
        real(self, view, offset)
    monkeypatch.setattr(_DurableFile, "pwrite_direct", failing)
    store = open_store(str(tmp_path / "store"))
    f = store.open_write("d/x.bin")
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(32):
        f.write(b"\1" * MIB)
    f.write(b"\2" * 100)
    with pytest.raises(OSError, match="Input/output error"):
        f.close()
    assert not (tmp_path / "store" / "d" / "x.bin").exists()
    assert len(os.listdir("/proc/self/fd")) <= fds  # both descriptors closed
    f.close()  # nothing left to do, and no file appears
    assert not (tmp_path / "store" / "d" / "x.bin").exists()


def test_an_empty_multidimensional_view_writes_nothing(tmp_path: Path) -> None:
    import numpy as np
    store = open_store(str(tmp_path / "store"))
    with store.open_write("d/e.bin") as f:
        assert f.write(memoryview(np.zeros((0, 5), np.float32))) == 0
    assert (tmp_path / "store" / "d" / "e.bin").read_bytes() == b""
