"""The store contract, run on memory, local disk and a real S3 server."""

from __future__ import annotations

import os

import pytest

from registry.errors import (
    InvalidStoreURLError,
    ObjectExistsError,
    ObjectNotFoundError,
    PointerConflictError,
    StorageError,
)
from registry.store import Store, open_store
from registry.store import s3upload as s3mod
from tests.support.forkclient import python_popen


def test_write_read_info_delete(store: Store) -> None:
    store.write_bytes("a/b/c.bin", b"hello")
    assert store.read_bytes("a/b/c.bin") == b"hello"
    assert store.info("a/b/c.bin").size == 5
    assert store.exists("a/b/c.bin")
    store.delete("a/b/c.bin")
    assert not store.exists("a/b/c.bin")
    store.delete("a/b/c.bin")  # deleting twice is fine


def test_missing_object_is_translated(store: Store) -> None:
    store.ensure_root()  # under a missing local root it is a StorageError instead
    with pytest.raises(ObjectNotFoundError) as e:
        store.read_bytes("nope/x")
    assert isinstance(e.value, FileNotFoundError)
    assert "nope/x" in str(e.value)
    with pytest.raises(ObjectNotFoundError):
        store.info("nope/x")


def test_conditional_create_is_exclusive(store: Store) -> None:
    store.create("m/MANIFEST.json", b"one")
    with pytest.raises(ObjectExistsError):
        store.create("m/MANIFEST.json", b"two")
    assert store.read_bytes("m/MANIFEST.json") == b"one"


def test_create_same_bytes_twice_is_a_conflict(store: Store) -> None:
    store.create("k", b"same")
    with pytest.raises(ObjectExistsError):
        store.create("k", b"same")


@pytest.mark.parametrize("op", ["create", "swap"])
def test_s3_retried_conditional_put_that_landed_is_success(s3_bucket: str, op: str) -> None:
    """The first PUT lands but its answer is lost (a 409 here); the retry gets a
    412 caused by our own write: read back, find our bytes, report success."""
    from botocore.exceptions import ClientError

    store = open_store(f"s3://{s3_bucket}/x")
    token = None
    if op == "swap":
        store.write_bytes("p", b"old")
        token = store.read_versioned("p")[1]
    from registry.store.s3probe import require_conditional_writes
    require_conditional_writes(store)  # the probe is not what this test breaks
    real_call = store.call
    state = {"first": True}

    def flaky(method: str, **kw):  # type: ignore[no-untyped-def]
        out = real_call(method, **kw)
        if method == "put_object" and state.pop("first", False):
            raise ClientError({"Error": {"Code": "ConditionalRequestConflict"}}, "PutObject")
        return out

    store.call = flaky  # type: ignore[method-assign]
    if op == "create":
        store.create("p", b"mine")
    else:
        store.swap("p", b"mine", token)
    assert store.read_bytes("p") == b"mine"
    with pytest.raises((ObjectExistsError, PointerConflictError)):
        store.create("p", b"mine") if op == "create" else store.swap("p", b"mine", token)


def test_swap_compare_and_swap(store: Store) -> None:
    store.swap("p/LATEST", b"step-000001\n", None)
    with pytest.raises(PointerConflictError):
        store.swap("p/LATEST", b"step-000002\n", None)
    data, token = store.read_versioned("p/LATEST")
    assert data == b"step-000001\n"
    store.swap("p/LATEST", b"step-000002\n", token)
    with pytest.raises(PointerConflictError):
        store.swap("p/LATEST", b"step-000003\n", token)  # stale token
    assert store.read_bytes("p/LATEST") == b"step-000002\n"


def test_a_swap_on_a_key_deleted_since_its_read_is_a_conflict(store: Store) -> None:
    """A writer holding a token for an object another writer deleted (a claim
    released by the winner while the loser was about to take it over) gets
    the contract's PointerConflictError on every backend, not a missing
    file: S3 answers such an If-Match with 404 NoSuchKey. Found by the race
    test once its children started fast enough to hit it."""
    store.swap("c/x.claim", b"winner\n", None)
    _, token = store.read_versioned("c/x.claim")
    store.delete("c/x.claim")
    with pytest.raises(PointerConflictError):
        store.swap("c/x.claim", b"loser\n", token)
    assert not store.exists("c/x.claim")


def test_listing(store: Store) -> None:
    for key in ["d/x.bin", "d/sub/y.bin", "d/sub/deeper/z.bin"]:
        store.write_bytes(key, b"12345")
    assert store.list_dir("d") == [("sub", True), ("x.bin", False)]
    assert store.walk_files("d") == {"sub/deeper/z.bin": 5, "sub/y.bin": 5, "x.bin": 5}
    assert store.list_dir("absent") == []
    assert store.walk_files("absent") == {}
    store.delete_prefix("d/sub")
    assert store.walk_files("d") == {"x.bin": 5}


