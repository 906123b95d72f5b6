"""Command line interface: parsing, output and exit codes; nothing else.

Each command module builds the library objects, calls them and converts errors
at the boundary (:mod:`registry.cli.errors`).
"""

from __future__ import annotations

from registry.cli import ckpt, index, pull, quickstart, release, serve, verify  # noqa: F401  (registers commands)
from registry.cli.app import app


def main() -> None:
    """Entry point of the ``registry`` console script."""
    app()


__all__ = ["app", "main"]
