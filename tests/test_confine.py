"""Nothing outside its root (issue 29, items 1 and 6): the store is untrusted input.

The attacker is another uid (``nobody``, through ``setpriv``) with write access
to the store folder, as a bucket or NFS writer has; the victim is root running
``registry gc``, ``pull`` or ``serve``. Each test runs the real command and
checks what is left on disk: the victim's files untouched, nothing of them
copied or shown, one clear line naming the entry.

* ``gc`` meets links where folders should be (``models/evil``,
  ``runs/r/ckpt``, a version directory), links, FIFOs and sockets inside a
  staging directory it deletes, and a mount point inside one (a private
  mount namespace): it removes links as links, never follows one, never
  enters the mount, and says what it skipped.
* ``pull`` of a release whose file, folder or MANIFEST.json is a link to a
  root-only file (whose digest the attacker knows), or a FIFO: refused
  naming the entry, nothing placed, the secret nowhere in the target or the
  cache; with blobs and without (a local store's one-write path).
* ``serve`` of a release whose MODEL_CARD.md links to the server's own
  ``--token-file``: the token is not shown.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from registry.errors import UnsafeEntryError
from registry.protocol.manifest import MANIFEST
from registry.release import ModelRelease, release_prefix
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.support.attacker import as_nobody, give, require_other_user, shared_dir, victim_files
from tests.test_pull import release_files

SECRET = b"root-only secret\n"


def _assert_one_line(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


# -- gc ----------------------------------------------------------------------------------


def _plant_gc_links(store: Path, home: Path) -> None:
    projects = str(home / "projects")
    for d in ("models/m/2.tmp-abc/sub", "runs/r", "runs/s/ckpt/step-000001.tmp"):
        as_nobody("mkdir", "-p", str(store / d))
    as_nobody("ln", "-s", projects, str(store / "models" / "evil"))
    as_nobody("ln", "-s", projects, str(store / "runs" / "r" / "ckpt"))
    as_nobody("ln", "-s", projects, str(store / "models" / "m" / "1"))
    staging = store / "models" / "m" / "2.tmp-abc"
    as_nobody("ln", "-s", projects, str(staging / "inner"))
    as_nobody("ln", "-s", str(home / "projects" / "keep" / "notes.txt"), str(staging / "f"))
    as_nobody("ln", "-s", projects, str(staging / "sub" / "deeper"))
    as_nobody("mkfifo", str(staging / "fifo"))
    as_nobody("ln", "-s", projects, str(store / "runs" / "s" / "ckpt" / "step-000001.tmp" / "x"))
    as_nobody("/usr/bin/python3", "-c", "import socket,sys; s=socket.socket(socket.AF_UNIX); "
              "s.bind(sys.argv[1])", str(staging / "sock"))


@pytest.mark.parametrize("dry_run", [True, False])
def test_gc_never_deletes_or_lists_through_a_writers_links(dry_run: bool) -> None:
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        store = d / "store"
        (store / "models").mkdir(parents=True)
        (store / "runs").mkdir()
        give(store)
        _plant_gc_links(store, home)
        p = run_cli("gc", "--store", str(store), "--older-than", "0s", "--json",
                    *(["--dry-run"] if dry_run else []))
        assert p.returncode == 0, (p.stdout, p.stderr)
        doc = json.loads(p.stdout)
        removed = json.dumps(doc["removed"])
        assert "keep" not in removed and "evil" not in removed, removed
        assert (home / "projects" / "keep" / "notes.txt").read_text() == "mine\n"
        skipped = "\n".join(doc["skipped"])
        for entry in ("models/evil", "runs/r/ckpt", "models/m/1"):
            assert f"{entry}: a symbolic link to {home}/projects" in skipped, skipped
        assert (store / "models" / "evil").is_symlink()
        staging = store / "models" / "m" / "2.tmp-abc"
        if dry_run:
            assert (staging / "inner").is_symlink() and (staging / "fifo").exists()
        else:
            # the staging directory went, its links and special files as themselves
            assert not os.path.lexists(staging)
            assert not os.path.lexists(store / "runs" / "s" / "ckpt" / "step-000001.tmp")


def test_gc_never_crosses_a_mount_inside_the_store(tmp_path: Path) -> None:
    """A mount point inside a staging directory (a bind mount of the victim's
    projects, in a private mount namespace): gc refuses to enter it, one line,
    and nothing under it is deleted."""
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        store = d / "store"
        mnt = store / "models" / "m" / "3.tmp-mnt" / "mnt"
        mnt.mkdir(parents=True)
        (mnt.parent / "old.bin").write_bytes(b"x")
        script = (f"mount --bind {home / 'projects'} {mnt} && exec {sys.executable} -m "
                  f"registry gc --store {store} --older-than 0s")
        p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                           capture_output=True, text=True, timeout=120)
        if "mount:" in p.stderr and "permission denied" in p.stderr.lower():
            pytest.skip("no mount namespaces here")
        _assert_one_line(p, 6, "3.tmp-mnt/mnt: a mount point", "never crosses a mount")
        assert (home / "projects" / "keep" / "notes.txt").read_text() == "mine\n"


# -- pull ----------------------------------------------------------------------------------


def _release_with_secret(store: Path, work: Path) -> Path:
    """Release tiny@1 whose data/b.bin holds the secret's bytes (the attacker
    knows its digest); returns the stored file's path."""
    files = release_files()
    files["data/b.bin"] = SECRET
    src = work / "src"
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    ModelRelease(open_store(str(store))).publish(src, "tiny", "1", ledger=[ledger_row()],
                                                 eval_summary=summary())
    return store / release_prefix("tiny", "1") / "data" / "b.bin"