def test_streaming_write_of_many_parts(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * 1024 * 1024)  # S3's minimum part
    blob = os.urandom(5 * 1024 * 1024 * 3 + 12345)
    with store.open_write("big/file.bin") as f:
        for i in range(0, len(blob), 1_000_003):
            f.write(blob[i:i + 1_000_003])
    assert store.info("big/file.bin").size == len(blob)
    assert store.read_bytes("big/file.bin") == blob
    assert store.read_range("big/file.bin", 100, 200) == blob[100:200]


def test_failed_streaming_write_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError), store.open_write("w/partial.bin") as f:
        f.write(b"x" * 100)
        raise RuntimeError("boom")
    if not store.url.startswith("memory://"):  # fsspec's memory file lands on close
        assert not store.exists("w/partial.bin")


def test_capabilities_follow_backend(store: Store) -> None:
    assert store.conditional_create and store.compare_and_swap
    assert store.atomic_rename == (store.local_path("x") is not None)


def test_rename_dir_refuses_existing(tmp_path: os.PathLike[str]) -> None:
    s = open_store(str(tmp_path))
    s.write_bytes("a.tmp/f", b"1")
    s.write_bytes("a/f", b"2")
    with pytest.raises(ObjectExistsError):
        s.rename_dir("a.tmp", "a")
    assert s.read_bytes("a/f") == b"2"
    s.write_bytes("b.tmp/f", b"3")
    s.rename_dir("b.tmp", "b")
    assert s.read_bytes("b/f") == b"3" and not s.exists("b.tmp/f")


def test_bad_urls() -> None:
    with pytest.raises(InvalidStoreURLError):
        open_store("gopher://x/y")
    with pytest.raises(InvalidStoreURLError):
        open_store("s3://")


def test_s3_missing_bucket_is_a_storage_error(s3_server: object) -> None:
    s = open_store("s3://no-such-bucket-here/x")
    with pytest.raises(StorageError):
        s.write_bytes("k", b"1")


@pytest.mark.parametrize("explicit", [None, True])
def test_s3_part_bodies_are_unsigned_but_crc32_checked(s3_bucket: str, explicit: bool | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part carries a CRC32 the server checks; its body is not
    SHA256-signed a second time (UNSIGNED-PAYLOAD), unless the user's own
    config_kwargs["s3"] asks for payload signing."""
    from fsspec.asyn import sync

    from registry.store.s3 import S3Store
    monkeypatch.setattr(s3mod, "PART_SIZE", 5 * 1024 * 1024)
    opts = {} if explicit is None else {"config_kwargs": {"s3": {
        "payload_signing_enabled": explicit}}}
    store = S3Store(f"s3://{s3_bucket}/p", f"{s3_bucket}/p", **opts)
    client = sync(store.fs.loop, store.fs.set_session)
    seen: list[dict[str, str]] = []
    client.meta.events.register("before-send.s3.UploadPart",
                                lambda request, **kw: seen.append(dict(request.headers)))
    blob = os.urandom(5 * 1024 * 1024 * 2 + 7)
    with store.open_write("big.bin") as f:
        f.write(blob)
    assert store.read_bytes("big.bin") == blob
    assert len(seen) == 3
    for headers in seen:
        assert "x-amz-checksum-crc32" in {k.lower() for k in headers}
        signed = {k.lower(): v for k, v in headers.items()}["x-amz-content-sha256"]
        signed = signed.decode() if isinstance(signed, bytes) else signed
        assert (signed == "UNSIGNED-PAYLOAD") == (explicit is None), signed


_KILLED_SWAP = """
import os, sys, time
import registry.store.local as local
from registry.store import open_store
real = os.replace
def stall(src, dst, **dir_fds):
    print("WRITTEN", flush=True)
    time.sleep(600)  # SIGKILLed here: the temp file is written, not renamed
local.os.replace = stall
store = open_store(sys.argv[1])
_, token = store.read_versioned("run/LATEST")
store.swap("run/LATEST", b"step-000002\\n", token)
"""


def test_a_swap_killed_before_its_rename_leaves_a_temp_the_next_swap_removes(
        tmp_path: Path) -> None:
    """Local disk: a pointer swap SIGKILLed between writing ``LATEST.tmp-<random>``
    and renaming it leaves the old pointer intact and that temp file; the next
    swap (under the same lock) removes it, so a resumed run ends with a clean
    tree (tests/test_trainer_kill.py saw this leftover once)."""
    import signal
    import subprocess
    import sys

    from registry.store import open_store
    from tests.conftest import REPO

    root = tmp_path / "store"
    store = open_store(str(root))
    store.swap("run/LATEST", b"step-000001\n", None)
    child = python_popen([sys.executable, "-c", _KILLED_SWAP, str(root)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "WRITTEN"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    left = [n for n in os.listdir(root / "run") if ".tmp-" in n]
    assert len(left) == 1 and left[0].startswith("LATEST.tmp-"), left
    assert store.read_bytes("run/LATEST") == b"step-000001\n"  # untouched
    # the dead swap's lock lapses with its process; the next swap cleans up
    _, token = store.read_versioned("run/LATEST")
    store.swap("run/LATEST", b"step-000003\n", token)
    assert store.read_bytes("run/LATEST") == b"step-000003\n"
    assert not [n for n in os.listdir(root / "run") if ".tmp-" in n]
