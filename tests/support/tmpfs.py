"""A real small filesystem for tests that fill a disk."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's words: ``2m``) mounted on the new folder
    ``where``, unmounted after; a skip where mounting is not permitted."""
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)
