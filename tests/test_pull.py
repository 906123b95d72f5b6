"""Pull (DESIGN section 7) on memory, local disk and a real S3 server.

What is checked, and how:

* Pull by version and by alias (Python API and ``registry pull``), into ``--to``
  and into the cache's default ``models/<model_id>/<version>``: the directory
  holds exactly the release's files plus MANIFEST.json, byte-equal to the
  store's, each its own inode (never a hardlink of ``blobs/sha256/<hex>``), and
  ``registry verify DIR --full`` passes. Uncommitted releases, invalid manifests
  and manifests with escaping paths are refused with one clear error line and
  nothing is placed.
* Dedupe: a second version sharing all but one file downloads only that file;
  reads are counted with wrappers around the store's read methods (and, on
  S3, around every S3 API call, so requests and bytes on the wire are counted).
* Integrity: a stored file with a flipped byte, truncated, replaced by a Git
  LFS pointer or by an HTML error page is refused with IntegrityError naming
  the file and the expected and actual values; nothing under the final name,
  no blob for it, no temp file. Large files take the ranged path (split at
  once: ``RANGE_THRESHOLD`` 1 MiB, ranges of 256 KiB at least); whether a
  stream is split is decided from its measured rate and time to first byte
  (a slowed stream is split, a fast one is not).
  A blob changed after it was verified (flipped, truncated, replaced) is
  caught when placed (the copy hashes it; a reflink compares its stat stamp)
  and downloaded again; a pulled file edited in place (even with its mtime put
  back) changes neither the cache nor another pull, and a re-pull notices it.
  ``--verify`` re-hashes a target even when its stamps are unchanged.
* Atomicity: 4 real processes pull one release into one cache and one target
  at once, 10 times; a pull SIGKILLed while downloading or while placing the
  staging directory leaves nothing under the final name and no wrong blob, and
  the next pull removes its leftovers and completes (tests/support/pull_child.py).
* Bad input: foreign content in the target (refused unless ``--force``); disk
  space checked before the first byte; ENOSPC while writing becomes a clean
  InsufficientSpaceError.
* Output: ``--json`` is JSON; without a TTY no progress bar, a summary line with
  files, bytes, seconds and MB/s; ``--quiet`` prints only the path.

"""

from __future__ import annotations

import collections
import errno
import hashlib
import importlib
import io
import json
import os
import threading
import random
import re
import selectors
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import registry.pull as pull_module
from registry.refs.aliases import set_alias
from registry.errors import (
    CommitConflictError,
    InsufficientSpaceError,
    IntegrityError,
    ManifestError,
    NotCommittedError,
    ObjectNotFoundError,
    StorageError,
    UnsafePathError,
    UsageError,
)
from registry.protocol.manifest import MANIFEST, Manifest, parse_manifest
from registry.pull import FREE_MARGIN, PullResult, pull
from registry.release import ModelRelease, release_prefix
from registry.formats.safetensors_io import write_safetensors
from registry.store import Store, join, open_store
from registry.store.s3 import S3Store
from registry.protocol.verify import verify_directory
from tests.conftest import run_cli, run_cli_batch
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_popen, python_popens, python_run

MODEL = "tiny"
KIB = 1024
MIB = 1024 * KIB
#: a file over the (monkeypatched) RANGE_THRESHOLD: 6 ranges of 256 KiB, the last short.
BIG = MIB + 300 * KIB + 123
#: the modules (``registry.pull.materialize`` is also the name of a function there).
download = importlib.import_module("registry.pull.download")
s3fetch = importlib.import_module("registry.pull.s3fetch")
materialize = importlib.import_module("registry.pull.materialize")
cache_mod = importlib.import_module("registry.pull.cache")
CHILD = Path(__file__).resolve().parent / "support" / "pull_child.py"
RACERS = 4
REPETITIONS = 10
#: what rich draws for a progress bar.
BAR_CHARS = re.compile("[━╸╺█▏▎▍▌▋▊▉]|\x1b\\[")


# -- releases -------------------------------------------------------------------


def _safetensors() -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(3)
    write_safetensors(buf, {"embed.weight": rng.standard_normal((16, 8), dtype=np.float32),
                            "norm.bias": np.zeros(8, dtype=np.float32)},
                      metadata={"format": "tinyllm"}, path="model.safetensors")
    return buf.getvalue()


def release_files(*, big: bool = False) -> dict[str, bytes]:
    """A small model directory; ``data/copy-of-a.bin`` has ``data/a.bin``'s bytes."""
    rng = random.Random(1)
    a = rng.randbytes(4 * KIB)
    files = {"model.safetensors": _safetensors(),
             "config.json": b'{"hidden_size": 8}\n',
             "MODEL_CARD.md": b"# tiny\n\nA model for pull tests.\n",
             "data/a.bin": a, "data/copy-of-a.bin": a,
             "data/b.bin": rng.randbytes(2500),
             "data/nested/deep/c.txt": b"c" * 700}
    if big:
        files["big.bin"] = rng.randbytes(BIG)
    return files


def publish(store: Store, root: Path, version: str, files: dict[str, bytes]) -> Manifest:
    """Publish ``files`` as release ``tiny@version`` (through ModelRelease.publish)."""
    src = root / f"src-{version}"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return ModelRelease(store).publish(src, MODEL, version, ledger=[ledger_row()],
                                       eval_summary=summary()).manifest


def stored(store: Store, version: str) -> dict[str, bytes]:
    """Every file of the release in the store, MANIFEST.json included."""
    prefix = release_prefix(MODEL, version)
    data = store.read_bytes(join(prefix, MANIFEST))
    m = parse_manifest(data, source=prefix)
    out = {e.path: store.read_bytes(join(prefix, e.path)) for e in m.files}
    out[MANIFEST] = data
    return out


def distinct(m: Manifest) -> dict[str, int]:
    return {e.sha256: e.size for e in m.files}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- what a pull leaves on disk --------------------------------------------------------


