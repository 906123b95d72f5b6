"""Another local user against a host's marks (issue 50 item 6: a second uid where it matters).

The marks (:mod:`registry.trust.marks`) are what a host saw: erase them and a
removed yank is lifted unseen. The attacker is a real other uid
(``regtestuser``, created here when absent, run through ``setpriv``); it may
write only where the operator's modes let it. Each door -- ``registry pull`` and
the weights reader ``registry load``, real processes -- must refuse marks it
could have written, rather than read them as "nothing seen" (without the check
in ``Marks._state`` each attack below loads a yanked release, exit 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from registry.lifecycle.yank import yank
from registry.release import ModelRelease
from registry.store import open_store
from registry.trust.marks import marks_path
from tests.release_util import ledger_row, summary
from tests.test_signing import model_dir

REPO = Path(__file__).resolve().parents[1]
USER = "regtestuser"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root (to create and become another uid) and setpriv")


@pytest.fixture(scope="module")
def other_uid() -> int:
    import pwd

    try:
        return pwd.getpwnam(USER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", USER], check=True,
                       capture_output=True, timeout=60)
        return pwd.getpwnam(USER).pw_uid


def as_other(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups",
                           *argv], capture_output=True, text=True, timeout=120)


@pytest.fixture
def world(any_uid_dir: Path) -> Path:
    return any_uid_dir


def door(world: Path, kind: str, to: str) -> subprocess.CompletedProcess[str]:
    """``registry pull`` or ``registry load`` of m@1 as root, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "REGISTRY_CACHE": str(world / "cache")}
    common = ["--store", str(world / "store"), "--cache", str(world / "cache")]
    argv = (["pull", "m@1", "--to", str(world / to), "--quiet"] if kind == "pull"
            else ["load", "m@1", "--check", "--json"])
    return subprocess.run([sys.executable, "-m", "registry", *argv, *common],
                          capture_output=True, text=True, timeout=300, env=env)


def seen_yanked(world: Path) -> Path:
    """m@1 published, seen yanked by this host (its marks), then un-yanked by a
    store writer who deletes the record. Returns the marks file."""
    store = open_store(str(world / "store"))
    ModelRelease(store).publish(model_dir(world), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    yank(store, "m", "1", "bad weights")
    refused = door(world, "pull", "seen")
    assert refused.returncode != 0 and "yanked" in refused.stderr, refused.stderr
    store.delete("ledger/yanks/m/1.json")
    marks = marks_path(world / "cache", store.url)
    assert marks.exists()
    return marks


@pytest.mark.parametrize("kind", ["pull", "load"])
def test_marks_in_a_folder_another_user_can_write_are_refused(
        world: Path, other_uid: int, kind: str) -> None:
    marks = seen_yanked(world)
    (world / "cache").chmod(0o755)
    marks.parent.chmod(0o777)  # the operator's mistake
    # the other user replaces the marks file with one that saw nothing
    p = as_other("sh", "-c", f"rm -f {marks} && echo '{{}}' > {marks}")
    assert p.returncode == 0, p.stderr
    assert marks.stat().st_uid == other_uid
    got = door(world, kind, "out")
    assert got.returncode == 6, (got.returncode, got.stdout, got.stderr)
    assert str(marks.parent) in got.stderr and "writable by other users" in got.stderr
    assert not (world / "out").exists()
    # the folder fixed, the file the other user wrote is still refused by name
    marks.parent.chmod(0o700)
    got = door(world, kind, "out")
    assert got.returncode == 6 and str(marks) in got.stderr, got.stderr
    assert f"owned by uid {other_uid}" in got.stderr


def test_marks_planted_before_first_use_in_a_world_writable_cache_are_refused(
        world: Path, other_uid: int) -> None:
    """The cache folder is 0777 (made under umask 000): the other user makes its
    marks folder first, holding marks of its own."""
    store = open_store(str(world / "store"))
    ModelRelease(store).publish(model_dir(world), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    cache = world / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    marks = marks_path(cache, store.url)
    p = as_other("sh", "-c", f"mkdir -m 755 {marks.parent} && echo '{{}}' > {marks}")
    assert p.returncode == 0, p.stderr
    got = door(world, "load", "out")
    assert got.returncode == 6, (got.returncode, got.stdout, got.stderr)
    assert "writable by other users" in got.stderr or f"uid {other_uid}" in got.stderr
