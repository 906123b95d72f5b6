"""Issue 13 item 4: every store, and a Registry, keep working in a ``fork()``ed
child after the parent used them (gunicorn ``--preload``, multiprocessing).
s3fs refuses to cross a fork ("This class is not fork-safe"); the child must
get fresh clients."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

from registry.refs.alias_history import read_head
from registry.api import Registry
from registry.protocol.commit import DirectoryWriter
from registry.store import Store
from registry.protocol.verify import verify_directory
from tests.test_release import checkpoint, release

FORK = multiprocessing.get_context("fork")


def _child_work(store: Store, name: str, errors: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        assert store.read_bytes("parent/x") == b"from the parent"
        assert store.list_dir("parent") == [("x", False)]
        with DirectoryWriter(store, f"child/{name}", kind="checkpoint",
                             meta={"run_id": "c", "step": int(name)}) as w:
            w.write_bytes("a.bin", name.encode() * 1000)
            with w.open("big.bin") as f:  # a multipart upload on S3
                for _ in range(3):
                    f.write(b"z" * (4 * 1024 * 1024))
            w.commit()
        assert verify_directory(store, f"child/{name}", full=True).ok
    except BaseException:  # noqa: BLE001 - reported to the parent
        errors.put(traceback.format_exc())


def test_store_works_after_fork(store: Store) -> None:
    store.write_bytes("parent/x", b"from the parent")
    assert store.list_dir("parent") == [("x", False)]  # the parent's clients are live
    errors = FORK.Queue()
    children = [FORK.Process(target=_child_work, args=(store, str(i), errors))
                for i in range(2)]
    for c in children:
        c.start()
    for c in children:
        c.join(120)
    assert [c.exitcode for c in children] == [0, 0]
    assert errors.empty(), errors.get()
    if not store.url.startswith("memory://"):  # a forked child's memory is its own
        for i in range(2):
            assert verify_directory(store, f"child/{i}", full=True).ok
    store.write_bytes("parent/y", b"still works")  # and the parent's too
    assert store.read_bytes("parent/y") == b"still works"


def _registry_child(reg: Registry, errors: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    try:
        assert [r["version"] for r in reg.ls("tiny")] == ["1"]
        assert reg.resolve("tiny@1") == ("tiny", "1")
        reg.set_alias("tiny", "prod", "1")
    except BaseException:  # noqa: BLE001
        errors.put(traceback.format_exc())


def test_registry_works_after_fork(durable_store_url: str, tmp_path: Path) -> None:
    reg = Registry(durable_store_url, f"sqlite:///{tmp_path / 'i.db'}")
    checkpoint(reg.store)
    release(reg.store, "1")
    reg.rebuild_index()
    assert [r["version"] for r in reg.ls("tiny")] == ["1"]
    errors = FORK.Queue()
    child = FORK.Process(target=_registry_child, args=(reg, errors))
    child.start()
    child.join(120)
    assert child.exitcode == 0 and errors.empty(), errors.get()
    assert read_head(reg.store, "tiny", "prod").version == "1"
    reg.close()
