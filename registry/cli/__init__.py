"""Command line interface: parsing, output and exit codes; nothing else.

Each command module builds the library objects, calls them and converts errors
at the boundary (:mod:`registry.cli.errors`).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import typer

from registry import numbers
from registry.cli import (  # noqa: F401  (registers commands)
    cache,
    ckpt,
    index,
    keys,
    loongsage,
    pull,
    quickstart,
    release,
    serve,
    verify,
)
from registry.cli.app import app
from registry.cli.errors import error_document
from registry.cli.usage import usage_line


@functools.cache
def _command() -> Any:
    """The click command typer builds from :data:`app` (built once: a few
    hundred ms, which a process calling :func:`main` per case pays once)."""
    return typer.main.get_command(app)


def main() -> None:
    """Entry point of the ``registry`` console script.

    A usage error (unknown option, missing argument, a value of the wrong
    kind, ``--db``/``--store`` where they do not apply) is one line on stderr,
    ``error: <command>: <what is wrong>``, and exit 2 (the error table's
    UsageError); with ``--json`` anywhere on the line, the JSON error document.
    A group given no command prints its help (exit 2).
    """
    args = sys.argv[1:]
    as_json = "--json" in args
    try:
        code = _command().main(args=args, standalone_mode=False, prog_name="registry")
    except Exception as exc:
        # click's ClickException (UsageError, BadParameter...): duck-typed, since
        # typer carries its own copy of click
        if not (hasattr(exc, "exit_code") and hasattr(exc, "format_message")):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message())
            sys.exit(exc.exit_code)
        line, code = usage_line(exc)
        if as_json:
            doc = error_document("UsageError", code, line, None)
            print(numbers.dumps(doc, sort_keys=True), file=sys.stderr)
        else:
            print(f"error: {line}", file=sys.stderr)
        sys.exit(code)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