def on_disk(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_pulled(target: Path, store: Store, version: str, cache: Path | None = None, *,
                  linked: bool | None = False) -> None:
    """``target`` holds exactly the release's bytes (+ MANIFEST.json) and verifies
    fully; each file is its own inode, never a hardlink of its cache blob
    (``linked=False``), or either (None)."""
    expected = stored(store, version)
    got = on_disk(target)
    assert sorted(got) == sorted(expected)
    for rel, data in expected.items():
        assert got[rel] == data, rel
    m = parse_manifest(expected[MANIFEST], source=version)
    if cache is not None and linked is not None:
        for e in m.files:
            st = (target / e.path).stat()
            blob = (cache / "blobs" / "sha256" / e.sha256).stat()
            if linked:
                assert (st.st_ino, st.st_dev) == (blob.st_ino, blob.st_dev), e.path
                assert st.st_nlink >= 2
            else:
                assert st.st_ino != blob.st_ino and st.st_nlink == 1, e.path
    report = verify_directory(open_store(str(target)), "", full=True)
    assert report.ok, report.to_dict()


def blobs(cache: Path) -> dict[str, bytes]:
    d = cache / "blobs" / "sha256"
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.is_dir() else {}


def assert_clean(cache: Path, target: Path) -> None:
    """No temp file, no staging directory, every blob holds what its name says."""
    tmp = cache / "tmp"
    assert not tmp.exists() or sorted(os.listdir(tmp)) == []
    if target.parent.is_dir():
        assert [p for p in os.listdir(target.parent) if p.startswith(f".{target.name}.")] == []
    for name, data in blobs(cache).items():
        assert sha256(data) == name


def assert_cli_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Exit ``code`` with one error: an ``error:`` line, or with ``--json`` one
    JSON error document on stderr (the CLI contract); ``needles`` in it."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = p.stderr.strip().splitlines()
    if "--json" in p.args:
        doc = json.loads(p.stderr)
        assert doc["error"]["exit_code"] == code, doc
        lines = [doc["error"]["message"]]
    assert len(lines) == 1 and (lines[0].startswith("error: ") or "--json" in p.args), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


# -- counting reads ---------------------------------------------------------------


class ReadLog:
    """Wraps the read methods of one store instance; on S3 also every S3 API call.

    ``reads``: (method, key, bytes) per call of iter_read / iter_range /
    read_range / read_bytes;
    ``requests``: (S3 operation, key, Range, ContentLength) per S3 API request.
    """

    def __init__(self, store: Store) -> None:
        self.reads: list[tuple[str, str, int]] = []
        self.requests: list[tuple[str, str | None, str | None, int | None]] = []
        iter_read, read_range, read_bytes = store.iter_read, store.read_range, store.read_bytes
        iter_range = store.iter_range

        def counted_stream(name: str, stream: Any) -> Any:
            def counted(key: str, *a: Any, **kw: Any) -> Iterator[bytes]:
                n = 0
                try:
                    for block in stream(key, *a, **kw):
                        n += len(block)
                        yield block
                finally:
                    self.reads.append((name, key, n))
            return counted

        counted_iter = counted_stream("iter_read", iter_read)
        counted_iter_range = counted_stream("iter_range", iter_range)

        def counted_range(key: str, start: int, end: int) -> bytes:
            data = read_range(key, start, end)
            self.reads.append(("read_range", key, len(data)))
            return data

        def counted_bytes(key: str, **kw: Any) -> bytes:
            data = read_bytes(key, **kw)
            self.reads.append(("read_bytes", key, len(data)))
            return data

        store.iter_read = counted_iter  # type: ignore[method-assign]
        store.read_range = counted_range  # type: ignore[method-assign]
        store.iter_range = counted_iter_range  # type: ignore[method-assign]
        store.read_bytes = counted_bytes  # type: ignore[method-assign]
        if isinstance(store, S3Store):
            call = store.fs._call_s3

            async def counted_call(method: str, *a: Any, **kw: Any) -> Any:
                resp = await call(method, *a, **kw)
                length = resp.get("ContentLength") if isinstance(resp, dict) else None
                self.requests.append((method, kw.get("Key"), kw.get("Range"), length))
                return resp

            store.fs._call_s3 = counted_call  # type: ignore[method-assign]
            direct = s3fetch.reader_for(store)  # the pull's ranged GETs (s3fetch)
            if direct is not None:
                read_into = direct.read_into

                def counted_into(key: str, start: int, segments: list[Any]) -> Iterator[Any]:
                    n = 0
                    try:
                        for view in read_into(key, start, segments):
                            n += len(view)
                            yield view
                    finally:
                        self.reads.append(("read_into", key, n))
                        self.requests.append(("get_object", store._key(key),
                                              f"bytes={start}-{segments[-1][1] - 1}", n))

                direct.read_into = counted_into  # type: ignore[method-assign]

    def clear(self) -> None:
        self.reads.clear()
        self.requests.clear()

    def data_bytes(self, version: str) -> dict[str, int]:
        """Bytes read per data file (not MANIFEST.json) of ``version``, by method calls."""
        prefix = release_prefix(MODEL, version) + "/"
        out: dict[str, int] = collections.Counter()
        for _, key, n in self.reads:
            if key.startswith(prefix) and not key.endswith(MANIFEST):
                out[key[len(prefix):]] += n
        return dict(out)

    def data_gets(self, version: str) -> dict[str, list[int]]:
        """S3 GET requests per data file of ``version``: their ContentLengths."""
        marker = "/" + release_prefix(MODEL, version) + "/"
        out: dict[str, list[int]] = collections.defaultdict(list)
        for method, key, _, length in self.requests:
            if method == "get_object" and key and marker in "/" + key \
                    and not key.endswith(MANIFEST):
                out[("/" + key).split(marker, 1)[1]].append(int(length or 0))
        return dict(out)


# -- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def durable(durable_store_url: str) -> Iterator[Store]:
    s = open_store(durable_store_url)
    yield s
    s.close()


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files over 1 MiB are split at once (after their first 1 KiB block) into
    ranges of at least 256 KiB; streams in 1 KiB blocks. Local stores stream
    too (their BLAKE3 copy path, registry.protocol.fastdigest, is tested elsewhere)."""
    monkeypatch.setenv("REGISTRY_PULL_DIGEST", "sha256")
    monkeypatch.setattr(download, "RANGE_THRESHOLD", MIB)
    monkeypatch.setattr(download, "MIN_SEGMENT", 256 * KIB)
    monkeypatch.setattr(download, "STREAM_CHUNK", KIB)
    monkeypatch.setattr(download, "PROBE_SECONDS", 0.0)
    monkeypatch.setattr(download, "MIN_SPLIT_SECONDS", 0.0)
    monkeypatch.setattr(download, "SPLIT_FACTOR", 0.0)


# == 1. pull by version and alias =====================================================


def test_pull_by_version_and_alias(store: Store, tmp_path: Path) -> None:
    m = publish(store, tmp_path, "1", release_files())
    set_alias(store, MODEL, "prod", "1")
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    chunks: list[int] = []
    starts: list[int] = []
    r = pull(store, MODEL, "1", to=serve, cache=cache, workers=4, progress=chunks.append,
             on_start=starts.append)
    need = distinct(m)
    assert isinstance(r, PullResult)
    assert (r.model_id, r.version, r.manifest_sha256, r.path) == (
        MODEL, "1", m.digest, str(serve.resolve()))
    assert (r.files, r.downloaded, r.bytes, r.transferred) == (
        len(m.files), len(need), m.total_size, sum(need.values()))
    assert len(need) == len(m.files) - 1  # a.bin and copy-of-a.bin: one download
    assert r.placed and not r.rehashed and r.seconds > 0
    assert starts == [r.transferred] and sum(chunks) == r.transferred
    assert_pulled(serve, store, "1", cache)
    assert sorted(blobs(cache)) == sorted(need)

    # By alias, into the cache's default location: all cache hits, linked to the same blobs.
    r2 = pull(store, MODEL, "prod", cache=cache, verify=True)
    default = cache.resolve() / "models" / MODEL / "1"
    assert (r2.version, r2.path, r2.downloaded, r2.transferred, r2.placed, r2.rehashed) == (
        "1", str(default), 0, 0, True, True)
    assert_pulled(default, store, "1", cache)
    # Again: the target already holds this release, a no-op.
    r3 = pull(store, MODEL, "prod", cache=cache)
    assert (r3.placed, r3.downloaded, r3.path) == (False, 0, str(default))
    assert_clean(cache, serve)
    assert_clean(cache, default)


def test_cli_pull_by_version_and_alias(durable_store_url: str, durable: Store,
                                       tmp_path: Path) -> None:
    m = publish(durable, tmp_path, "1", release_files())
    set_alias(durable, MODEL, "prod", "1")
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    need = distinct(m)

    # By version into --to. No TTY: no progress bar, one summary line on stdout.
    p = run_cli("pull", f"{MODEL}@1", "--to", str(serve), "--cache", str(cache),
                "--workers", "3", "--store", durable_store_url)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "" and not BAR_CHARS.search(p.stdout)
    assert len(p.stdout.splitlines()) == 1
    match = re.fullmatch(
        rf"pulled {MODEL}@1 to {re.escape(str(serve.resolve()))}: (\d+) files "
        r"\((\d+) downloaded\), (\d+) bytes \((\d+) transferred\), (\d+\.\d\d) s, "
        r"(\d+\.\d) MB/s; records: trust on first use \(no signed snapshot checked\)",
        p.stdout.strip())
    assert match, p.stdout
    assert [int(match[i]) for i in range(1, 5)] == [
        len(m.files), len(need), m.total_size, sum(need.values())]
    assert_pulled(serve, durable, "1", cache)

    # By alias into the default location ($REGISTRY_CACHE); --quiet: only the path.
    default = cache.resolve() / "models" / MODEL / "1"
    p = run_cli("pull", f"{MODEL}@prod", "--quiet", "--store", durable_store_url,
                env={"REGISTRY_CACHE": str(cache)})
    assert p.returncode == 0, p.stderr
    assert (p.stdout, p.stderr) == (f"{default}\n", "")
    assert_pulled(default, durable, "1", cache)

    # --json: one JSON document, nothing on stderr (here a no-op, re-hashed).
    p = run_cli("pull", f"{MODEL}@prod", "--cache", str(cache), "--json", "--verify",
                "--store", durable_store_url)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    doc = json.loads(p.stdout)
    assert doc == {**doc, "model_id": MODEL, "version": "1", "manifest_sha256": m.digest,
                   "path": str(default), "files": len(m.files), "downloaded": 0,
                   "bytes": m.total_size, "transferred": 0, "placed": False,
                   "rehashed": True}
    assert "verified" not in doc  # every pull checks every byte: --verify re-hashes
    assert isinstance(doc["seconds"], float)

    for d in (serve, default):
        p = run_cli("verify", str(d), "--full")
        assert p.returncode == 0 and p.stdout.startswith("OK "), p.stdout + p.stderr
    assert_clean(cache, serve)
    assert_clean(cache, default)


def _read_pty(fd: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> bytes:
    """Everything written to the pty whose master is ``fd`` until ``proc`` exits."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = selectors.DefaultSelector()
        ready.register(fd, selectors.EVENT_READ)
        events = ready.select(0.2)
        ready.close()
        if events:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child side is closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def test_progress_bar_goes_to_stderr_when_it_is_a_tty(tmp_path: Path) -> None:
    pty = pytest.importorskip("pty")
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files(big=True))
    master, slave = pty.openpty()
    try:
        proc = python_popen([sys.executable, "-m", "registry", "pull", f"{MODEL}@1", "--to",
             str(tmp_path / "serve"), "--cache", str(tmp_path / "cache"), "--store",
             str(tmp_path / "store")], stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        err = _read_pty(master, proc)
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert out.decode().startswith(f"pulled {MODEL}@1 to ") and len(out.splitlines()) == 1
    assert BAR_CHARS.search(err.decode(errors="replace"))


def _escaping_manifest(path: str) -> bytes:
    doc = {"format": "tinyllm-manifest", "format_version": 1, "kind": "release",
           "created_at": "2026-11-29T10:00:00Z", "model_id": MODEL, "version": "2",
           "source": {"uri": "/nowhere"},
           "files": [{"path": path, "size": 3, "sha256": sha256(b"pwn")}]}
    return json.dumps(doc).encode()


REFUSED = {
    # case: (API error, CLI exit code, message fragment)
    "uncommitted": (NotCommittedError, 3, "version '2' of model 'tiny' is incomplete"),
    "not-json": (ManifestError, 5, "MANIFEST.json"),
    "schema": (ManifestError, 5, "MANIFEST.json"),
    "escape": (UnsafePathError, 5, "'..' segment"),
    "escape-nested": (UnsafePathError, 5, "'..' segment"),
    "absolute": (UnsafePathError, 5, "is absolute"),
}
#: the cases also run through the CLI (each costs a process).
CLI_CASES = {"uncommitted", "not-json", "escape"}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_uncommitted_or_invalid_release_is_refused(durable_store_url: str, durable: Store,
                                                   tmp_path: Path, case: str) -> None:
    publish(durable, tmp_path, "1", release_files())
    prefix = release_prefix(MODEL, "2")
    durable.write_bytes(join(prefix, "config.json"), b"{}")  # files, but maybe no manifest
    durable.write_bytes(join("models", MODEL, "x"), b"pwn")  # what ../x would name
    manifest = {"uncommitted": None, "not-json": b"<html>502 Bad Gateway</html>",
                "schema": json.dumps({"format": "tinyllm-manifest", "files": "all"}).encode(),
                "escape": _escaping_manifest("../x"),
                "escape-nested": _escaping_manifest("a/../../x"),
                "absolute": _escaping_manifest(str(tmp_path / "x"))}[case]
    if manifest is not None:
        durable.write_bytes(join(prefix, MANIFEST), manifest)
    error, code, fragment = REFUSED[case]
    cache, serve = tmp_path / "cache", tmp_path / "out" / "serve"

    with pytest.raises(error) as e:
        pull(durable, MODEL, "2", to=serve, cache=cache)
    assert fragment in str(e.value)
    if case in CLI_CASES:
        p = run_cli("pull", f"{MODEL}@2", "--to", str(serve), "--cache", str(cache),
                    "--store", durable_store_url)
        assert_cli_error(p, code, fragment)
        assert p.stdout == ""
    # Nothing placed, nothing written anywhere: not the target, not x next to it, no blob.
    assert not serve.exists() and not (tmp_path / "out").exists()
    assert not (tmp_path / "x").exists() and blobs(cache) == {}


# == 2. dedupe =============================================================================


def test_second_version_downloads_only_the_changed_file(store: Store, tmp_path: Path) -> None:
    v1 = release_files()
    v2 = dict(v1, **{"data/b.bin": random.Random(2).randbytes(3000)})
    m1 = publish(store, tmp_path, "1", v1)
    m2 = publish(store, tmp_path, "2", v2)
    changed = m2.entry("data/b.bin")
    assert changed is not None
    assert {e.path for e in m2.files if m1.entry(e.path) != e} == {"data/b.bin"}
    cache = tmp_path / "cache"
    log = ReadLog(store)

    r1 = pull(store, MODEL, "1", cache=cache, workers=4)
    assert r1.downloaded == len(distinct(m1))
    log.clear()
    r2 = pull(store, MODEL, "2", cache=cache, workers=4)
    assert (r2.files, r2.downloaded, r2.transferred, r2.bytes) == (
        len(m2.files), 1, changed.size, m2.total_size)
    # The store was read for that one file only, exactly its bytes.
    assert log.data_bytes("2") == {"data/b.bin": changed.size}
    assert log.data_bytes("1") == {}
    if isinstance(store, S3Store):
        gets = log.data_gets("2")
        assert list(gets) == ["data/b.bin"] and sum(gets["data/b.bin"]) == changed.size
        assert len(gets["data/b.bin"]) == 1  # one GET for a small file
        touched = {k for _, k, _, _ in log.requests if k and "/models/tiny/2/" in "/" + k}
        assert touched <= {f"root/models/tiny/2/{p}" for p in ("data/b.bin", MANIFEST)}

    d1, d2 = Path(r1.path), Path(r2.path)
    assert_pulled(d1, store, "1", cache)
    assert_pulled(d2, store, "2", cache)
    for e in m2.files:  # shared files: one blob, but never one inode in two directories
        if e.path != "data/b.bin":
            assert (d1 / e.path).stat().st_ino != (d2 / e.path).stat().st_ino
    assert sorted(blobs(cache)) == sorted(distinct(m1) | distinct(m2))
    assert_clean(cache, d2)


# == 3. integrity =======================================================================


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256(data)}\n"
            f"size {len(data)}\n").encode()


