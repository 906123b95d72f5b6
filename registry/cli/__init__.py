"""Command line interface: parsing, output and exit codes; nothing else.

Each command module builds the library objects, calls them and converts errors
at the boundary (:mod:`registry.cli.errors`).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import typer

from registry import interrupt, numbers
from registry.cli import (  # noqa: F401  (registers commands)
    cache,
    ckpt,
    index,
    keys,
    lifecycle,
    load,
    loongsage,
    pull,
    quickstart,
    release,
    serve,
    snapshot,
    verify,
)
from registry.cli import aliases, events  # noqa: F401,E402  (after release: alias rm, log)
from registry.cli import oci  # noqa: F401,E402  (push, import; after release)
from registry.cli.app import app
from registry.cli.errors import error_document
from registry.cli.usage import usage_line
from registry.words import count


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
    interrupt.terminate_like_interrupt()
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
    if code == interrupt.EXIT_SIGINT:  # typer's answer to KeyboardInterrupt (or Terminated)
        _interrupted(args, as_json)
    sys.exit(code if isinstance(code, int) else 0)


#: commands that write the index after the store: interrupted between the two,
#: the store holds a write the index lacks until `registry index rebuild`
_INDEX_WRITERS = {"publish", "release create", "alias set", "ledger revoke", "policy set",
                  "quickstart", "yank", "unyank", "release delete", "release gc", "tag set",
                  "tag rm"}


def _interrupted(args: list[str], as_json: bool) -> None:
    """One line for SIGINT/SIGTERM, exit 130/143 (docs/errors.md): a write was
    unwound (staging removed, claim released) unless it had committed; a command
    that also indexes says how to index what may have committed."""
    words = [a for a in args if not a.startswith("-")][:2]
    groups = {n for n, c in _command().commands.items() if hasattr(c, "list_commands")}
    command = " ".join(["registry", *words[:2 if words and words[0] in groups else 1]])
    line = f"{command}: interrupted by {interrupt.signal_name()}"
    if command.removeprefix("registry ") in _INDEX_WRITERS:
        line += ("; if the store committed the write first, `registry index rebuild` "
                 "indexes it")
    code = interrupt.exit_code()
    committed = interrupt.unreported_commits()
    if committed:  # the write landed: say so, as the command would have (issue 47)
        _print_committed(committed, as_json)
        line = (f"{command}: interrupted by {interrupt.signal_name()} after the commit "
                "printed above, which stands in the store (do not write it again); "
                "`registry index rebuild` indexes it if the index missed it")
    if as_json:
        doc = error_document("Interrupted", code, line, None)
        print(numbers.dumps(doc, sort_keys=True), file=sys.stderr)
    else:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(code)


def _print_committed(records: list[dict[str, Any]], as_json: bool) -> None:
    """The committed line (or ``--json`` record, with ``"interrupted": true``)
    of each commit an interrupted command made but did not report."""
    for r in records:
        if as_json:
            print(numbers.dumps({**r, "committed": True, "interrupted": True}, sort_keys=True))
        elif r.get("kind") == "release":
            print(f"released {r['model_id']}@{r['version']} at {r['url']}: "
                  f"{count(r['files'], 'file')}, {r['bytes']} bytes, "
                  f"manifest sha256 {r['manifest_sha256']}")
        else:
            print(f"committed {r.get('kind', 'directory')} at {r['url']}: "
                  f"{count(r['files'], 'file')}, {r['bytes']} bytes, "
                  f"manifest sha256 {r['manifest_sha256']}")
    sys.stdout.flush()


__all__ = ["app", "main"]
