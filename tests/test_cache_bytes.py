"""A cache decision never rests on a stat alone (issue 47).

The stat stamp of a blob or a placed file can stay the same while its bytes
change (a reflinked extent rewritten beneath the file, a filesystem that
keeps or caches ctime, a stamp record that a crashed tool wrote after the
change). The tests change the bytes and then make the recorded stamp match
the file again, which is what such a filesystem shows the registry. Inputs:
a byte flipped in the middle, the first bytes zeroed; a blob placed by copy
and by reflink; a placed directory re-pulled. By default every placement
re-hashes and a changed blob is downloaded again; ``REGISTRY_CACHE_TRUST_STAMPS=1``
(the documented opt-out) places it unread, and bad values are refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from registry.errors import UsageError
from registry.protocol.manifest import Manifest
from registry.pull import pull
from registry.pull.cache import Cache, trust_stamps
from registry.pull.stamps import stamp
from registry.store import Store, open_store
from tests.conftest import run_cli
from tests.test_pull import (
    MODEL,
    assert_clean,
    assert_pulled,
    fake_reflink,
    materialize,
    publish,
    release_files,
    stored,
)


def _flip_middle(data: bytearray) -> None:
    data[len(data) // 2] ^= 0x40


def _zero_head(data: bytearray) -> None:
    data[:16] = bytes(16)


EDITS: dict[str, Callable[[bytearray], None]] = {"flip-middle": _flip_middle,
                                                  "zero-head": _zero_head}


def _edit_keeping_stamp(path: Path, edit: Callable[[bytearray], None],
                        record: Path | None = None) -> None:
    """Rewrite ``path``'s bytes (same size), then make the stamp the cache
    recorded for it equal the file's stamp now (what a filesystem that keeps
    the stat shows)."""
    mode = path.stat().st_mode
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    edit(data)
    with open(path, "r+b") as f:
        f.write(data)
    path.chmod(mode & 0o777)
    if record is not None:
        record.write_text(json.dumps(list(stamp(path))))


def _forge_dir_record(cache: Path, target: Path) -> None:
    """Set every stamp of ``target``'s placed-directory record to the files' stamps now."""
    for rec in (cache / "stamps" / "dirs").glob("*.json"):
        doc = json.loads(rec.read_text())
        if doc["target"] == str(target):
            doc["files"] = {p: list(stamp(target / p)) for p in doc["files"]}
            rec.write_text(json.dumps(doc))


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    from tests.conftest import make_store_url

    return open_store(make_store_url(request.param, request, tmp_path))


def _cached_then_edited(store: Store, m: Manifest, tmp_path: Path, name: str,
                        edit: Callable[[bytearray], None]) -> Path:
    """MODEL@1 (manifest ``m``) pulled to tmp_path/a through a new cache, then
    its blob of ``name`` edited in the cache, its stamp kept; the cache."""
    cache = tmp_path / "cache"
    pull(store, MODEL, "1", to=tmp_path / "a", cache=cache)
    entry = m.entry(name)
    assert entry is not None
    blob = cache / "blobs" / "sha256" / entry.sha256
    _edit_keeping_stamp(blob, edit, cache / "stamps" / "blobs" / entry.sha256)
    return cache


@pytest.mark.parametrize(("edit", "how"), [("flip-middle", "copy"), ("zero-head", "reflink"),
                                           ("zero-head", "copy"), ("flip-middle", "reflink")])
def test_a_blob_changed_under_an_unchanged_stamp_is_never_placed(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str,
        how: str) -> None:
    m = publish(store, tmp_path, "1", release_files())
    if how == "reflink":
        fake_reflink(monkeypatch)
    else:
        monkeypatch.setattr(materialize, "reflink", lambda src, dst: False)
    cache = _cached_then_edited(store, m, tmp_path, "model.safetensors", EDITS[edit])
    r = pull(store, MODEL, "1", to=tmp_path / "b", cache=cache)
    assert r.downloaded == 1  # the changed blob was refused and fetched again
    assert_pulled(tmp_path / "b", store, "1", cache)
    assert_clean(cache, tmp_path / "b")


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_placed_file_changed_under_an_unchanged_stamp_is_seen_on_re_pull(
        store: Store, tmp_path: Path, edit: str) -> None:
    publish(store, tmp_path, "1", release_files())
    cache, target = tmp_path / "cache", tmp_path / "t"
    pull(store, MODEL, "1", to=target, cache=cache)
    _edit_keeping_stamp(target / "config.json", EDITS[edit])
    _forge_dir_record(cache, target)
    r = pull(store, MODEL, "1", to=target, cache=cache, force=True)
    assert r.placed  # re-hashed, found changed, placed again
    assert (target / "config.json").read_bytes() == stored(store, "1")["config.json"]


def test_trusting_stamps_is_the_operators_choice(store: Store, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """With REGISTRY_CACHE_TRUST_STAMPS=1 the stamp decides (the cost the
    default pays is one read of each placed blob); bad values are refused
    naming the variable, by the API and by the CLI (exit 2)."""
    m = publish(store, tmp_path, "1", release_files())
    monkeypatch.setattr(materialize, "reflink", lambda src, dst: False)
    cache = _cached_then_edited(store, m, tmp_path, "config.json", _flip_middle)
    monkeypatch.setenv("REGISTRY_CACHE_TRUST_STAMPS", "1")
    assert trust_stamps() and Cache(cache).trust_stamps
    r = pull(store, MODEL, "1", to=tmp_path / "b", cache=cache)
    assert r.downloaded == 0  # trusted: placed unread, as documented
    for bad in ("yes", "2"):
        monkeypatch.setenv("REGISTRY_CACHE_TRUST_STAMPS", bad)
        with pytest.raises(UsageError, match="REGISTRY_CACHE_TRUST_STAMPS"):
            Cache(cache)
    p = run_cli("pull", f"{MODEL}@1", "--to", str(tmp_path / "c"), "--store", store.url,
                "--cache", str(cache), env={"REGISTRY_CACHE_TRUST_STAMPS": "maybe"})
    assert p.returncode == 2 and "REGISTRY_CACHE_TRUST_STAMPS" in p.stderr
    assert "Traceback" not in p.stderr
