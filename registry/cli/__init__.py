"""Command line interface: parsing, output and exit codes; nothing else.

Each command module builds the library objects, calls them and converts errors
at the boundary (:mod:`registry.cli.errors`).
"""

from __future__ import annotations

import sys

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


def main() -> None:
    """Entry point of the ``registry`` console script.

    With ``--json`` anywhere on the line, a usage error (unknown option,
    missing argument, bad integer) is reported as the JSON error document on
    stderr too, not as click's text box.
    """
    args = sys.argv[1:]
    if "--json" not in args:
        app()
        return
    try:
        code = app(args=args, standalone_mode=False)
    except Exception as exc:
        # click's ClickException (UsageError, BadParameter...): duck-typed, since
        # typer may carry its own copy of click
        if not (hasattr(exc, "exit_code") and hasattr(exc, "format_message")):
            raise
        doc = error_document("UsageError", exc.exit_code, exc.format_message(), None)
        print(numbers.dumps(doc, sort_keys=True), file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


__all__ = ["app", "main"]
