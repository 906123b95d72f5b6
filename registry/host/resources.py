"""Finding the design card's folders -- ``schemas/``, ``templates/``, ``migrations/``.

In a wheel they are package data under ``registry/_resources/<name>`` (the
build force-includes the repo-root folders there); in a source checkout or an
editable install they are the repo root's folders next to the package.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.resources loads tempfile, shutil, bz2...: on use
    from importlib.resources.abc import Traversable


def resource_dir(name: str) -> Traversable:
    """The folder ``name`` (``"schemas"``, ``"templates"``, ``"migrations"``)."""
    from importlib import resources

    packaged = resources.files("registry") / "_resources" / name
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / name


def resource_path(name: str) -> Path:
    """Like :func:`resource_dir`, as a real filesystem path (Alembic needs one)."""
    return Path(str(resource_dir(name)))