def _attack(kind: str, stored: Path, home: Path) -> str:
    """Replace part of the stored release as nobody; returns the entry named."""
    secret = str(home / "secret")
    if kind == "file-link":
        as_nobody("rm", str(stored))
        as_nobody("ln", "-s", secret, str(stored))
        return "data/b.bin: a symbolic link to"
    if kind == "dir-link":
        # a folder of the victim's holding the same names
        evil = home / "evil-data"
        evil.mkdir()
        evil.rmdir()
        shutil.copytree(stored.parent, evil)
        os.chmod(evil, 0o700)
        as_nobody("rm", "-r", str(stored.parent))
        as_nobody("ln", "-s", str(evil), str(stored.parent))
        return "1/data: a symbolic link to"
    if kind == "manifest-link":
        manifest = stored.parent.parent / MANIFEST
        copy = home / "manifest-copy.json"
        copy.write_bytes(manifest.read_bytes())
        os.chmod(copy, 0o600)
        as_nobody("rm", str(manifest))
        as_nobody("ln", "-s", str(copy), str(manifest))
        return "MANIFEST.json: a symbolic link to"
    assert kind == "fifo"
    as_nobody("rm", str(stored))
    as_nobody("mkfifo", str(stored))
    return "data/b.bin: a FIFO"


@pytest.mark.parametrize("blobs", ["always", "never"])
@pytest.mark.parametrize("kind", ["file-link", "dir-link", "manifest-link", "fifo"])
def test_pull_refuses_a_store_entry_that_is_a_link_or_special(kind: str, blobs: str,
                                                              tmp_path: Path) -> None:
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        store = d / "store"
        stored = _release_with_secret(store, tmp_path)
        give(store)
        needle = _attack(kind, stored, home)
        target, cache = tmp_path / "target", tmp_path / "cache"
        p = run_cli("pull", "tiny@1", "--store", str(store), "--to", str(target),
                    "--cache", str(cache), env={"REGISTRY_PULL_BLOBS": blobs})
        _assert_one_line(p, 6, needle)
        assert not target.exists()
        for dirpath, _dirs, names in [*os.walk(target), *os.walk(cache)]:
            for n in names:
                path = os.path.join(dirpath, n)
                if os.path.isfile(path) and not os.path.islink(path):
                    with open(path, "rb") as f:
                        assert SECRET not in f.read(), path


