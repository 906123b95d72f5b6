"""A source directory is untrusted input (issue 29 items 2, 5 and 6).

* Links inside the source directory are read as the files they name: a
  Hugging Face cache snapshot (every file a link ``../../blobs/<digest>``,
  outside the snapshot folder but inside its repository's ``blobs/``), a
  relative link to a sibling, a linked sub-folder.
* Links leading out are refused naming the link and its target, nothing
  written: to a root-only secret (the attacker, ``nobody``, planted it in a
  folder it may write), a linked parent folder, a link chain that leaves, a
  link out of an HF snapshot's ``blobs/`` into the rest of the cache;
  ``--follow-symlinks`` reads them and says which.
* A FIFO that would block a reader is refused without blocking.
* A source rewritten in place while publish copies it (another process, real
  time): refused naming the file, nothing committed; on S3 an object
  replaced during the copy, and bytes altered on the way (the server's
  ``x-amz-checksum-sha256`` disagrees).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest

from registry.errors import SourceChangedError, UnsafeEntryError
from registry.release import ModelRelease
from registry.store import Store, open_store
from tests.conftest import run_cli
from tests.release_util import docs_args, ledger_row, summary
from tests.support.attacker import as_nobody, require_other_user, shared_dir, victim_files
from tests.test_pull import release_files
from tests.support.forkclient import python_popen

SECRET = b"root-only secret\n"


def _write(src: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)


def _publish_cli(tmp_path: Path, src: Path, store: str, *extra: str,
                 version: str = "1") -> subprocess.CompletedProcess[str]:
    return run_cli("publish", str(src), "--model-id", "tiny", "--version", version,
                   *docs_args(tmp_path), "--store", store, "--db",
                   f"sqlite:///{tmp_path / 'r.db'}", *extra)


def _hf_snapshot(root: Path) -> Path:
    """A Hugging Face cache repo: blobs/<sha256> and snapshots/<rev>/<name> ->
    ../../blobs/<sha256> (nested names: ../../../blobs)."""
    repo = root / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for rel, data in release_files().items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / digest, link.parent), link)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    return snap


def test_a_hugging_face_snapshot_publishes_through_its_blob_links(
        tmp_path: Path, durable_store_url: str) -> None:
    snap = _hf_snapshot(tmp_path)
    p = _publish_cli(tmp_path, snap, durable_store_url)
    assert p.returncode == 0, p.stderr
    assert "followed" not in p.stderr
    out = tmp_path / "out"
    p = run_cli("pull", "tiny@1", "--store", durable_store_url, "--to", str(out), "--quiet",
                "--cache", str(tmp_path / "cache"))
    assert p.returncode == 0, p.stderr
    plain = tmp_path / "plain"
    _write(plain, release_files())
    p = _publish_cli(tmp_path, plain, durable_store_url, version="2")
    assert p.returncode == 0, p.stderr
    store = open_store(durable_store_url)
    from registry.protocol.verify import read_manifest

    def digests(v: str) -> dict[str, str]:
        return {e.path: e.sha256 for e in read_manifest(store, f"models/tiny/{v}").files}
    assert digests("1") == digests("2")  # the same release as from the files themselves
    for rel, data in release_files().items():
        if rel != "model.safetensors":  # released with the registry's header metadata
            assert (out / rel).read_bytes() == data, rel


def test_links_inside_the_source_are_read_as_their_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = release_files()
    _write(src, {k: v for k, v in files.items() if k != "data/copy-of-a.bin"})
    os.symlink("a.bin", src / "data" / "copy-of-a.bin")  # a sibling
    os.symlink("data/nested", src / "alias")  # a linked sub-folder
    store = open_store(str(tmp_path / "store"))
    r = ModelRelease(store).publish(src, "tiny", "1", ledger=[ledger_row()],
                                    eval_summary=summary())
    names = {e.path: e for e in r.manifest.files}
    assert names["data/copy-of-a.bin"].sha256 == hashlib.sha256(files["data/a.bin"]).hexdigest()
    assert "alias/deep/c.txt" in names and r.followed == ()


@pytest.mark.parametrize("kind", ["file", "chain", "dir", "blobs-escape", "parent-of-source"])
def test_a_link_leading_out_is_refused_naming_link_and_target(kind: str,
                                                              tmp_path: Path) -> None:
    """The cloned-repo attack: ``tokenizer.model -> ~/.aws/credentials``, as
    planted by another user (nobody) in a source folder it may write, and the
    same secret reached by a chain, a linked folder, a link out of an HF
    snapshot's blobs/, a source folder that is itself under a linked parent."""
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        secret = home / "secret"
        (home / "aws").mkdir()
        (home / "aws" / "credentials").write_bytes(SECRET)
        os.chmod(home / "aws" / "credentials", 0o600)
        src = d / "clone"
        if kind == "blobs-escape":
            src = _hf_snapshot(d)
            blob = next((src.parent.parent / "blobs").iterdir())
            blob.unlink()
            os.symlink(secret, blob)  # the blob itself leads out of the repo
            link, target = src / "data" / "b.bin", str(secret)
        else:
            _write(src, release_files())
        os.chmod(d, 0o777)
        if kind != "blobs-escape":
            os.chown(src, 65534, 65534)
        if kind == "file":
            link, target = src / "tokenizer.model", str(home / "aws" / "credentials")
            as_nobody("ln", "-s", target, str(link))
        elif kind == "chain":
            as_nobody("ln", "-s", str(home / "aws" / "credentials"), str(d / "hop"))
            as_nobody("ln", "-s", "../hop", str(src / "chained"))  # via a hop outside
            link, target = src / "chained", str(home / "aws" / "credentials")
        elif kind == "dir":
            link, target = src / "linked-dir", str(home / "aws")
            as_nobody("ln", "-s", target, str(link))
        elif kind == "parent-of-source":
            # data/ is a link to a folder outside holding the same names
            outside = home / "outside-data"
            os.rename(src / "data", outside)
            (outside / "b.bin").write_bytes(SECRET)
            os.symlink(outside, src / "data")
            link, target = src / "data", str(outside)
        store = d / "store"
        p = _publish_cli(tmp_path, src, str(store))
        assert p.returncode == 6, (p.returncode, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
        assert f"{link}: a symbolic link to" in p.stderr and target in p.stderr, p.stderr
        assert "outside the source directory" in p.stderr, p.stderr
        assert not (store / "models" / "tiny" / "1").exists()
        for dirpath, _dirs, names in os.walk(store):
            for n in names:
                assert SECRET not in Path(dirpath, n).read_bytes(), (dirpath, n)
        # --follow-symlinks reads it and says what it followed
        p = _publish_cli(tmp_path, src, str(store), "--follow-symlinks", "--json")
        assert p.returncode == 0, p.stderr
        assert f"warning: followed {link} -> " in p.stderr, p.stderr
        followed = json.loads(p.stdout)["followed_symlinks"]
        assert any(f["link"] == str(link) for f in followed), followed


def test_a_fifo_in_the_source_is_refused_without_blocking(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, release_files())
    os.mkfifo(src / "data" / "pipe")  # a reader opening it would wait forever
    p = _publish_cli(tmp_path, src, str(tmp_path / "store"))
    assert p.returncode == 2 and "pipe: not a regular file" in p.stderr, p.stderr
    os.unlink(src / "data" / "pipe")
    os.mkfifo(tmp_path / "pipe-outside")
    os.symlink(tmp_path / "pipe-outside", src / "data" / "pipe")
    p = _publish_cli(tmp_path, src, str(tmp_path / "store"))
    assert p.returncode == 6 and "data/pipe: a symbolic link to" in p.stderr, p.stderr


# -- a source that changes while it is copied -------------------------------------------

REWRITER = r"""
import os, sys, time
path = sys.argv[1]
fd = os.open(path, os.O_WRONLY)
size = os.fstat(fd).st_size
print("ready", flush=True)
i = 0
while True:  # rewrite in place, a page at a time, until killed
    os.pwrite(fd, bytes([i % 251]) * 4096, (i * 4096 * 7919) % max(1, size - 4096))
    i += 1
    time.sleep(0.0005)
"""


def _rewriting(path: Path) -> subprocess.Popen[str]:
    p = python_popen([sys.executable, "-c", REWRITER, str(path)], stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def test_a_file_rewritten_during_publish_is_refused(tmp_path: Path, durable_store_url: str) -> None:
    """Another process rewrites model.safetensors' tensor bytes in place while
    publish copies it: exit 6 naming the file, nothing committed (local
    store and S3 alike; the source is local)."""
    src = tmp_path / "src"
    files = release_files()
    files["big.bin"] = os.urandom(64 * 1024 * 1024)
    _write(src, files)
    writer = _rewriting(src / "big.bin")
    try:
        p = _publish_cli(tmp_path, src, durable_store_url)
    finally:
        writer.kill()
        writer.wait()
        assert writer.stdout is not None
        writer.stdout.close()
    assert p.returncode == 6, (p.returncode, p.stderr)
    assert f"{src / 'big.bin'}: changed while it was copied" in p.stderr, p.stderr
    assert "nothing was committed" in p.stderr
    store = open_store(durable_store_url)
    assert not store.exists("models/tiny/1/MANIFEST.json")
    # once it holds still, the same directory publishes
    p = _publish_cli(tmp_path, src, durable_store_url)
    assert p.returncode == 0, p.stderr


def test_a_file_replaced_by_rename_during_the_copy_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _write(src, {**release_files(), "big.bin": os.urandom(64 * 1024 * 1024)})
    store = open_store(str(tmp_path / "store"))
    import registry.protocol.commit as commit_mod

    real = commit_mod.check_local

    def swap_then_check(path: str, before: object, fd: int, copied: int) -> None:
        if path.endswith("big.bin"):  # what a `cp new big.bin.tmp && mv` does meanwhile
            (src / "new.tmp").write_bytes(b"n" * 10)
            os.replace(src / "new.tmp", src / "big.bin")
        real(path, before, fd, copied)  # type: ignore[arg-type]

    commit_mod.check_local = swap_then_check  # type: ignore[assignment]
    try:
        with pytest.raises(SourceChangedError, match=r"big.bin: changed while it was copied "
                                                     r"\(.*replaced \(inode"):
            ModelRelease(store).publish(src, "tiny", "1", ledger=[ledger_row()],
                                        eval_summary=summary())
    finally:
        commit_mod.check_local = real
    assert not store.exists("models/tiny/1/MANIFEST.json")


def _s3_source(bucket: str, *, checksum: bool) -> str:
    s3 = boto3.client("s3")
    for rel, data in release_files().items():
        extra = {"ChecksumAlgorithm": "SHA256"} if checksum else {}
        s3.put_object(Bucket=bucket, Key=f"src/{rel}", Body=data, **extra)
    return f"s3://{bucket}/src"


def _refused_with_pump(store: Store, url: str, pump: Callable[[Any, Any], Any],
                       match: str) -> None:
    """A publish of ``url`` whose copy loop (``_pump``) is ``pump`` is refused
    with SourceChangedError matching ``match``, and commits nothing."""
    import registry.release.copying as mr  # the copy loop (_pump) of a release

    real_pump = mr._pump
    mr._pump = pump  # type: ignore[assignment]
    try:
        with pytest.raises(SourceChangedError, match=match):
            ModelRelease(store).publish(url, "tiny", "1", ledger=[ledger_row()],
                                        eval_summary=summary())
    finally:
        mr._pump = real_pump
    assert not store.exists("models/tiny/1/MANIFEST.json")


def test_an_s3_source_replaced_during_the_copy_is_refused(s3_bucket: str,
                                                          tmp_path: Path) -> None:
    url = _s3_source(s3_bucket, checksum=False)
    store = open_store(str(tmp_path / "store"))
    import registry.release.copying as mr  # the copy loop (_pump) of a release

    real_pump = mr._pump

    def pump_then_replace(f: object, out: object) -> None:
        real_pump(f, out)  # type: ignore[arg-type]
        if not getattr(pump_then_replace, "done", False):
            pump_then_replace.done = True  # type: ignore[attr-defined]
            for rel in release_files():  # whichever is being copied now changes
                boto3.client("s3").put_object(Bucket=s3_bucket, Key=f"src/{rel}",
                                              Body=b"new bytes")
    _refused_with_pump(store, url, pump_then_replace, "changed while it was copied .etag")


def test_s3_bytes_altered_on_the_way_disagree_with_the_servers_checksum(
        s3_bucket: str, tmp_path: Path) -> None:
    """The server keeps each object's SHA-256 (uploaded with one); a reader
    whose bytes were altered in transit (a flipped byte, simulated in the
    read path) is refused: the copy's sha256 is not the server's."""
    url = _s3_source(s3_bucket, checksum=True)
    store = open_store(str(tmp_path / "store"))
    import registry.release.copying as mr  # the copy loop (_pump) of a release

    real_pump = mr._pump
    lock = threading.Lock()

    class Flip:
        def __init__(self, f: object) -> None:
            self.f, self.first = f, True

        def read(self, n: int = -1) -> bytes:
            data = self.f.read(n)  # type: ignore[attr-defined]
            with lock:
                if data and self.first:
                    self.first = False
                    return bytes([data[0] ^ 1]) + data[1:]
            return data

        def readinto(self, b: memoryview) -> int:
            data = self.read(len(b))
            b[:len(data)] = data
            return len(data)

    _refused_with_pump(store, url, lambda f, out: real_pump(Flip(f), out),
                       "not the object the server holds")
    r = ModelRelease(store).publish(url, "tiny", "1", ledger=[ledger_row()],
                                    eval_summary=summary())
    assert r.manifest.files


def test_unsafe_entry_error_is_exported() -> None:
    assert issubclass(SourceChangedError, Exception) and issubclass(UnsafeEntryError, OSError)
