"""The commit protocol on memory, local disk and S3: all or nothing, never replace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from registry.protocol.commit import DirectoryWriter, commit_local_directory, delete_directory
from registry.errors import CommitConflictError, PointerError, PointerRegressionError
from registry.protocol.manifest import MANIFEST
from registry.protocol.pointer import move_pointer, read_pointer
from registry.store import Store
from registry.protocol.verify import is_committed, read_manifest, verify_directory

STEP = re.compile(r"step-\d{6,}")


def write_step(store: Store, prefix: str, payload: bytes = b"weights") -> str:
    with DirectoryWriter(store, prefix, kind="checkpoint",
                         meta={"run_id": "r1", "step": 1}) as w:
        w.write_bytes("model.safetensors", payload)
        w.write_json("config.json", {"d": 1})
        with w.open("sub/extra.bin") as f:
            f.write(b"x" * 1000)
        return w.commit().digest


def test_commit_makes_directory_visible_whole(store: Store) -> None:
    digest = write_step(store, "runs/r1/ckpt/step-000001")
    assert is_committed(store, "runs/r1/ckpt/step-000001")
    report = verify_directory(store, "runs/r1/ckpt/step-000001", full=True)
    assert report.ok and report.extras == ()
    m = read_manifest(store, "runs/r1/ckpt/step-000001")
    assert m.digest == digest
    assert [e.path for e in m.files] == ["config.json", "model.safetensors", "sub/extra.bin"]
    assert store.read_bytes("runs/r1/ckpt/step-000001/model.safetensors") == b"weights"
    # nothing but the directory itself is left: no staging dir, no claim
    assert store.list_dir("runs/r1/ckpt") == [("step-000001", True)]


def test_commit_over_committed_directory_fails_and_keeps_bytes(store: Store) -> None:
    write_step(store, "runs/r1/ckpt/step-000001", b"first")
    with pytest.raises(CommitConflictError):
        write_step(store, "runs/r1/ckpt/step-000001", b"second")
    assert store.read_bytes("runs/r1/ckpt/step-000001/model.safetensors") == b"first"
    assert verify_directory(store, "runs/r1/ckpt/step-000001", full=True).ok


def test_abort_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), DirectoryWriter(
            store, "runs/r1/ckpt/step-000002", kind="checkpoint",
            meta={"run_id": "r1", "step": 2}) as w:
        w.write_bytes("model.safetensors", b"partial")
        raise RuntimeError("trainer died")
    assert store.walk_files("runs/r1/ckpt") == {}
    assert not is_committed(store, "runs/r1/ckpt/step-000002")


def test_uncommitted_files_are_not_committed(store: Store) -> None:
    store.write_bytes("runs/r1/ckpt/step-000003/model.safetensors", b"orphan")
    report = verify_directory(store, "runs/r1/ckpt/step-000003")
    assert not report.ok and report.manifest is None and "not committed" in str(report.error)


def test_second_writer_is_refused_while_claimed(store: Store) -> None:
    first = DirectoryWriter(store, "models/m/1", kind="release",
                            meta={"model_id": "m", "version": "1", "source": {"uri": "x"}})
    first.write_bytes("a.bin", b"1")
    if not store.atomic_rename:
        with pytest.raises(CommitConflictError, match="claimed"):
            DirectoryWriter(store, "models/m/1", kind="release", meta={})
    first.commit()
    with pytest.raises(CommitConflictError, match="already committed"):
        DirectoryWriter(store, "models/m/1", kind="release", meta={})


def test_sole_writer_replaces_a_stale_claim_or_staging_dir(store: Store) -> None:
    if store.atomic_rename:
        store.write_bytes("runs/r1/ckpt/step-000004.tmp/junk", b"old")
        staging = "runs/r1/ckpt/step-000004.tmp"
    else:
        store.write_bytes("runs/r1/ckpt/step-000004.claim", b"{}")
        store.write_bytes("runs/r1/ckpt/step-000004/junk", b"old")
        staging = None
    with DirectoryWriter(store, "runs/r1/ckpt/step-000004", kind="checkpoint",
                         meta={"run_id": "r1", "step": 4}, staging=staging,
                         sole_writer=True) as w:
        w.write_bytes("model.safetensors", b"new")
        w.commit()
    report = verify_directory(store, "runs/r1/ckpt/step-000004", full=True)
    assert report.ok and report.extras == ()
    assert store.list_dir("runs/r1/ckpt") == [("step-000004", True)]


def test_commit_local_directory(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "hf"
    (src / "nested").mkdir(parents=True)
    (src / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
    (src / "nested" / "tokenizer.json").write_text("{}")
    m = commit_local_directory(store, src, "models/m/1", kind="release", model_id="m",
                               version="1", source={"uri": str(src)})
    assert {e.path for e in m.files} == {"model.safetensors", "nested/tokenizer.json"}
    assert store.read_bytes("models/m/1/model.safetensors") == bytes(range(256)) * 4096
    assert verify_directory(store, "models/m/1", full=True).ok


def test_delete_removes_manifest_first(store: Store) -> None:
    write_step(store, "runs/r1/ckpt/step-000001")
    calls: list[str] = []
    real_delete = store.delete

    def spy(key: str) -> None:
        calls.append(key)
        real_delete(key)

    store.delete = spy  # type: ignore[method-assign]
    delete_directory(store, "runs/r1/ckpt/step-000001")
    assert calls[0] == f"runs/r1/ckpt/step-000001/{MANIFEST}"
    assert store.walk_files("runs/r1/ckpt/step-000001") == {}


def test_pointer_moves_forward_only(store: Store) -> None:
    order = lambda v: int(v.split("-")[1])  # noqa: E731
    assert move_pointer(store, "runs/r1/ckpt/LATEST", "step-000002", order=order) is None
    assert store.read_bytes("runs/r1/ckpt/LATEST") == b"step-000002\n"
    with pytest.raises(PointerRegressionError):
        move_pointer(store, "runs/r1/ckpt/LATEST", "step-000001", order=order)
    assert move_pointer(store, "runs/r1/ckpt/LATEST", "step-000010", order=order) == "step-000002"
    assert read_pointer(store, "runs/r1/ckpt/LATEST", pattern=STEP) == "step-000010"


@pytest.mark.parametrize(("raw", "rule"), [
    (b"", "empty"),
    (b"\n", "empty"),
    (b"step-000001\nstep-000002\n", "garbled"),
    (b"\xff\xfe", "UTF-8"),
    (b"../../etc/step-000001\n", "outside its folder"),
    (b"step-000001/../x\n", "outside its folder"),
    (b"hello\n", "does not match"),
])
def test_bad_latest_is_refused_and_left_alone(store: Store, raw: bytes, rule: str) -> None:
    store.write_bytes("runs/r1/ckpt/LATEST", raw)
    with pytest.raises(PointerError) as e:
        read_pointer(store, "runs/r1/ckpt/LATEST", pattern=STEP)
    assert "LATEST" in str(e.value) and rule in str(e.value)
    assert store.read_bytes("runs/r1/ckpt/LATEST") == raw


def test_alias_compare_and_swap(store: Store) -> None:
    move_pointer(store, "models/m/refs/prod", "1", expected=None, check_expected=True)
    from registry.errors import PointerConflictError
    with pytest.raises(PointerConflictError):
        move_pointer(store, "models/m/refs/prod", "3", expected="2", check_expected=True)
    move_pointer(store, "models/m/refs/prod", "2", expected="1", check_expected=True)
    assert json.dumps(read_pointer(store, "models/m/refs/prod")) == '"2"'


