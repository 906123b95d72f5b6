"""Another local user for attack tests: ``nobody``, through ``setpriv``.

The tests run as root (the victim: an operator running gc, pull or serve);
the attacker has only what ``nobody`` has: write access where a test grants
it (a store folder as a bucket writer would have, a world-writable cache),
never the victim's files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

NOBODY = 65534
SETPRIV = shutil.which("setpriv")


def require_other_user() -> None:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to act as another user (nobody)")


def as_nobody(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as nobody:nogroup with no supplementary groups."""
    require_other_user()
    p = subprocess.run([SETPRIV or "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                        "--clear-groups", "--", *cmd], capture_output=True, text=True,
                       timeout=120)
    if check:
        assert p.returncode == 0, (cmd, p.stdout, p.stderr)
    return p


def give(path: Path) -> None:
    """Hand ``path`` (a folder tree) to nobody, as a bucket writer owns a bucket."""
    for dirpath, dirs, files in os.walk(path):
        os.chown(dirpath, NOBODY, NOBODY)
        for n in files:
            os.chown(os.path.join(dirpath, n), NOBODY, NOBODY, follow_symlinks=False)


@contextmanager
def shared_dir() -> Iterator[Path]:
    """A fresh folder under /tmp that nobody can traverse (pytest's tmp_path
    is private to root), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="registry-attack-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextmanager
def victim_files() -> Iterator[Path]:
    """The victim's own files: a root-only folder with a secret and a project."""
    with shared_dir() as d:
        home = d / "home-op"
        (home / "projects" / "keep").mkdir(parents=True)
        (home / "projects" / "keep" / "notes.txt").write_text("mine\n")
        (home / "secret").write_text("root-only secret\n")
        os.chmod(home / "secret", 0o600)
        yield home
