"""The pull cache is private (issue 29 items 4 and 6): real pulls, real prunes.

* Created ``0700`` (files ``0600``) under ``umask 000``; with
  ``REGISTRY_CACHE_GROUP`` the group reads (``02750``/``0640``), never writes.
* A cache (or one of its folders) that another user (``nobody``) owns or that
  is group/other-writable is refused, one line naming it, exit 6.
* A blob another user owns or may write, or that is not a regular file (a
  folder, a link to a secret, a FIFO), is never used: pull downloads it
  again, over it; ``cache verify`` reports it.
* A signed pull re-hashes every blob it did not download itself: a blob of the
  right name and wrong bytes with a matching (forged) stamp is not placed.
* Records are untrusted input: a forged record naming ``models/../..`` or a
  linked ``models/evil -> <victim>`` directory, or a blob ``../../x``, makes
  ``cache prune`` delete nothing outside the cache.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from registry.pull import pull
from registry.pull.cache import Cache
from registry.pull.stamps import stamp
from registry.store import Store, open_store
from tests.conftest import run_cli
from tests.support.attacker import NOBODY, as_nobody, require_other_user, shared_dir, victim_files
from tests.test_pull import publish, release_files
from tests.support.forkclient import python_run


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _pull_umask0(store: str, cache: Path, to: Path, *env: str) -> subprocess.CompletedProcess[str]:
    script = ("import os, sys, runpy; os.umask(0); sys.argv = ['registry', *sys.argv[1:]]; "
              "runpy.run_module('registry', run_name='__main__')")
    e = dict(os.environ)
    for kv in env:
        k, _, v = kv.partition("=")
        e[k] = v
    return python_run([sys.executable, "-c", script, "pull", "tiny@1", "--store", store,
                           "--cache", str(cache), "--to", str(to), "--quiet"],
                          capture_output=True, text=True, env=e, timeout=300)


@pytest.mark.parametrize("group", [None, "nogroup"])
def test_a_cache_made_under_umask_000_is_private(tmp_path: Path, group: str | None) -> None:
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    env = [f"REGISTRY_CACHE_GROUP={group}"] if group else []
    p = _pull_umask0(str(tmp_path / "store"), cache, tmp_path / "out", *env)
    assert p.returncode == 0, p.stderr
    want_dir, want_file = (0o2750, 0o640) if group else (0o700, 0o600)
    dirs = [cache, *(p for p in cache.rglob("*") if p.is_dir() and p.parent.name != "trash")]
    assert len(dirs) >= 6
    for d in dirs:
        if d.is_relative_to(cache / "models"):
            continue  # materialized model directories are the release's, not the cache's
        assert _mode(d) == want_dir, (d, oct(_mode(d)))
        if group:
            assert os.lstat(d).st_gid == grp.getgrnam(group).gr_gid, d
    files = [f for f in cache.rglob("*") if f.is_file() and not f.is_relative_to(cache / "models")]
    records = [f for f in files if "records" in f.parts or "stamps" in f.parts]
    assert records, files
    for f in records:
        assert _mode(f) == want_file, (f, oct(_mode(f)))
    for f in files:
        assert not _mode(f) & 0o022, (f, oct(_mode(f)))


def test_a_cache_another_user_can_write_is_refused(tmp_path: Path) -> None:
    require_other_user()
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1", release_files())
    cache = tmp_path / "cache"
    p = run_cli("pull", "tiny@1", "--store", str(tmp_path / "store"), "--cache", str(cache),
                "--to", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 0, p.stderr
    for path, change, why in (
            (cache, lambda q: os.chmod(q, 0o777), "writable by other users (mode 0777)"),
            (cache / "blobs" / "sha256", lambda q: os.chmod(q, 0o770),
             "writable by its group (mode 0770)"),
            (cache / "records", lambda q: os.chown(q, NOBODY, NOBODY),
             f"owned by uid {NOBODY} (not this user, uid 0, nor root)")):
        before = os.lstat(path)
        change(path)
        try:
            p = run_cli("pull", "tiny@1", "--store", str(tmp_path / "store"), "--cache",
                        str(cache), "--to", str(tmp_path / "out2"), "--quiet")
            assert p.returncode == 6, (path, p.returncode, p.stderr)
            assert p.stderr == (f"error: {path}: {why}; the pull cache must be private to its "
                                "user, as ssh refuses a key file (chown it to yourself and chmod "
                                "700 it, or remove it; REGISTRY_CACHE_GROUP lets a group read "
                                "it)\n"), p.stderr
            assert not (tmp_path / "out2").exists()
        finally:
            os.chmod(path, stat.S_IMODE(before.st_mode))
            os.chown(path, before.st_uid, before.st_gid)


def _bad_blob(kind: str, blob: Path, home: Path) -> None:
    """Make the cache blob ``blob`` something a pull must not use."""
    blob.chmod(0o644)
    blob.unlink()
    if kind == "directory":
        blob.mkdir()
        (blob / "x").write_bytes(b"x")
    elif kind == "link":
        os.symlink(home / "secret", blob)
    elif kind == "fifo":
        os.mkfifo(blob)
    elif kind == "other-user":
        blob.write_bytes(b"planted bytes\n")
        os.chown(blob, NOBODY, NOBODY)
        os.chmod(blob, 0o444)
    elif kind == "group-writable":
        blob.write_bytes(b"planted bytes\n")
        os.chmod(blob, 0o664)
    if kind in ("other-user", "group-writable"):
        # a forged stamp matching it, so a pull that trusted stamps would place it unread
        rec = blob.parent.parent.parent / "stamps" / "blobs" / blob.name
        rec.write_text(json.dumps(list(stamp(blob))))


@pytest.mark.parametrize("kind", ["directory", "link", "fifo", "other-user", "group-writable"])
def test_an_unusable_blob_is_reported_by_verify_and_repaired_by_pull(kind: str,
                                                                     tmp_path: Path) -> None:
    require_other_user()
    files = release_files()
    with victim_files() as home:
        store = open_store(str(tmp_path / "store"))
        publish(store, tmp_path, "1", files)
        cache = tmp_path / "cache"
        common = ["--store", str(tmp_path / "store"), "--cache", str(cache), "--quiet"]
        assert run_cli("pull", "tiny@1", "--to", str(tmp_path / "o1"), *common).returncode == 0
        digest = hashlib.sha256(files["data/b.bin"]).hexdigest()
        blob = cache / "blobs" / "sha256" / digest
        _bad_blob(kind, blob, home)
        p = run_cli("cache", "verify", "--cache", str(cache), "--json")
        assert p.returncode != 0, (p.stdout, p.stderr)
        bad = json.loads(p.stdout)["bad"]
        assert [b["sha256"] for b in bad] == [digest] and bad[0]["actual_sha256"] is None, bad
        assert bad[0]["removed"] and not os.path.lexists(blob)
        _bad_blob(kind, Path(str(blob)) if os.path.lexists(blob) else _fresh(blob), home)
        p = run_cli("pull", "tiny@1", "--to", str(tmp_path / "o2"), *common)
        assert p.returncode == 0, p.stderr
        assert (tmp_path / "o2" / "data" / "b.bin").read_bytes() == files["data/b.bin"]
        st = os.lstat(blob)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
        assert blob.read_bytes() == files["data/b.bin"]  # repaired in the cache too


def _fresh(blob: Path) -> Path:
    """Put a regular file back at ``blob`` (so _bad_blob can replace it)."""
    blob.write_bytes(b"placeholder")
    return blob


def test_a_signed_pull_rehashes_blobs_it_did_not_download(tmp_path: Path) -> None:
    """A blob with the right name, wrong bytes and a stamp recomputed to match
    (what a process with the cache user's rights could leave): an unsigned
    pull trusts the stamp (it checks the manifest, not who wrote the cache),
    a signed pull re-hashes it, drops it and downloads the real bytes."""
    pytest.importorskip("model_signing")
    from tests.test_signing import keypair
    from registry.release import ModelRelease
    from registry.trust import load_trust
    from tests.release_util import ledger_row, summary

    (tmp_path / "keys").mkdir()
    priv, pub = keypair(tmp_path, "release")
    files = release_files()
    src = tmp_path / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    store = open_store(str(tmp_path / "store"))
    ModelRelease(store).publish(src, "tiny", "1", ledger=[ledger_row()], eval_summary=summary(),
                                sign_key=priv)
    cache = tmp_path / "cache"
    pull(store, "tiny", "1", to=tmp_path / "o1", cache=cache, trust=load_trust([pub]))
    digest = hashlib.sha256(files["data/b.bin"]).hexdigest()
    blob = cache / "blobs" / "sha256" / digest
    blob.chmod(0o644)
    blob.write_bytes(b"P" * len(files["data/b.bin"]))  # same size, other bytes
    blob.chmod(0o444)
    rec = cache / "stamps" / "blobs" / digest
    rec.unlink()
    fd = os.open(rec, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, json.dumps(list(stamp(blob))).encode())
    os.close(fd)
    p = run_cli("pull", "tiny@1", "--store", str(tmp_path / "store"), "--cache", str(cache),
                "--to", str(tmp_path / "o2"), "--trusted-key", str(pub), "--quiet")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "o2" / "data" / "b.bin").read_bytes() == files["data/b.bin"]
    assert blob.read_bytes() == files["data/b.bin"]


def _forge_record(cache: Path, targets: list[str], *, blob: str | None = None) -> None:
    digest = hashlib.sha256(b"forged").hexdigest()
    doc = {"model_id": "evil", "version": "1", "manifest_sha256": digest,
           "files": [{"path": "x", "size": 1, "sha256": blob or digest}],
           "first_pulled": "2020-01-01T00:00:00Z", "last_pulled": "2020-01-01T00:00:00Z",
           "targets": targets}
    path = cache / "records" / f"{digest}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, json.dumps(doc).encode())
    os.close(fd)


@pytest.mark.parametrize("kind", ["dotdot", "linked-models-dir", "prefix-sibling",
                                  "blob-dotdot", "planted-by-nobody"])
def test_cache_prune_deletes_nothing_a_forged_record_names_outside_the_cache(
        kind: str, tmp_path: Path) -> None:
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        store = open_store(str(tmp_path / "store"))
        publish(store, tmp_path, "1", release_files())
        cache = d / "cache"
        p = run_cli("pull", "tiny@1", "--store", str(tmp_path / "store"), "--cache", str(cache),
                    "--quiet")
        assert p.returncode == 0, p.stderr
        victim = home / "projects"
        models = cache / "models"
        if kind == "dotdot":
            _forge_record(cache, [f"{models}/../../../{victim.relative_to('/')}"])
            _forge_record(cache, [str(models) + "/" + os.path.relpath(victim, models)])
        elif kind == "linked-models-dir":
            os.symlink(home, models / "evil")
            _forge_record(cache, [str(models / "evil" / "projects")])
        elif kind == "prefix-sibling":
            sibling = Path(str(models) + "-x")
            os.symlink(victim, sibling)
            _forge_record(cache, [str(sibling)])
        elif kind == "blob-dotdot":
            _forge_record(cache, [], blob="../../../../" + str(victim / "keep" / "notes.txt"))
        else:  # nobody drops a record into a records/ folder it was given once
            os.chmod(cache, 0o711)  # traversable (as an older cache was), not listable
            os.chmod(cache / "records", 0o777)
            digest = hashlib.sha256(b"forged").hexdigest()
            doc = {"model_id": "evil", "version": "1", "manifest_sha256": digest, "files": [],
                   "first_pulled": "2020-01-01T00:00:00Z",
                   "last_pulled": "2020-01-01T00:00:00Z", "targets": [str(victim)]}
            as_nobody(sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                      str(cache / "records" / f"{digest}.json"), json.dumps(doc))
        p = run_cli("cache", "prune", "--cache", str(cache), "--keep-last", "0", "--json")
        if kind == "planted-by-nobody":
            assert p.returncode == 6 and "records: writable by other users" in p.stderr, p.stderr
            os.chmod(cache / "records", 0o700)
            p = run_cli("cache", "prune", "--cache", str(cache), "--keep-last", "0", "--json")
        assert p.returncode == 0, p.stderr
        assert (victim / "keep" / "notes.txt").read_text() == "mine\n"
        assert (home / "secret").exists()