def tampered(data: bytes, kind: str) -> bytes:
    if kind == "flip":
        mid = len(data) // 2 + 1
        return data[:mid] + bytes([data[mid] ^ 0x01]) + data[mid + 1:]
    if kind == "truncate":
        return data[: len(data) // 2]
    if kind == "lfs":
        return lfs_pointer(data)
    if kind == "html":
        return b"<html>502 Bad Gateway</html>"
    raise AssertionError(kind)


def assert_integrity_error(err: IntegrityError, path: str, m: Manifest, bad: bytes) -> None:
    entry = m.entry(path)
    assert entry is not None
    assert err.path == path and str(err).startswith(f"{path}: ")
    assert err.expected_size == entry.size
    if len(bad) == entry.size:
        assert (err.expected_sha256, err.actual_sha256) == (entry.sha256, sha256(bad))
        assert entry.sha256 in str(err) and sha256(bad) in str(err)
    else:
        assert err.actual_size is not None and err.actual_size != entry.size
        if len(bad) < entry.size:
            assert err.actual_size == len(bad)
        assert str(err.expected_size) in str(err) and str(err.actual_size) in str(err)


def assert_nothing_placed(cache: Path, target: Path, entry_sha: str, bad: bytes) -> None:
    assert not target.exists()
    assert entry_sha not in blobs(cache) and sha256(bad) not in blobs(cache)
    assert_clean(cache, target)


@pytest.mark.parametrize("kind", ["flip", "truncate", "lfs", "html"])
def test_tampered_file_is_refused(store: Store, tmp_path: Path, small_ranges: None,
                                  kind: str) -> None:
    m = publish(store, tmp_path, "1", release_files())
    key = join(release_prefix(MODEL, "1"), "data/b.bin")
    good = store.read_bytes(key)
    bad = tampered(good, kind)
    store.write_bytes(key, bad)
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    with pytest.raises(IntegrityError) as e:
        pull(store, MODEL, "1", to=serve, cache=cache, workers=4)
    assert_integrity_error(e.value, "data/b.bin", m, bad)
    entry = m.entry("data/b.bin")
    assert entry is not None
    assert_nothing_placed(cache, serve, entry.sha256, bad)
    # The cache is not poisoned: once the store is repaired the pull completes.
    store.write_bytes(key, good)
    r = pull(store, MODEL, "1", to=serve, cache=cache, workers=4)
    assert r.downloaded == 1 and r.transferred == entry.size
    assert_pulled(serve, store, "1", cache)


def test_cli_reports_tampered_file(durable_store_url: str, durable: Store,
                                   tmp_path: Path) -> None:
    m = publish(durable, tmp_path, "1", release_files())
    key = join(release_prefix(MODEL, "1"), "config.json")
    bad = tampered(durable.read_bytes(key), "flip")
    durable.write_bytes(key, bad)
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    entry = m.entry("config.json")
    assert entry is not None
    p = run_cli("pull", f"{MODEL}@1", "--to", str(serve), "--cache", str(cache), "--store",
                durable_store_url)
    assert_cli_error(p, 1, "config.json", entry.sha256, sha256(bad))
    assert_nothing_placed(cache, serve, entry.sha256, bad)


def test_plan_split_measures_instead_of_assuming() -> None:
    """The split decision from a stream's rate and time to first byte (TTFB)."""
    mib = 1024 * 1024
    # A real object store: 80 MB/s per stream, 30 ms per request: 8 ranges.
    assert download.plan_split(700 * mib, 80e6, 0.03, 8) == 8
    # moto: 1.1 GB/s, but 0.49 s before the first byte of any (ranged) GET.
    assert download.plan_split(700 * mib, 1.1e9, 0.49, 8) == 1
    # Local disk: the rest takes 0.35 s, under MIN_SPLIT_SECONDS.
    assert download.plan_split(700 * mib, 2e9, 0.0001, 8) == 1
    # Slow, but each range would cost too much set-up for its share: fewer.
    assert download.plan_split(100 * mib, 20e6, 0.2, 8) == 2
    # Too little left, or one worker: never.
    assert download.plan_split(20 * mib, 1e6, 0.01, 8) == 1
    assert download.plan_split(700 * mib, 80e6, 0.03, 1) == 1


@pytest.mark.parametrize("start,end,pieces", [(0, 10 * MIB, 3), (KIB, 700 * MIB + 5, 8),
                                              (5, 2 * MIB, 8)])
def test_cut_covers_the_range_once(start: int, end: int, pieces: int) -> None:
    bounds = download.cut(start, end, pieces)
    assert 1 <= len(bounds) <= pieces
    assert bounds[0][0] == start and bounds[-1][1] == end
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all((e - s) % MIB == 0 for s, e in bounds[:-1])


@pytest.mark.parametrize("slow", [True, False])
def test_slow_stream_is_split_fast_one_is_not(durable: Store, tmp_path: Path, slow: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Default split rules (SPLIT_FACTOR, MIN_SPLIT_SECONDS): a stream at
    ~0.5 MB/s (as one S3 stream is slow against its parallel ranges) is cut
    into ranges; the same file streaming at 2 GB/s is not.

    The stream's clock is a fake one that each block moves by the time it
    would take at that rate, so the decision does not depend on how loaded
    the machine running the test is."""
    store = durable
    monkeypatch.setenv("REGISTRY_PULL_DIGEST", "sha256")  # local stores stream too
    monkeypatch.setenv(s3fetch.ENV, "0")  # S3: the s3fs stream (the direct GETs: below)
    m = publish(store, tmp_path, "1", release_files(big=True))
    key = join(release_prefix(MODEL, "1"), "big.bin")
    monkeypatch.setattr(download, "RANGE_THRESHOLD", MIB)
    monkeypatch.setattr(download, "MIN_SEGMENT", 256 * KIB)
    monkeypatch.setattr(download, "STREAM_CHUNK", 16 * KIB)
    monkeypatch.setattr(download, "PROBE_SECONDS", 0.1)
    rate = 16 * KIB / 0.03 if slow else 2e9  # bytes per second
    clock = [1000.0]
    monkeypatch.setattr(download, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real = store.iter_read

    def timed(k: str, chunk: int = KIB) -> Iterator[bytes]:
        clock[0] += 0.002  # the request's time to first byte
        for block in real(k, chunk):
            clock[0] += len(block) / rate
            yield block
    monkeypatch.setattr(store, "iter_read", timed)
    log = ReadLog(store)
    r = pull(store, MODEL, "1", to=tmp_path / "serve", cache=tmp_path / "cache", workers=4)
    assert r.transferred == sum(distinct(m).values())
    ranges = [n for meth, k, n in log.reads if k == key and meth == "iter_range"]
    streamed = sum(n for meth, k, n in log.reads if k == key and meth == "iter_read")
    if slow:
        assert 2 <= len(ranges) <= 3 and streamed + sum(ranges) == BIG, log.reads
    else:
        assert ranges == [] and streamed == BIG
    assert_pulled(tmp_path / "serve", store, "1", tmp_path / "cache")


@pytest.mark.parametrize("kind", ["ok", "flip", "truncate", "html"])
def test_large_file_ranged(durable: Store, tmp_path: Path, small_ranges: None,
                           kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = durable
    monkeypatch.setenv(s3fetch.ENV, "0")  # S3: the s3fs stream (the direct GETs: below)
    m = publish(store, tmp_path, "1", release_files(big=True))
    key = join(release_prefix(MODEL, "1"), "big.bin")
    entry = m.entry("big.bin")
    assert entry is not None and entry.size > download.RANGE_THRESHOLD
    bad = b""
    if kind != "ok":
        bad = tampered(store.read_bytes(key), kind)
        store.write_bytes(key, bad)
    log = ReadLog(store)
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    if kind == "ok":
        chunks: list[int] = []
        r = pull(store, MODEL, "1", to=serve, cache=cache, workers=3, progress=chunks.append)
        assert r.transferred == sum(distinct(m).values()) == sum(chunks)
        # One stream for the first piece, then the tail cut into 2 more ranges
        # (3 workers): every byte read exactly once.
        streamed = [n for meth, k, n in log.reads if k == key and meth == "iter_read"]
        ranges = [n for meth, k, n in log.reads if k == key and meth == "iter_range"]
        assert len(streamed) == 1 and len(ranges) == 2, log.reads
        assert streamed[0] + sum(ranges) == BIG
        assert not [k for meth, k, _ in log.reads
                    if k == key and meth not in ("iter_read", "iter_range")]
        assert_pulled(serve, store, "1", cache)
        assert_clean(cache, serve)
        return
    with pytest.raises(IntegrityError) as e:
        pull(store, MODEL, "1", to=serve, cache=cache, workers=3)
    assert_integrity_error(e.value, "big.bin", m, bad)
    assert_nothing_placed(cache, serve, entry.sha256, bad)


# -- what a serving host does to a pulled directory (issue 14, item 1) -------------------


def corrupt_blob(cache: Path, digest: str) -> bytes:
    """Flip one byte of a cache blob in place, as root or a process that chmods
    first would (blobs are read-only)."""
    blob = cache / "blobs" / "sha256" / digest
    assert blob.stat().st_mode & 0o222 == 0  # blobs are read-only
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(blob, "r+b") as f:
        f.write(data)
    blob.chmod(0o444)
    return bytes(data)


def edit_in_place(path: Path, *, keep_mtime: bool = False) -> bytes:
    """Change a few bytes of a pulled file, same length, as an engine running as
    root (or after a chmod) would; optionally put its mtime back."""
    st = path.stat()
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[1:4] = bytes(b ^ 0x20 for b in data[1:4])
    with open(path, "r+b") as f:
        f.write(data)
    path.chmod(st.st_mode & 0o777)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_mtime_ns == st.st_mtime_ns
    return bytes(data)


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_a_pulled_file_edited_in_place_poisons_nothing(
        durable_store_url: str, durable: Store, tmp_path: Path, keep_mtime: bool) -> None:
    """The field report: pull m@1 to A, edit A/config.json in place (same
    length), pull m@1 to B: B gets the released bytes from the cache without a
    download (the blob was never touched), and a re-pull to A notices the edit
    (even with the mtime put back): refused with exit 4 naming the file, and
    ``--force`` puts the release back."""
    m = publish(durable, tmp_path, "1", release_files())
    cache, a, b = tmp_path / "cache", tmp_path / "A", tmp_path / "B"
    pull(durable, MODEL, "1", to=a, cache=cache)
    cfg = m.entry("config.json")
    assert cfg is not None
    edited = edit_in_place(a / "config.json", keep_mtime=keep_mtime)
    assert sha256(edited) != cfg.sha256
    assert blobs(cache)[cfg.sha256] == stored(durable, "1")["config.json"]  # blob intact

    r = pull(durable, MODEL, "1", to=b, cache=cache)
    assert r.placed and r.downloaded == 0
    assert_pulled(b, durable, "1", cache)

    with pytest.raises(CommitConflictError) as e:
        pull(durable, MODEL, "1", to=a, cache=cache)
    assert str(a / "config.json") in str(e.value) and "changed since it was pulled" in str(e.value)
    p = run_cli("pull", f"{MODEL}@1", "--to", str(a), "--cache", str(cache), "--json",
                "--store", durable_store_url)
    assert_cli_error(p, 4, str(a / "config.json"), "--force")
    assert (a / "config.json").read_bytes() == edited  # refused: nothing replaced

    p = run_cli("pull", f"{MODEL}@1", "--to", str(a), "--cache", str(cache), "--force",
                "--json", "--store", durable_store_url)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["placed"] is True
    assert_pulled(a, durable, "1", cache)
    assert_clean(cache, a)
    assert not pull(durable, MODEL, "1", to=a, cache=cache).placed  # unchanged now


def test_every_way_of_changing_a_pulled_file_is_noticed(store: Store, tmp_path: Path) -> None:
    """Same kind, other inputs: a file truncated and rewritten to its old size,
    a file replaced by rename (a new inode), and the cache's own default
    directory edited; each is noticed on re-pull. Rewriting a file with its
    own bytes (a new stamp, same content) is not a change."""
    m = publish(store, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    r = pull(store, MODEL, "1", cache=cache)
    default = Path(r.path)
    original = stored(store, "1")

    # the cache's default directory, truncated then refilled to the same size
    f = default / "data" / "b.bin"
    f.chmod(0o644)
    f.write_bytes(b"\0" * len(original["data/b.bin"]))
    with pytest.raises(CommitConflictError, match="data/b.bin: changed since"):
        pull(store, MODEL, "1", cache=cache)
    assert pull(store, MODEL, "1", cache=cache, force=True).placed
    assert_pulled(default, store, "1", cache)

    # replaced by a rename: a new inode with other bytes of the same size
    t = tmp_path / "serve"
    pull(store, MODEL, "1", to=t, cache=cache)
    other = t / "data" / ".swap"
    other.write_bytes(original["data/a.bin"][::-1])
    os.replace(other, t / "data" / "a.bin")
    with pytest.raises(CommitConflictError, match="data/a.bin: changed since"):
        pull(store, MODEL, "1", to=t, cache=cache)

    # rewritten with its own bytes: re-hashed once, not a change
    assert pull(store, MODEL, "1", to=t, cache=cache, force=True).placed
    same = t / "data" / ".same"
    same.write_bytes(original["data/a.bin"])
    os.replace(same, t / "data" / "a.bin")
    r = pull(store, MODEL, "1", to=t, cache=cache)
    assert not r.placed and r.downloaded == 0
    assert m.entry("data/a.bin") is not None


@pytest.mark.parametrize("how", ["flip", "truncate", "replace"])
def test_a_changed_cache_blob_is_never_placed(durable_store_url: str, durable: Store,
                                              tmp_path: Path, how: str) -> None:
    """A blob changed after it was verified (a byte flipped in place, truncated
    and refilled, replaced by another file) is caught when it is placed, with
    no --verify: it is dropped, downloaded again, and the new target gets the
    released bytes; the CLI exits 0."""
    m = publish(durable, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    pull(durable, MODEL, "1", to=tmp_path / "a", cache=cache)
    entry = m.entry("data/b.bin")
    assert entry is not None
    blob = cache / "blobs" / "sha256" / entry.sha256
    if how == "flip":
        corrupt_blob(cache, entry.sha256)
    elif how == "truncate":
        blob.chmod(0o644)
        blob.write_bytes(b"x" * entry.size)
    else:
        other = cache / "blobs" / "sha256" / "other"
        other.write_bytes(b"y" * entry.size)
        os.replace(other, blob)
    assert sha256(blob.read_bytes()) != entry.sha256 and blob.stat().st_size == entry.size

    r = pull(durable, MODEL, "1", to=tmp_path / "b", cache=cache)
    assert r.downloaded == 1 and r.transferred == entry.size
    assert_pulled(tmp_path / "b", durable, "1", cache)
    assert_clean(cache, tmp_path / "b")
    assert (tmp_path / "a" / "data" / "b.bin").read_bytes() == stored(durable, "1")["data/b.bin"]

    corrupt_blob(cache, entry.sha256)
    p = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "d"), "--cache", str(cache),
                "--json", "--store", durable_store_url)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["downloaded"] == 1  # healed: downloaded again, verified
    assert_pulled(tmp_path / "d", durable, "1", cache)


def test_a_blob_that_stays_wrong_is_refused(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """If the re-downloaded blob is still wrong when placed (the cache keeps
    being written to), the pull fails with IntegrityError naming the file and
    nothing is placed."""
    store = open_store(str(tmp_path / "store"))
    m = publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "c"
    entry = m.entry("data/b.bin")
    assert entry is not None
    real_fetch = pull_module.fetch

    def fetch_then_spoil(*a: Any, **kw: Any) -> int:
        n = real_fetch(*a, **kw)
        if a[2].sha256 == entry.sha256:
            corrupt_blob(cache, entry.sha256)
        return n

    monkeypatch.setattr(pull_module, "fetch", fetch_then_spoil)
    with pytest.raises(IntegrityError) as e:
        pull(store, MODEL, "1", to=target, cache=cache)
    assert e.value.path == "data/b.bin" and "changed since it was verified" in str(e.value)
    assert not target.exists()
    assert entry.sha256 not in blobs(cache)
    assert_clean(cache, target)


def test_verify_rehashes_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--verify`` on a target that already holds the release re-hashes every
    file, whatever the stamps say (even where stamps are trusted)."""
    monkeypatch.setenv("REGISTRY_CACHE_TRUST_STAMPS", "1")  # else every re-pull re-hashes
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "t"
    pull(store, MODEL, "1", to=target, cache=cache)
    read: list[str] = []
    real = materialize.hash_file

    def spy(path: Any) -> Any:
        read.append(Path(path).name)
        return real(path)

    import unittest.mock

    from registry.protocol import verify as verify_mod
    real_tasks = verify_mod.hash_tasks

    def spy_tasks(store: Store, key: str, entry: Any) -> Any:  # --verify: every file
        read.append(Path(entry.path).name)
        return real_tasks(store, key, entry)

    with unittest.mock.patch.object(materialize, "hash_file", spy), \
            unittest.mock.patch.object(verify_mod, "hash_tasks", spy_tasks):
        assert not pull(store, MODEL, "1", to=target, cache=cache).placed
        assert read == []  # stamps unchanged: nothing read
        assert not pull(store, MODEL, "1", to=target, cache=cache, verify=True).placed
    assert sorted(read) == sorted(Path(p).name for p in stored(store, "1") if p != MANIFEST)


# == 4. atomicity and concurrency ==========================================================


def wait_for(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def test_concurrent_pulls_of_one_release_all_succeed(durable_store_url: str, durable: Store,
                                                     tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    base = tmp_path / "race"
    base.mkdir()
    argv = [sys.executable, str(CHILD), "race", durable_store_url, MODEL, "1", str(base),
            str(REPETITIONS)]
    with python_popens([argv] * RACERS, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True) as procs:
        for rep in range(REPETITIONS):
            wait_for(lambda: len(list(base.glob(f"ready-{rep}-*"))) == RACERS, 120,
                     f"{RACERS} racers ready for repetition {rep}")
            (base / f"go-{rep}").touch()
        outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err
        lines = [json.loads(x) for x in out.splitlines()]
        assert [x["rep"] for x in lines] == list(range(REPETITIONS))
        assert all(x["ok"] for x in lines), lines
    for rep in range(REPETITIONS):
        placed = [json.loads(out.splitlines()[rep])["placed"] for out, _ in outs]
        assert placed.count(True) >= 1, placed
        cache, target = base / str(rep) / "cache", base / str(rep) / "model"
        # Content and never a hardlink (see test_redownloaded_blob_keeps_the_cached_one).
        assert_pulled(target, durable, "1", cache)
        assert_clean(cache, target)


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError("child did not report in time")
        return proc.stdout.readline().strip()
    finally:
        sel.close()


@pytest.mark.parametrize("phase", ["stream", "ranged", "place"])
def test_killed_pull_leaves_no_partial_and_next_pull_cleans_up(
        durable_store_url: str, durable: Store, tmp_path: Path, phase: str) -> None:
    publish(durable, tmp_path, "1", release_files(big=phase == "ranged"))
    cache, target = tmp_path / "cache", tmp_path / "serve" / "model"
    proc = python_popen([sys.executable, str(CHILD), "stall", durable_store_url, MODEL, "1",
                             str(cache), str(target), phase],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "REGISTRY_PULL_DIGEST": "sha256"})
    try:
        line = read_line(proc, 60)
        assert line == "STALL", (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(0.1)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()  # reaped: its pid is no longer alive
    assert proc.returncode == -signal.SIGKILL

    tag = f"pid{proc.pid}."
    assert not target.exists()
    for name, data in blobs(cache).items():  # no blob with wrong content
        assert sha256(data) == name
    leftovers_tmp = [p for p in os.listdir(cache / "tmp") if tag in p]
    leftovers_staging = [p for p in os.listdir(target.parent) if tag in p] \
        if target.parent.exists() else []
    if phase == "place":
        assert len(leftovers_staging) == 1 and ".pull-" in leftovers_staging[0]
    else:
        # a partial with verified pieces keeps its piece log (registry.pull.resume)
        assert leftovers_tmp and all(p.endswith((".incomplete", ".incomplete.pieces"))
                                     for p in leftovers_tmp)

    # The next pull (defaults: the large file streams) cleans up and completes.
    r = pull(durable, MODEL, "1", to=target, cache=cache, workers=2)
    assert r.placed
    assert_pulled(target, durable, "1", cache)
    assert_clean(cache, target)


def test_release_placed_by_a_concurrent_pull_is_not_foreign(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race, deterministically: another pull places the directory right after
    this one found the target absent."""
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "serve"
    real = materialize.current_digest
    raced: list[Path] = []

    def racing(path: Path) -> str | None:
        digest = real(path)
        if digest is None and not raced:
            raced.append(path)
            assert pull(store, MODEL, "1", to=target, cache=cache).placed  # the other pull
        return digest

    monkeypatch.setattr(materialize, "current_digest", racing)
    r = pull(store, MODEL, "1", to=target, cache=cache)
    assert raced and not r.placed
    assert_pulled(target, store, "1", cache)
    assert_clean(cache, target)


def test_redownloaded_blob_keeps_the_cached_one(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """What a concurrent pull does, deterministically: it saw the blob missing,
    downloaded it, and lands it after another pull already placed it: the
    cached blob (and its stamp) stays, both directories are whole."""
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    pull(store, MODEL, "1", to=tmp_path / "a", cache=cache)
    monkeypatch.setattr(cache_mod.Cache, "has", lambda self, sha, size: False)
    inodes = {p.name: p.stat().st_ino for p in (cache / "blobs" / "sha256").iterdir()}
    pull(store, MODEL, "1", to=tmp_path / "b", cache=cache)
    assert {p.name: p.stat().st_ino for p in (cache / "blobs" / "sha256").iterdir()} == inodes
    assert_pulled(tmp_path / "b", store, "1", cache)
    assert_pulled(tmp_path / "a", store, "1", cache)


# == 5. bad input ==============================================================================


def test_foreign_target_refused_unless_force(durable_store_url: str, durable: Store,
                                             tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    v2 = dict(release_files(), **{"config.json": b'{"hidden_size": 8, "v": 2}\n'})
    publish(durable, tmp_path, "2", v2)
    cache, target = tmp_path / "cache", tmp_path / "serve"

    # An empty directory is not foreign content.
    target.mkdir()
    pull(durable, MODEL, "1", to=target, cache=cache)
    assert_pulled(target, durable, "1", cache)
    # Another release in the target: refused, left as it was; --force replaces it.
    with pytest.raises(CommitConflictError, match="holds other content"):
        pull(durable, MODEL, "2", to=target, cache=cache)
    assert_pulled(target, durable, "1", cache)
    r = pull(durable, MODEL, "2", to=target, cache=cache, force=True)
    assert r.placed
    assert_pulled(target, durable, "2", cache)
    assert_clean(cache, target)

    # Foreign files (no manifest): the CLI refuses without --force, replaces with it.
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    (other / "weights.bin").write_bytes(b"mine")
    (other / "sub" / "notes.txt").write_text("keep?")
    p = run_cli("pull", f"{MODEL}@1", "--to", str(other), "--cache", str(cache), "--store",
                durable_store_url)
    assert_cli_error(p, 4, str(other), "holds other content", "--force")
    assert on_disk(other) == {"weights.bin": b"mine", "sub/notes.txt": b"keep?"}
    p = run_cli("pull", f"{MODEL}@1", "--to", str(other), "--cache", str(cache), "--force",
                "--verify", "--quiet", "--store", durable_store_url)
    assert p.returncode == 0 and p.stdout == f"{other}\n", p.stderr
    assert_pulled(other, durable, "1", cache)
    assert_clean(cache, other)


def test_force_over_a_regular_file_leaves_nothing_behind(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "serve" / "model"
    target.parent.mkdir()
    target.write_text("not a model directory")
    with pytest.raises(CommitConflictError):
        pull(store, MODEL, "1", to=target, cache=cache)
    assert pull(store, MODEL, "1", to=target, cache=cache, force=True).placed
    assert_pulled(target, store, "1", cache)
    assert sorted(os.listdir(target.parent)) == ["model"]


def test_missing_object_is_refused(store: Store, tmp_path: Path) -> None:
    publish(store, tmp_path, "1", release_files())
    key = join(release_prefix(MODEL, "1"), "data/b.bin")
    store.delete(key)
    cache, target = tmp_path / "cache", tmp_path / "serve"
    with pytest.raises(ObjectNotFoundError) as e:
        pull(store, MODEL, "1", to=target, cache=cache)
    assert "data/b.bin" in str(e.value)
    assert not target.exists()
    assert_clean(cache, target)


def test_incomplete_target_refused_unless_force(tmp_path: Path) -> None:
    """A target holding this release minus one file is not "already there"."""
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "serve"
    pull(store, MODEL, "1", to=target, cache=cache)
    (target / "data" / "b.bin").unlink()
    with pytest.raises(CommitConflictError):
        pull(store, MODEL, "1", to=target, cache=cache)
    assert pull(store, MODEL, "1", to=target, cache=cache, force=True).placed
    assert_pulled(target, store, "1", cache)
    assert_clean(cache, target)


_Usage = collections.namedtuple("_Usage", "total used free")


def test_insufficient_space_is_refused_before_the_first_byte(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m1 = publish(store, tmp_path, "1", release_files())
    v2 = dict(release_files(), **{"data/b.bin": b"new" * 1000})
    m2 = publish(store, tmp_path, "2", v2)
    cache, target = tmp_path / "cache", tmp_path / "serve"
    free = [FREE_MARGIN + 100]

    def disk_usage(path: Any) -> Any:
        return _Usage(10**12, 10**12 - free[0], free[0])

    monkeypatch.setattr(pull_module.shutil, "disk_usage", disk_usage)
    log = ReadLog(store)
    with pytest.raises(InsufficientSpaceError) as e:
        pull(store, MODEL, "1", to=target, cache=cache)
    # the missing blobs, plus the model directory's copies on the same filesystem
    need = sum(distinct(m1).values()) + m1.total_size
    assert (e.value.available, e.value.needed) == (free[0], need + FREE_MARGIN)
    assert str(cache.resolve()) in str(e.value) and str(need) in str(e.value)
    assert log.data_bytes("1") == {}  # not a byte of a file was read
    if isinstance(store, S3Store):
        assert log.data_gets("1") == {}
    assert not target.exists() and blobs(cache) == {}
    assert_clean(cache, target)

    # Only the bytes still missing from the cache count.
    free[0] = 10**12
    pull(store, MODEL, "1", to=target, cache=cache)
    changed = m2.entry("data/b.bin")
    assert changed is not None
    free[0] = FREE_MARGIN + changed.size + m2.total_size
    r = pull(store, MODEL, "2", cache=cache)
    assert r.transferred == changed.size
    assert_pulled(Path(r.path), store, "2", cache)


def fill_disk_after(monkeypatch: pytest.MonkeyPatch, path: str, limit: int) -> None:
    """Writes to the temp file of ``path``'s download fail with ENOSPC after
    ``limit`` bytes (the download writes with ``os.pwrite`` through
    ``download._pwrite_all``; the file is told by its /proc/self/fd link)."""
    real = download._pwrite_all
    written = [0]
    lock = threading.Lock()

    def full(fd: int, data: Any, offset: int) -> None:
        if path in os.readlink(f"/proc/self/fd/{fd}"):
            with lock:
                if written[0] + len(data) > limit:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written[0] += len(data)
        real(fd, data, offset)

    monkeypatch.setattr(download, "_pwrite_all", full)
    monkeypatch.setattr(s3fetch, "_pwrite_all", full)  # an S3 pull's direct GETs


def test_disk_full_while_downloading(store: Store, tmp_path: Path, small_ranges: None,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    m = publish(store, tmp_path, "1", release_files())
    entry = m.entry("data/b.bin")
    assert entry is not None
    fill_disk_after(monkeypatch, entry.sha256, 1500)
    cache, target = tmp_path / "cache", tmp_path / "serve"
    with pytest.raises(InsufficientSpaceError, match="no space left"):
        pull(store, MODEL, "1", to=target, cache=cache, workers=4)
    assert not target.exists() and entry.sha256 not in blobs(cache)
    assert_clean(cache, target)
    monkeypatch.undo()
    pull(store, MODEL, "1", to=target, cache=cache, blobs=True)
    assert_pulled(target, store, "1", cache)


def test_disk_full_while_downloading_ranges(durable: Store, tmp_path: Path, small_ranges: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = durable
    m = publish(store, tmp_path, "1", release_files(big=True))
    entry = m.entry("big.bin")
    assert entry is not None
    fill_disk_after(monkeypatch, entry.sha256, 600 * KIB)
    cache, target = tmp_path / "cache", tmp_path / "serve"
    with pytest.raises(InsufficientSpaceError):
        pull(store, MODEL, "1", to=target, cache=cache, workers=4)
    assert not target.exists() and entry.sha256 not in blobs(cache)
    assert_clean(cache, target)


def test_disk_full_via_cli_is_one_line(tmp_path: Path) -> None:
    """A real small filesystem is not available; the CLI path is shown with a child
    that patches disk_usage (the same error boundary handles every RegistryError)."""
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    code = ("import shutil, sys, collections\n"
            "U = collections.namedtuple('U', 'total used free')\n"
            "shutil.disk_usage = lambda p: U(10**9, 10**9 - 1000, 1000)\n"
            "from registry.cli import main\n"
            "sys.argv[0] = 'registry'\n"
            "main()\n")
    p = python_run([sys.executable, "-c", code, "pull", f"{MODEL}@1", "--to",
                        str(tmp_path / "serve"), "--cache", str(tmp_path / "cache"),
                        "--store", str(tmp_path / "store")],
                       capture_output=True, text=True, timeout=120)
    assert_cli_error(p, 6, "1000 bytes free", "64 MiB safety margin kept free")
    assert not (tmp_path / "serve").exists() and blobs(tmp_path / "cache") == {}


def fake_reflink(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``materialize.reflink`` behave as on a filesystem that clones
    (this one, ext4, has no FICLONE): the bytes are copied in the kernel and
    True returned, so the caller reads nothing; returns a call counter."""
    calls = [0]

    def clone(src_fd: int, dst_fd: int) -> bool:
        calls[0] += 1
        size = os.fstat(src_fd).st_size
        off = 0
        while off < size:
            off += os.copy_file_range(src_fd, dst_fd, size - off, off, off)
        return True

    monkeypatch.setattr(materialize, "reflink", clone)
    return calls


@pytest.mark.parametrize("fsync", [True, False])
def test_no_blobs_writes_each_byte_once(store: Store, tmp_path: Path, fsync: bool) -> None:
    """``blobs=False``: files the cache lacks go straight into the target
    (one write per byte), no blob is kept; cached files still come from
    their blobs; a tampered file places nothing (issue 19)."""
    m = publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "t"
    r = pull(store, MODEL, "1", to=target, cache=cache, blobs=False, fsync=fsync)
    assert r.placed and r.downloaded == len({e.sha256 for e in m.files})
    assert r.transferred == sum({e.sha256: e.size for e in m.files}.values())
    assert_pulled(target, store, "1", None)
    assert blobs(cache) == {}
    assert_clean(cache, target)
    assert not pull(store, MODEL, "1", to=target, cache=cache, blobs=False).placed
    # a second target: the files are downloaded again (no blob to share) ...
    other = tmp_path / "t2"
    assert pull(store, MODEL, "1", to=other, cache=cache, blobs=False).transferred == \
        r.transferred
    # ... unless a default pull cached them: then they come from the blobs
    pull(store, MODEL, "1", to=tmp_path / "t3", cache=cache)
    assert pull(store, MODEL, "1", to=tmp_path / "t4", cache=cache,
                blobs=False).transferred == 0
    assert_pulled(tmp_path / "t4", store, "1", cache)
    key = join(release_prefix(MODEL, "1"), "data/b.bin")
    store.write_bytes(key, tampered(store.read_bytes(key), "flip"))
    with pytest.raises(IntegrityError, match="data/b.bin"):
        pull(store, MODEL, "1", to=tmp_path / "t5", cache=tmp_path / "c5", blobs=False)
    assert not (tmp_path / "t5").exists()
    assert_clean(tmp_path / "c5", tmp_path / "t5")


def test_cli_no_blobs(durable_store_url: str, durable: Store, tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "t"
    p = run_cli("pull", f"{MODEL}@1", "--to", str(target), "--cache", str(cache),
                "--no-blobs", "--store", durable_store_url, "--json")
    assert p.returncode == 0, p.stderr
    assert_pulled(target, durable, "1", None)
    assert blobs(cache) == {}


def test_default_blob_mode_follows_the_store(durable_store_url: str, durable: Store,
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Not told (``$REGISTRY_PULL_BLOBS`` unset: auto), a pull from a local
    store writes every byte once, straight into the target, and keeps no blob
    (the store is already a verified copy on this host); a pull from an object
    store keeps blobs for later pulls to share. The API and the CLI agree, and
    --blobs / --no-blobs / the variable override the store's kind."""
    monkeypatch.delenv("REGISTRY_PULL_BLOBS")
    m = publish(durable, tmp_path, "1", release_files())
    local = durable.local_path("") is not None
    every = {e.sha256: e.size for e in m.files}
    cache = tmp_path / "cache"
    r = pull(durable, MODEL, "1", to=tmp_path / "api", cache=cache)
    assert_pulled(tmp_path / "api", durable, "1", None)
    assert set(blobs(cache)) == (set() if local else set(every))
    assert r.transferred == sum(every.values())
    c2 = tmp_path / "cache2"
    p = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "cli"), "--cache", str(c2),
                "--store", durable_store_url, "--json")
    assert p.returncode == 0, p.stderr
    assert_pulled(tmp_path / "cli", durable, "1", None)
    assert set(blobs(c2)) == (set() if local else set(every))
    # the cache still lists the version and the directory it placed
    ls = run_cli("cache", "ls", "--cache", str(c2), "--json")
    assert ls.returncode == 0, ls.stderr
    assert str(tmp_path / "cli") in ls.stdout
    text = run_cli("cache", "ls", "--cache", str(c2))
    assert text.returncode == 0 and str(tmp_path / "cli") in text.stdout, text.stderr
    assert ("no blobs kept" in text.stdout) == local, text.stdout
    # overrides: the flag, then the variable
    c3 = tmp_path / "cache3"
    p = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "flag"), "--cache", str(c3),
                "--store", durable_store_url, "--blobs" if local else "--no-blobs")
    assert p.returncode == 0, p.stderr
    assert set(blobs(c3)) == (set(every) if local else set())
    monkeypatch.setenv("REGISTRY_PULL_BLOBS", "always" if not local else "never")
    c4 = tmp_path / "cache4"
    pull(durable, MODEL, "1", to=tmp_path / "var", cache=c4)
    assert set(blobs(c4)) == (set(every) if not local else set())
    assert_pulled(tmp_path / "var", durable, "1", None)


def test_bad_blob_mode_variable_is_refused(durable_store_url: str, durable: Store,
                                           tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    argv = ["pull", f"{MODEL}@1", "--to", str(tmp_path / "t"), "--cache", str(tmp_path / "c"),
            "--store", durable_store_url]
    bad = ("sometimes", "1", "yes")
    got = run_cli_batch([{"argv": argv, "env": {"REGISTRY_PULL_BLOBS": b}} for b in bad]
                        + [[*argv, "--blobs", "--no-blobs"]])
    for b, p in zip(bad, got, strict=False):
        assert_cli_error(p, 2, "REGISTRY_PULL_BLOBS", repr(b), "auto, always or never")
    assert_cli_error(got[-1], 2, "--blobs and --no-blobs")
    assert not (tmp_path / "t").exists()


def test_a_verified_blob_is_copied_unread(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without reflinks, a blob whose stamp is the one recorded when it was
    verified is copied by the kernel, not hashed again (issue 19: the second
    sha256 pass of every pull); a changed stamp is re-hashed (see
    test_a_changed_cache_blob_is_never_placed)."""
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    monkeypatch.setattr(materialize, "reflink", lambda src, dst: False)
    hashed: list[object] = []
    real = materialize.HashingWriter
    monkeypatch.setattr(materialize, "HashingWriter",
                        lambda raw: hashed.append(raw) or real(raw))
    cache, target = tmp_path / "cache", tmp_path / "t"
    pull(store, MODEL, "1", to=target, cache=cache)
    assert hashed == []
    assert_pulled(target, store, "1", cache)


def test_reflink_checks_the_blob_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the filesystem clones, a blob is not read when placed: its stat
    stamp (recorded when it was verified) is compared. A blob written to since
    (even with its mtime put back) is re-hashed, dropped and downloaded again;
    a blob only touched is re-hashed once and kept."""
    store = open_store(str(tmp_path / "store"))
    m = publish(store, tmp_path, "1", release_files())
    calls = fake_reflink(monkeypatch)
    cache = tmp_path / "cache"
    pull(store, MODEL, "1", to=tmp_path / "a", cache=cache)
    assert calls[0] == len(m.files)
    assert_pulled(tmp_path / "a", store, "1", cache)

    entry = m.entry("data/b.bin")
    assert entry is not None
    blob = cache / "blobs" / "sha256" / entry.sha256
    st = blob.stat()
    corrupt_blob(cache, entry.sha256)
    os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime and size as before
    assert (blob.stat().st_size, blob.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    r = pull(store, MODEL, "1", to=tmp_path / "b", cache=cache)
    assert r.downloaded == 1 and r.transferred == entry.size
    assert_pulled(tmp_path / "b", store, "1", cache)
    assert_clean(cache, tmp_path / "b")

    os.utime(blob)  # touched, not changed
    r = pull(store, MODEL, "1", to=tmp_path / "c", cache=cache)
    assert r.downloaded == 0
    assert_pulled(tmp_path / "c", store, "1", cache)


def test_copy_across_filesystems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or \
            shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second writable filesystem")
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    target = shm / f"registry-pull-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        pull(store, MODEL, "1", to=target, cache=tmp_path / "cache")
        assert_pulled(target, store, "1", tmp_path / "cache", linked=False)
        assert_clean(tmp_path / "cache", target)
    finally:
        import shutil
        shutil.rmtree(target, ignore_errors=True)


def test_disk_full_while_materializing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    calls = [0]
    real = materialize._copy_unread  # verified blobs are copied unread (issue 19)

    def full(src: Any, raw: Any) -> int:
        calls[0] += 1
        if calls[0] < 3:
            return real(src, raw)
        raw.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(materialize, "_copy_unread", full)
    cache, target = tmp_path / "cache", tmp_path / "serve"
    try:
        with pytest.raises(InsufficientSpaceError):
            pull(store, MODEL, "1", to=target, cache=cache)
    finally:
        assert not target.exists()
        assert_clean(cache, target)


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_option_through_the_registry_facade(store: Store, tmp_path: Path, fsync: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``Registry.pull(ref, fsync=...)``: by default every downloaded blob is
    fsynced before it enters the cache; ``fsync=False`` (``--no-fsync``) skips
    that, and the pull is still verified and placed whole."""
    from registry.api import Registry
    m = publish(store, tmp_path, "1", release_files())
    synced: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", counting)
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    with Registry(store, db=f"sqlite:///{tmp_path / 'unused.db'}") as reg:
        r = reg.pull(f"{MODEL}@1", to=serve, cache=cache, fsync=fsync)
    assert not (tmp_path / "unused.db").exists()  # pull never opens the index
    blob_syncs = [p for p in synced if str(cache / "tmp") in p]
    assert len(blob_syncs) == (len(distinct(m)) if fsync else 0), synced
    assert r.downloaded == len(distinct(m)) and r.placed
    assert_pulled(serve, store, "1", cache)


def test_cli_no_fsync(durable_store_url: str, durable: Store, tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    p = run_cli("pull", f"{MODEL}@1", "--to", str(serve), "--cache", str(cache), "--store",
                durable_store_url, "--no-fsync", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["placed"] is True
    assert_pulled(serve, durable, "1", cache)


def test_bad_arguments_are_usage_errors(durable_store_url: str, durable: Store,
                                        tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    for kw, needle in (({"to": ""}, "non-empty path"), ({"workers": 0}, "at least 1"),
                       ({"range_threshold": -1}, "negative")):
        with pytest.raises(UsageError, match=needle):
            pull(durable, MODEL, "1", cache=cache, **kw)  # type: ignore[arg-type]
    refusals = ((["--to", ""], "non-empty path"), (["--workers", "0"], "at least 1"),
                (["--range-threshold-mib", "-1"], "must not be negative"))
    got = run_cli_batch([["pull", f"{MODEL}@1", "--cache", str(cache), "--store",
                          durable_store_url, *args] for args, _ in refusals])
    for (_, needle), p in zip(refusals, got, strict=True):
        assert_cli_error(p, 2, needle)
    assert not (cache / "models" / MODEL).exists()


def test_target_overlapping_the_cache_or_the_store_is_refused(tmp_path: Path) -> None:
    """With --force a pull replaces its target: a target that is, holds or
    lies inside the cache or a local store would destroy them."""
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    publish(store, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    pull(store, MODEL, "1", cache=cache)  # the default target: <cache>/models/<id>/<v>
    before = {p: p.read_bytes() for p in sorted(store_dir.rglob("*")) if p.is_file()}
    blobs_before = sorted(os.listdir(cache / "blobs" / "sha256"))
    for target in (cache, cache / "blobs", tmp_path, store_dir,
                   store_dir / "models" / MODEL / "1", cache / "elsewhere",
                   # inside models/ only this release's own path: cache prune
                   # removes what it finds there (break-test: a user's --to)
                   cache / "models" / MODEL / "mine", cache / "models" / MODEL / "2",
                   cache / "models" / MODEL / "1" / "sub"):
        with pytest.raises(UsageError, match="lies inside"):
            pull(store, MODEL, "1", to=target, cache=cache, force=True)
    p = run_cli("pull", f"{MODEL}@1", "--to", str(store_dir), "--cache", str(cache),
                "--store", str(store_dir), "--force")
    assert_cli_error(p, 2, "lies inside the store")
    assert {p: p.read_bytes() for p in sorted(store_dir.rglob("*")) if p.is_file()} == before
    assert sorted(os.listdir(cache / "blobs" / "sha256")) == blobs_before
    assert_pulled(cache / "models" / MODEL / "1", store, "1", cache)


def test_unusable_cache_or_target_parent_is_one_clean_error(durable_store_url: str,
                                                             durable: Store,
                                                             tmp_path: Path) -> None:
    publish(durable, tmp_path, "1", release_files())
    a_file = tmp_path / "a-file"
    a_file.write_bytes(b"not a directory")
    with pytest.raises(StorageError, match="cannot use as the cache directory"):
        pull(durable, MODEL, "1", cache=a_file)
    bad_cache, bad_parent = run_cli_batch([
        ["pull", f"{MODEL}@1", "--cache", str(a_file), "--store", durable_store_url],
        ["pull", f"{MODEL}@1", "--to", str(a_file / "sub"), "--cache", str(tmp_path / "cache"),
         "--store", durable_store_url]])
    assert_cli_error(bad_cache, 6, str(a_file), "cannot use as the cache directory")
    assert_cli_error(bad_parent, 6, str(a_file), "cannot create the target's parent")
    assert a_file.read_bytes() == b"not a directory"


def test_target_with_an_unlisted_file_is_other_content(store: Store, tmp_path: Path) -> None:
    publish(store, tmp_path, "1", release_files())
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    pull(store, MODEL, "1", to=serve, cache=cache)
    (serve / "junk.txt").write_bytes(b"left by someone")
    with pytest.raises(CommitConflictError, match="holds other content"):
        pull(store, MODEL, "1", to=serve, cache=cache)
    assert (serve / "junk.txt").read_bytes() == b"left by someone"
    r = pull(store, MODEL, "1", to=serve, cache=cache, force=True)
    assert r.placed and not (serve / "junk.txt").exists()
    assert_pulled(serve, store, "1", cache)
