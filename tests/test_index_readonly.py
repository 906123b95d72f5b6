"""A read-only SQLite index (issue 14, item 3): a serving host or a dashboard
reading an index on a read-only volume (a mounted snapshot).

The volume is real: the test folder is bind-mounted read-only over itself in
a private mount namespace (``unshare -m``), so nothing outside the child
process sees it, and the CLI runs there as a real process. Readers (``ls``,
``query``, ``show``) answer exactly as on a writable copy, in WAL mode,
converted out of it, and from a snapshot whose ``-wal`` file still holds a
committed change; writers of the index alone (``db upgrade``, ``index
rebuild``) exit 8 with one line naming the read-only file; ``alias set`` and
``ledger revoke`` commit to the store and warn, naming it. The index file is
never changed.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from registry.api import Registry
from tests.conftest import CLI_BATCH
from tests.release_util import ledger_row, summary
from tests.test_pull import release_files

READERS = [["ls", "tiny"], ["query", "tiny", "--passing"], ["show", "tiny@1"],
           ["query", "--source", "wiki"]]


def batch(volume: Path | None, commands: list[list[str]]) -> list[list[object]]:
    """Run CLI ``commands`` in one fresh process (tests.conftest.CLI_BATCH:
    through registry.cli.main), with ``volume`` mounted read-only over itself
    when given; returns [exit code, stdout, stderr] per command."""
    argv = [sys.executable, "-c", CLI_BATCH]
    if volume is not None:
        vol = shlex.quote(str(volume))
        argv = ["unshare", "-m", "sh", "-c", f"mount --bind {vol} {vol} && "
                f"mount -o remount,bind,ro {vol} && exec {shlex.join(argv)}"]
    p = subprocess.run(argv, input=json.dumps(commands), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def ro_cli(volume: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m registry ARGV`` with ``volume`` mounted read-only over itself."""
    cmd = shlex.join([sys.executable, "-m", "registry", *argv])
    vol = shlex.quote(str(volume))
    script = f"mount --bind {vol} {vol} && mount -o remount,bind,ro {vol} && exec {cmd}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    probe = tmp_path / "probe"
    probe.mkdir()
    p = subprocess.run(["unshare", "-m", "sh", "-c",
                        f"mount --bind {probe} {probe} && mount -o remount,bind,ro {probe} "
                        f"&& ! touch {probe}/x 2>/dev/null"], capture_output=True)
    if shutil.which("unshare") is None or p.returncode != 0:
        pytest.skip("cannot make a read-only mount here (needs root and unshare)")
    vol = tmp_path / "vol"
    vol.mkdir()
    return vol


def build(volume: Path, tmp_path: Path, *, store_inside: bool = True) -> tuple[str, str]:
    """A store with release tiny@1 (alias prod) and its SQLite index in ``volume``."""
    store = str((volume if store_inside else tmp_path) / "store")
    db = f"sqlite:///{volume / 'registry.db'}"
    reg = Registry(store, db=db)
    src = tmp_path / "src"
    src.mkdir()
    for rel, data in release_files().items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    reg.publish(src, "tiny", "1", ledger=[ledger_row()], eval_summary=summary(0.9, 0.5))
    reg.set_alias("tiny", "prod", "1")
    reg.close()
    return store, db


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("journal", ["wal", "delete", "wal-snapshot"])
def test_readers_answer_from_a_read_only_volume(volume: Path, tmp_path: Path,
                                                journal: str) -> None:
    store, db = build(volume, tmp_path)
    dbfile = volume / "registry.db"
    commands = [[*argv, "--json", "--store", store, "--db", db] for argv in READERS]
    con = sqlite3.connect(dbfile)
    if journal == "delete":
        con.execute("PRAGMA journal_mode=DELETE")
        con.close()
    elif journal == "wal-snapshot":
        # The snapshot is taken while a writer's committed change is still only
        # in the -wal file (nothing checkpointed yet).
        con.execute("PRAGMA wal_autocheckpoint=0")
        con.execute("UPDATE releases SET dtype = 'from-the-wal'")
        con.commit()
        snap = tmp_path / "snap"
        shutil.copytree(volume, snap)
        con.close()
        assert (snap / "registry.db-wal").stat().st_size > 0
        shutil.rmtree(volume)
        shutil.copytree(snap, volume)
        shutil.rmtree(snap)
    else:
        con.close()
    writable = tmp_path / "writable-copy"
    shutil.copytree(volume, writable)
    expected = batch(None, [[a.replace(str(volume), str(writable)) for a in c]
                            for c in commands])
    assert all(code == 0 for code, _, _ in expected), expected
    if journal == "wal-snapshot":
        assert "from-the-wal" in str(expected[0][1])
    before = digest(dbfile)
    got = batch(volume, commands)
    for argv, (code, out, err), (_, want, _) in zip(READERS, got, expected, strict=True):
        assert code == 0, (argv, err)
        assert out == str(want).replace(str(writable), str(volume)), argv
    assert digest(dbfile) == before


@pytest.mark.parametrize("argv", [
    ["alias", "set", "tiny", "staging", "1"],
    ["db", "upgrade"],
    ["index", "rebuild"],
    ["ledger", "revoke", "wiki", "--reason", "withdrawn"],
])
def test_writers_are_told_the_index_is_read_only(volume: Path, tmp_path: Path,
                                                 argv: list[str]) -> None:
    """The store is writable here (outside the volume), so the index is what
    refuses, naming the file: exit 8 for what writes only the index. An
    alias or a revocation is committed to the store first (the store is the
    truth); its index update fails with exit 10 and the line that names the
    read-only file and ``registry index rebuild``."""
    store, db = build(volume, tmp_path, store_inside=False)
    dbfile = volume / "registry.db"
    before = digest(dbfile)
    extra = ["--db", db] if argv[0] == "db" else ["--store", store, "--db", db]
    p = ro_cli(volume, *argv, *extra)
    assert "Traceback" not in p.stderr, p.stderr
    assert str(dbfile) in p.stderr and "read-only" in p.stderr, p.stderr
    if argv[0] in ("ledger", "alias"):  # committed, not indexed: exit 10 (the CLI contract)
        assert p.returncode == 10 and "registry index rebuild" in p.stderr, p.stderr
    else:
        assert p.returncode == 8, (p.returncode, p.stderr)
        assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1
    assert digest(dbfile) == before
