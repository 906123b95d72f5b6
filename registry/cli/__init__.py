"""Command line interface: parsing, output and exit codes; nothing else.

Each command module builds the library objects, calls them and converts errors
at the boundary (:mod:`registry.cli.errors`).

``import registry.cli`` loads neither typer nor any command: ``registry
--version`` and the root's ``--help`` (registry.cli.table) answer before
typer loads, and the root command imports a
command's module only when it runs (:mod:`registry.cli.commands`).
``registry.cli.app`` is the Typer app (:mod:`registry.cli.app`'s ``app``),
loaded on first use.


Rooms it may import (tests/test_house.py keeps this list): any room.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any, NoReturn

from registry.host import interrupt
from registry.rules import numbers
from registry.rules.words import count


class _Package(types.ModuleType):
    """This package's module type: its ``app`` attribute is the Typer app,
    loaded on first use, never the submodule of the same name (which the
    import system would bind there when it loads it)."""

    @property
    def app(self) -> Any:
        import registry.cli.commands  # noqa: F401  (reading its commands loads them all)
        from registry.cli.app import app

        return app

    @app.setter
    def app(self, value: Any) -> None:
        pass  # the submodule registry.cli.app: the property answers instead


sys.modules[__name__].__class__ = _Package


@functools.cache
def _command() -> Any:
    """The root click command (built once): the root options, and each command
    built from its module when it runs (registry.cli.commands)."""
    from registry.cli.commands import root

    return root()


def main() -> None:
    """Entry point of the ``registry`` console script.

    A usage error (unknown option, missing argument, a value of the wrong
    kind, ``--db``/``--store`` where they do not apply) is one line on stderr,
    ``error: <command>: <what is wrong>``, and exit 2 (the error table's
    UsageError); with ``--json`` anywhere on the line, the JSON error document.
    A group given no command prints its help (exit 2).
    """
    args = sys.argv[1:]
    if args == ["--version"]:  # the answer needs no typer, no command
        from registry import __version__

        print(f"registry {__version__}")
        sys.exit(0)
    if args in ([], ["--help"]):  # the table says it all: no typer, click nor rich
        from registry.cli.table import root_help

        sys.stdout.write(root_help())
        sys.exit(0 if args else 2)  # no command: click's exit code for it
    as_json = "--json" in args
    interrupt.terminate_like_interrupt()
    if args[0] in ("ls", "show"):  # a plain read line is answered before typer loads
        from registry.cli.reads import run

        answered = run(args)
        if answered is not None:
            if answered == interrupt.EXIT_SIGINT:
                _interrupted(args, as_json)
            sys.exit(answered)
    try:
        code = _command().main(args=args, standalone_mode=False, prog_name="registry")
    except Exception as exc:
        # click's ClickException (UsageError, BadParameter...): duck-typed, since
        # typer carries its own copy of click
        if not (hasattr(exc, "exit_code") and hasattr(exc, "format_message")):
            raise
        from registry.cli.usage import usage_line

        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message())
            sys.exit(exc.exit_code)
        line, code = usage_line(exc)
        _exit_with_error("UsageError", code, line, as_json)
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
    from registry.cli.table import COMMANDS

    groups = {n for n, (_, group, _) in COMMANDS.items() if group}
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
    _exit_with_error("Interrupted", code, line, as_json)


def _exit_with_error(cls: str, code: int, line: str, as_json: bool) -> NoReturn:
    """One ``error:`` line on stderr (``--json``: the error document), then exit
    ``code``: outside typer, where :func:`registry.cli.errors.fail` cannot run."""
    if as_json:
        from registry.cli.errors import error_document

        print(numbers.dumps(error_document(cls, code, line, None), sort_keys=True),
              file=sys.stderr)
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