def test_verify_and_index_rebuild_refuse_a_linked_release_file(tmp_path: Path) -> None:
    require_other_user()
    with shared_dir() as d, victim_files() as home:
        store = d / "store"
        stored = _release_with_secret(store, tmp_path)
        give(store)
        _attack("file-link", stored, home)
        p = run_cli("verify", str(store / release_prefix("tiny", "1")), "--full")
        assert p.returncode != 0 and "a symbolic link" in (p.stdout + p.stderr), p
        p = run_cli("index", "rebuild", "--store", str(store), "--db",
                    f"sqlite:///{tmp_path / 'r.db'}")
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith("1 models, 0 releases"), p.stdout
        assert "models/tiny/1/data/b.bin: a symbolic link to" in p.stderr, p.stderr


# -- serve ---------------------------------------------------------------------------------


def test_serve_never_shows_a_card_that_links_to_its_token_file(tmp_path: Path) -> None:
    require_other_user()
    from tests.web_util import serve

    with shared_dir() as d:
        store, db = d / "store", f"sqlite:///{tmp_path / 'r.db'}"
        src = tmp_path / "src"
        for rel, data in release_files().items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes(data)
        ledger, evals = tmp_path / "ledger.json", tmp_path / "evals.json"
        ledger.write_text(json.dumps([ledger_row()]))
        evals.write_text(json.dumps(summary()))
        p = run_cli("publish", str(src), "--model-id", "tiny", "--version", "1", "--ledger",
                    str(ledger), "--evals", str(evals), "--store", str(store), "--db", db)
        assert p.returncode == 0, p.stderr
        token = tmp_path / "token"
        token.write_text("s3cr3t-token-value\n")
        os.chmod(token, 0o600)
        give(store)
        card = store / release_prefix("tiny", "1") / "MODEL_CARD.md"
        as_nobody("rm", str(card))
        as_nobody("ln", "-s", str(token), str(card))
        with serve(str(store), db, "--token-file", str(token)) as base:
            req = urllib.request.Request(f"{base}/models/tiny/1",
                                         headers={"Authorization": "Bearer s3cr3t-token-value"})
            try:
                body = urllib.request.urlopen(req, timeout=30).read().decode()
            except urllib.error.HTTPError as e:
                body = e.read().decode()
        assert "s3cr3t-token-value" not in body
        assert "symbolic link" in body, body[:2000]


# -- keys ----------------------------------------------------------------------------------


def test_a_local_store_refuses_special_files_by_every_primitive(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "d").mkdir(parents=True)
    os.mkfifo(root / "d" / "fifo")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "d" / "sock"))
    os.symlink("/etc/hostname", root / "d" / "link")
    os.symlink("/etc", root / "etc")
    store = open_store(str(root))
    for name, what in (("d/fifo", "a FIFO"), ("d/sock", "a socket"),
                       ("d/link", "a symbolic link to /etc/hostname"),
                       ("etc/hostname", "etc: a symbolic link to /etc")):
        for op in (store.read_bytes, store.info, store.local_path,
                   lambda k: store.write_bytes(k, b"x"), lambda k: store.create(k, b"x")):
            with pytest.raises(UnsafeEntryError, match=what):
                op(name)
    assert store.list_dir("d") == []
    assert store.walk_files("") == {}
    assert Path("/etc/hostname").read_bytes() != b"x"
    s.close()


def test_another_user_cannot_hardlink_a_root_only_file_into_a_store() -> None:
    """A hardlink is the file itself (no name of it is "outside"), so the store
    cannot refuse one by where it points; what stops a store writer from
    hardlinking the victim's secret in is the kernel's fs.protected_hardlinks
    (a user may hardlink only files it owns or may read and write). Checked
    here as nobody, so a host without it is noticed (docs/confinement.md)."""
    require_other_user()
    try:
        with open("/proc/sys/fs/protected_hardlinks") as f:
            protected = f.read().strip() == "1"
    except OSError:
        protected = False
    if not protected:
        pytest.skip("fs.protected_hardlinks is off on this host: a store writer on the same "
                    "filesystem could hardlink files it cannot read into the store")
    with shared_dir() as d, victim_files() as home:
        store = d / "store"
        store.mkdir()
        give(store)
        p = as_nobody("ln", str(home / "secret"), str(store / "stolen"), check=False)
        assert p.returncode != 0 and "Operation not permitted" in p.stderr, p
        assert not (store / "stolen").exists()
