"""``registry cache ls|prune|verify`` (issue 19, item 1): the pull cache manages its disk.

What is checked, and how:

* ls: per model and version, the size on disk, the blobs shared with other
  versions, last pulled, the materialized directories (``--to`` and in-cache,
  with their state), totals; the numbers are compared with what is really in
  ``blobs/`` and on disk. From the Python API (``Registry.cache``) and the CLI
  (``--json`` validated against ``schemas/cache-ls.schema.json``), for pulls
  from memory, local and S3 stores. A cache filled before records existed is
  listed from its stamp records.
* prune: ``--keep-last``, ``--older-than``, ``--max-size`` (least recently
  pulled first) and ``--dry-run``; what goes and what stays is checked on disk:
  blobs, records, in-cache directories (deleted), ``--to`` directories (kept,
  forgotten); a blob a kept version uses is never deleted; the kept versions
  re-pull without a download. Unreferenced blobs always go.
* Concurrency: real processes pull (several versions, several rounds) while
  other processes prune everything they can; every pull succeeds and verifies.
* verify: a damaged blob is reported (name, digest of its bytes, versions using
  it) and removed, exit 1; the next pull downloads it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from registry.rules import schemas
from registry.api import Registry
from registry.protocol.commit import commit_local_directory
from registry.errors import UsageError
from registry.lifecycle.gc import parse_duration
from registry.protocol.manifest import FileEntry, Manifest
from registry.pull import pull
from registry.pull.cache import Cache
from registry.pull.cache_admin import PullCache
from registry.pull.cache_prune import parse_size
from registry.pull.records import pulling, read_records
from registry.release import release_prefix
from registry.store import Store, open_store
from registry.protocol.verify import verify_directory
from tests.conftest import REPO, run_cli
from tests.support.forkclient import python_popen, python_run

CHILD = Path(__file__).resolve().parent / "support" / "cache_child.py"


def publish(store: Store, root: Path, model_id: str, version: str,
            files: dict[str, bytes]) -> Manifest:
    src = root / f"src-{model_id}-{version}"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return commit_local_directory(store, src, release_prefix(model_id, version), kind="release",
                                  model_id=model_id, version=version, source={"uri": str(src)})


def files_of(version: str, *, model_id: str = "tiny", size: int = 3000) -> dict[str, bytes]:
    """``shared.bin`` is the same in every version of a model, ``config.json``
    in every model; ``own.bin`` differs."""
    return {"config.json": b'{"hidden_size": 8}\n', "shared.bin": model_id.encode() * 5000,
            "own.bin": f"{model_id}-{version}".encode() * size}


def blob_names(cache: Path) -> set[str]:
    return set(os.listdir(cache / "blobs" / "sha256"))


def on_disk_blob_bytes(cache: Path) -> int:
    d = cache / "blobs" / "sha256"
    return sum(p.stat().st_size for p in d.iterdir())


def age(cache: Path, model_id: str, version: str, seconds: float) -> None:
    """Pretend ``model_id@version`` was last pulled ``seconds`` ago (edits its record)."""
    for p in (cache / "records").glob("*.json"):
        doc = json.loads(p.read_text())
        if (doc["model_id"], doc["version"]) == (model_id, version):
            when = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(time.time() - seconds))
            doc["last_pulled"] = doc["first_pulled"] = when
            p.write_text(json.dumps(doc))
            return
    raise AssertionError(f"no record of {model_id}@{version}")


def validate(doc: Any, name: str) -> None:
    errors = list(Draft202012Validator(schemas.load_schema(name)).iter_errors(doc))
    assert errors == [], errors[0]


@pytest.fixture
def world(store: Store, tmp_path: Path) -> dict[str, Any]:
    """tiny@1..3 (sharing shared.bin and config.json) and other@1, pulled in that
    order: tiny@1 to a --to directory, the rest into the cache."""
    ms = {}
    for model_id, version in (("tiny", "1"), ("tiny", "2"), ("tiny", "3"), ("other", "1")):
        ms[(model_id, version)] = publish(store, tmp_path, model_id, version,
                                          files_of(version, model_id=model_id))
    cache, serve = tmp_path / "cache", tmp_path / "serve"
    pull(store, "tiny", "1", to=serve, cache=cache)
    for model_id, version in (("tiny", "2"), ("tiny", "3"), ("other", "1")):
        pull(store, model_id, version, cache=cache)
    return {"store": store, "cache": cache.resolve(), "serve": serve.resolve(), "manifests": ms}


# == ls ===============================================================================


def test_ls_reports_versions_sizes_sharing_and_directories(world: dict[str, Any]) -> None:
    cache, serve, ms = world["cache"], world["serve"], world["manifests"]
    report = Registry(world["store"]).cache(cache).ls()
    got = [(v.model_id, v.version) for v in report.versions]
    assert got == [("other", "1"), ("tiny", "3"), ("tiny", "2"), ("tiny", "1")]  # newest first
    by = {(v.model_id, v.version): v for v in report.versions}
    for key, v in by.items():
        m = ms[key]
        blobs = {e.sha256: e.size for e in m.files}
        assert (v.manifest_sha256, v.files, v.bytes) == (m.digest, len(m.files), m.total_size)
        assert (v.blobs, v.blob_bytes, v.missing_blobs) == (len(blobs), sum(blobs.values()), 0)
        assert v.first_pulled <= v.last_pulled and not v.in_use
    # tiny's versions share shared.bin and config.json; other@1 shares config.json with them
    t1 = by[("tiny", "1")]
    shared = {e.sha256: e.size for e in ms[("tiny", "1")].files if e.path != "own.bin"}
    assert (t1.shared_blobs, t1.shared_bytes) == (2, sum(shared.values()))
    own = next(e.size for e in ms[("tiny", "1")].files if e.path == "own.bin")
    assert t1.unique_bytes == own
    o1 = by[("other", "1")]
    assert o1.shared_blobs == 1  # config.json only
    # directories: tiny@1 in --to (outside the cache), the others inside
    assert [m.to_dict() for m in t1.materialized] == [
        {"path": str(serve), "inside_cache": False, "state": "placed"}]
    t2dir = cache / "models" / "tiny" / "2"
    assert [m.to_dict() for m in by[("tiny", "2")].materialized] == [
        {"path": str(t2dir), "inside_cache": True, "state": "placed"}]
    assert t1.size_on_disk == t1.blob_bytes
    t2 = by[("tiny", "2")]
    assert t2.size_on_disk == t2.blob_bytes + ms[("tiny", "2")].total_size
    # totals match the disk
    assert report.blobs == len(blob_names(cache))
    assert report.blob_bytes == on_disk_blob_bytes(cache)
    assert report.materialized_bytes == sum(ms[k].total_size for k in by if k != ("tiny", "1"))
    assert (report.unreferenced_blobs, report.pulls_in_progress) == (0, 0)
    doc = report.to_dict()
    validate(doc, "cache-ls")
    assert doc["totals"]["models"] == 2 and doc["totals"]["versions"] == 4

    # a --to directory that got another release is shown as replaced
    pull(world["store"], "tiny", "2", to=serve, cache=cache, force=True)
    states = {(v.model_id, v.version): [m.state for m in v.materialized]
              for v in PullCache(cache).ls().versions}
    assert states[("tiny", "1")] == ["replaced"]
    assert states[("tiny", "2")] == ["placed", "placed"]


def test_cli_ls_text_and_json(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    for v in ("1", "2"):
        publish(store, tmp_path, "tiny", v, files_of(v))
    cache = tmp_path / "cache"
    for v in ("1", "2"):
        pull(store, "tiny", v, cache=cache, to=tmp_path / f"serve-{v}")
    r = run_cli("cache", "ls", "--cache", str(cache), "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    validate(doc, "cache-ls")
    assert [(v["model_id"], v["version"]) for v in doc["versions"]] == [
        ("tiny", "2"), ("tiny", "1")]
    assert doc["totals"]["blob_bytes"] == on_disk_blob_bytes(cache)
    r = run_cli("cache", "ls", env={"REGISTRY_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["MODEL", "VERSION", "SIZE", "SHARED"]
    assert lines[1].split()[:2] == ["tiny", "2"] and str(tmp_path / "serve-2") in lines[1]
    assert "2 blobs" in lines[1]  # config.json and shared.bin
    assert lines[-1].startswith("total: 1 model, 2 versions, 4 blobs")
    assert PullCache(tmp_path / "none").ls().versions == ()
    assert not (tmp_path / "none").exists()  # listing creates nothing


def test_a_cache_filled_before_records_is_listed_and_pruned(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    for v in ("1", "2"):
        publish(store, tmp_path, "tiny", v, files_of(v))
    cache = tmp_path / "cache"
    pull(store, "tiny", "1", cache=cache)
    pull(store, "tiny", "2", cache=cache, to=tmp_path / "serve")
    shutil.rmtree(cache / "records")  # as an older release of the registry left it
    report = PullCache(cache).ls()
    assert sorted((v.model_id, v.version) for v in report.versions) == [
        ("tiny", "1"), ("tiny", "2")]
    assert report.unreferenced_blobs == 0
    r = PullCache(cache).prune(keep_last=1, now=time.time() + 10)
    assert r.blobs_removed == 1  # tiny@1's own.bin; shared blobs stay for tiny@2
    assert len(read_records(Cache(cache))) == 1  # tiny@2 adopted


# == prune ============================================================================


def test_prune_keep_last_removes_older_versions_and_only_their_blobs(
        world: dict[str, Any]) -> None:
    store, cache, serve, ms = world["store"], world["cache"], world["serve"], world["manifests"]
    before = blob_names(cache)
    dry = PullCache(cache).prune(keep_last=1, dry_run=True)
    assert [(p.model_id, p.version) for p in dry.pruned] == [("tiny", "2"), ("tiny", "1")]
    assert blob_names(cache) == before and (cache / "models/tiny/2").is_dir()
    validate(dry.to_dict(), "cache-prune")

    r = Registry(store).cache(cache).prune(keep_last=1)
    validate(r.to_dict(), "cache-prune")
    assert [(p.model_id, p.version, p.reasons) for p in r.pruned] == [
        ("tiny", "2", ("keep-last",)), ("tiny", "1", ("keep-last",))]
    own = {k: next(e for e in m.files if e.path == "own.bin") for k, m in ms.items()}
    # only tiny@1's and @2's own blobs went; everything tiny@3 and other@1 use stays
    assert blob_names(cache) == before - {own[("tiny", "1")].sha256, own[("tiny", "2")].sha256}
    assert r.blobs_removed == 2
    assert r.bytes_freed == own[("tiny", "1")].size + own[("tiny", "2")].size + ms[
        ("tiny", "2")].total_size
    assert r.size_before - r.size_after == r.bytes_freed
    # the in-cache directory is gone, the --to directory is the user's: kept, forgotten
    assert r.pruned[0].removed_dirs == (str(cache / "models/tiny/2"),)
    assert r.pruned[1].forgotten_dirs == (str(serve),)
    assert not (cache / "models/tiny/2").exists() and not list((cache / "trash").iterdir())
    assert verify_directory(open_store(str(serve)), "", full=True).ok
    assert sorted((v.model_id, v.version) for v in PullCache(cache).ls().versions) == [
        ("other", "1"), ("tiny", "3")]
    assert PullCache(cache).ls().size_on_disk == r.size_after
    # what stayed is whole: re-pulls download nothing
    assert pull(store, "tiny", "3", cache=cache).downloaded == 0
    assert pull(store, "other", "1", cache=cache, to=cache.parent / "o").downloaded == 0
    # a pruned version pulled again downloads only its own file
    assert pull(store, "tiny", "2", cache=cache).downloaded == 1
    # the forgotten --to directory is re-hashed, found whole, and not downloaded again
    r1 = pull(store, "tiny", "1", cache=cache, to=serve)
    assert (r1.placed, r1.downloaded) == (False, 0)


def test_prune_older_than_and_max_size(world: dict[str, Any]) -> None:
    cache, ms = world["cache"], world["manifests"]
    age(cache, "tiny", "1", 40 * 86400)
    age(cache, "tiny", "2", 31 * 86400)
    age(cache, "other", "1", 2 * 86400)
    r = PullCache(cache).prune(older_than="30d")
    assert sorted((p.model_id, p.version) for p in r.pruned) == [("tiny", "1"), ("tiny", "2")]
    assert all(p.reasons == ("older-than",) for p in r.pruned)
    # --max-size: least recently pulled first (other@1, 2 days old, before tiny@3)
    left = PullCache(cache).ls()
    need = left.size_on_disk - 1
    r = PullCache(cache).prune(max_size=need)
    assert [(p.model_id, p.version, p.reasons) for p in r.pruned] == [
        ("other", "1", ("max-size",))]
    assert r.max_size_met and r.size_after <= need
    assert PullCache(cache).ls().size_on_disk == r.size_after
    # --keep-last protects from --max-size: nothing fits in 0 bytes, the last one stays
    r = PullCache(cache).prune(max_size=0, keep_last=1)
    assert r.pruned == () and r.max_size_met is False
    r = PullCache(cache).prune(max_size="0")
    assert [(p.model_id, p.version) for p in r.pruned] == [("tiny", "3")]
    assert blob_names(cache) == set() and PullCache(cache).ls().size_on_disk == 0
    assert ms  # every manifest was pulled once


def test_keep_last_and_older_than_together(world: dict[str, Any]) -> None:
    cache = world["cache"]
    for v, days in (("1", 50), ("2", 40), ("3", 35)):
        age(cache, "tiny", v, days * 86400)
    r = PullCache(cache).prune(keep_last=2, older_than=30 * 86400)
    assert [(p.model_id, p.version) for p in r.pruned] == [("tiny", "1")]


def test_unreferenced_blobs_always_go(world: dict[str, Any]) -> None:
    cache = world["cache"]
    stray = cache / "blobs" / "sha256" / ("ab" * 32)
    stray.write_bytes(b"left by a failed pull")
    assert PullCache(cache).ls().unreferenced_blobs == 1
    r = PullCache(cache).prune()
    assert r.pruned == () and r.blobs_removed == 1 and not stray.exists()


def test_cli_prune(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    cache = tmp_path / "cache"
    for v in ("1", "2", "3"):
        publish(store, tmp_path, "tiny", v, files_of(v))
        pull(store, "tiny", v, cache=cache)
    r = run_cli("cache", "prune", "--keep-last", "1", "--dry-run", "--cache", str(cache))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("would prune tiny@2 (last pulled ") and first.endswith(
        f"keep-last); would remove {cache.resolve() / 'models/tiny/2'}")
    assert len(PullCache(cache).ls().versions) == 3
    r = run_cli("cache", "prune", "--keep-last", "1", "--cache", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    validate(doc, "cache-prune")
    assert [p["version"] for p in doc["pruned"]] == ["2", "1"]
    assert [(v.version) for v in PullCache(cache).ls().versions] == ["3"]
    r = run_cli("cache", "prune", "--older-than", "30d", "--cache", str(cache))
    assert r.returncode == 0 and r.stdout == "" and "nothing to prune" in r.stderr


def test_a_duration_needs_a_unit_on_the_command_line(tmp_path: Path) -> None:
    """``--older-than 5`` is refused (exit 2, one line: give a unit), nothing
    pruned: a bare number reads as seconds to some and as days (``find -mtime``)
    to others (docs/decisions.md). The Python API keeps numbers as seconds."""
    store = open_store(str(tmp_path / "store"))
    cache = tmp_path / "cache"
    publish(store, tmp_path, "tiny", "1", files_of("1"))
    pull(store, "tiny", "1", cache=cache)
    age(cache, "tiny", "1", 10 * 86400)
    blobs = blob_names(cache)
    for cmd in (["cache", "prune", "--cache", str(cache)], ["gc", "--store", str(tmp_path / "store")]):
        r = run_cli(*cmd, "--older-than", "5")
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert r.stderr.strip() == "error: --older-than '5': give a unit (s, m, h, d, w), " \
                                   "e.g. 5s or 5d", r.stderr
    assert [v.version for v in PullCache(cache).ls().versions] == ["1"]
    assert blob_names(cache) == blobs
    with pytest.raises(UsageError, match="older_than '5': give a unit"):
        PullCache(cache).prune(older_than="5")
    assert parse_duration("2w") == 14 * 86400
    r = run_cli("cache", "prune", "--older-than", "2w", "--cache", str(cache))
    assert r.returncode == 0 and "nothing to prune" in r.stderr, r.stderr  # 10 days < 2 weeks
    r = PullCache(cache).prune(older_than=9 * 86400, dry_run=True)  # a number: seconds
    assert [p.version for p in r.pruned] == ["1"]
    r = run_cli("cache", "prune", "--older-than", "5d", "--cache", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    assert [p["version"] for p in json.loads(r.stdout)["pruned"]] == ["1"]
    assert not PullCache(cache).ls().versions


@pytest.mark.parametrize(("text", "value"), [("50G", 50 * 1024 ** 3), ("512M", 512 * 1024 ** 2),
                                             ("1.5T", int(1.5 * 1024 ** 4)), ("10GiB", 10 << 30),
                                             ("2kb", 2048), ("123", 123)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


def test_a_leased_version_is_skipped_and_a_dead_lease_protects_nothing(
        world: dict[str, Any]) -> None:
    cache, ms = world["cache"], world["manifests"]
    c = Cache(cache)
    with pulling(c, ms[("tiny", "2")]):
        # the in-progress pull shows in ls, and prune leaves it and its blobs alone
        assert [v.in_use for v in PullCache(cache).ls().versions] == [False, False, True, False]
        r = PullCache(cache).prune(keep_last=0)
        assert r.skipped_in_use == ("tiny@2",)
        assert {e.sha256 for e in ms[("tiny", "2")].files} <= blob_names(cache)
        assert (cache / "models/tiny/2").is_dir()
    assert not list((cache / "leases").iterdir())  # given up when the pull ends
    # a lease left by a killed pull (its pid is gone) protects nothing and is removed
    dead = python_run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lease = cache / "leases" / f"pid{dead}.abc.json"
    lease.write_text(json.dumps({"pid": int(dead), "model_id": "tiny", "version": "2",
                                 "manifest_sha256": ms[("tiny", "2")].digest,
                                 "blobs": sorted(e.sha256 for e in ms[("tiny", "2")].files)}))
    r = PullCache(cache).prune(keep_last=0)
    assert [(p.model_id, p.version) for p in r.pruned] == [("tiny", "2")]
    assert blob_names(cache) == set() and not lease.exists()


# == prune beside concurrent pulls (real processes) ===================================


def test_prune_never_takes_a_blob_from_a_pull_in_progress(tmp_path: Path) -> None:
    """2 processes pull 4 versions (sharing blobs) round after round into one
    cache while a third prunes everything it may, as fast as it can; every
    pull must succeed and verify."""
    store_url = str(tmp_path / "store")
    store = open_store(store_url)
    versions = [str(i) for i in range(4)]
    for v in versions:
        publish(store, tmp_path, "tiny", v, files_of(v, size=40_000))
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    stop = tmp_path / "stop"
    pruner = python_popen([sys.executable, str(CHILD), "prune", str(cache), str(stop)],
                              env=env, stdout=subprocess.PIPE, text=True)
    pullers = [python_popen([sys.executable, str(CHILD), "pull", store_url, str(cache),
                                 str(tmp_path / f"serve-{i}"), "6", *versions],
                                env=env, stdout=subprocess.PIPE, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in pullers]
    finally:
        stop.touch()
        prunes = pruner.communicate(timeout=60)[0]
    lines = [json.loads(x) for out in outs for x in out.splitlines()]
    failures = [x for x in lines if not x["ok"]]
    assert failures == [] and len(lines) == 2 * 6 * len(versions)
    assert all(p.returncode == 0 for p in pullers)
    summary_ = json.loads(prunes.splitlines()[-1])
    assert pruner.returncode == 0 and summary_["prunes"] >= 3
    # the prunes did remove things while pulls ran (else the race was not exercised)
    assert summary_["pruned_versions"] > 0 and summary_["blobs_removed"] > 0
    final = PullCache(cache).prune(keep_last=0)
    assert final.skipped_in_use == () and blob_names(cache) == set()


# == verify ===========================================================================


def test_verify_removes_and_reports_a_bad_blob(durable_store_url: str, tmp_path: Path) -> None:
    store = open_store(durable_store_url)
    ms = {v: publish(store, tmp_path, "tiny", v, files_of(v)) for v in ("1", "2")}
    cache = tmp_path / "cache"
    for v in ms:
        pull(store, "tiny", v, cache=cache)
    ok = PullCache(cache).verify()
    assert ok.ok and ok.blobs == len(blob_names(cache)) == 4
    assert ok.bytes == on_disk_blob_bytes(cache)
    shared = next(e for e in ms["1"].files if e.path == "shared.bin")
    blob = cache / "blobs" / "sha256" / shared.sha256
    blob.chmod(0o644)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 1
    blob.write_bytes(bytes(data))
    r = run_cli("cache", "verify", "--cache", str(cache), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    validate(doc, "cache-verify")
    err = json.loads(r.stderr)
    assert err["error"]["exit_code"] == 1 and "1 blob did not verify" in err["error"]["message"]
    assert doc["bad"] == [{"sha256": shared.sha256, "size": shared.size,
                           "actual_sha256": hashlib.sha256(bytes(data)).hexdigest(),
                           "used_by": ["tiny@2", "tiny@1"], "removed": True}]
    assert not blob.exists() and len(blob_names(cache)) == 3
    ls = PullCache(cache).ls()
    assert [v.missing_blobs for v in ls.versions] == [1, 1]
    # the next pull downloads it again; verify is then clean (text mode)
    r2 = pull(store, "tiny", "1", cache=cache, to=tmp_path / "again")
    assert r2.downloaded == 1 and blob.exists()
    r = run_cli("cache", "verify", "--cache", str(cache), "--workers", "2")
    assert r.returncode == 0 and r.stdout.startswith(f"OK {cache.resolve()}: 4 blobs"), r.stderr


def _pulled_with_bad_blob(tmp_path: Path,
                          content: bytes) -> tuple[Path, Manifest, FileEntry, Path]:
    """tiny@1 published to a local store and pulled into ``tmp_path/cache``,
    then the blob of its own.bin overwritten with ``content``: (cache,
    manifest, own.bin's entry, the blob's path)."""
    store = open_store(str(tmp_path / "store"))
    m = publish(store, tmp_path, "tiny", "1", files_of("1"))
    cache = tmp_path / "cache"
    pull(store, "tiny", "1", cache=cache)
    own = next(e for e in m.files if e.path == "own.bin")
    blob = cache / "blobs" / "sha256" / own.sha256
    blob.chmod(0o644)
    blob.write_bytes(content)
    return cache, m, own, blob


def test_cli_verify_text_names_the_bad_blob(tmp_path: Path) -> None:
    cache, m, own, blob = _pulled_with_bad_blob(tmp_path, b"truncated")
    r = run_cli("cache", "verify", "--cache", str(cache))
    assert r.returncode == 1
    assert r.stdout.startswith(f"BAD blobs/sha256/{own.sha256}: 9 bytes hash to ")
    assert "(used by tiny@1); removed" in r.stdout
    assert r.stderr.startswith("error: ") and "1 blob did not verify (1 removed)" in r.stderr


def test_verify_leaves_a_bad_blob_a_pull_in_progress_uses(tmp_path: Path) -> None:
    cache, m, own, blob = _pulled_with_bad_blob(tmp_path, b"rotten")
    with pulling(Cache(cache), m):
        r = PullCache(cache).verify()
        assert [(b.sha256, b.removed) for b in r.bad] == [(own.sha256, False)]
        assert blob.exists()  # that pull hashes what it places and replaces it itself
    r = PullCache(cache).verify()
    assert [(b.sha256, b.removed) for b in r.bad] == [(own.sha256, True)]
    assert not blob.exists() and PullCache(cache).verify().ok


def test_a_killed_pulls_partial_download_is_counted_and_freed(world: dict[str, Any]) -> None:
    """A pull SIGKILLed mid-file leaves ``tmp/<sha>.pid<dead>.<rand>.incomplete``:
    ``ls`` counts it in the size on disk, and ``prune`` removes it and counts it
    in the bytes freed (found by a break-test: ls said 11.8K beside 71M)."""
    cache = world["cache"]
    dead = python_run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    partial = cache / "tmp" / f"{'ab' * 32}.pid{dead}.0123456789ab.incomplete"
    partial.write_bytes(b"\0" * 100_000)
    before = PullCache(cache).ls()
    assert before.partial_bytes == 100_000
    assert before.size_on_disk == before.blob_bytes + before.materialized_bytes + 100_000
    assert before.to_dict()["totals"]["partial_bytes"] == 100_000
    r = PullCache(cache).prune()
    assert not partial.exists()
    assert r.bytes_freed >= 100_000 and r.size_before - r.bytes_freed == r.size_after
    after = PullCache(cache).ls()
    assert after.partial_bytes == 0 and after.size_on_disk == r.size_after
