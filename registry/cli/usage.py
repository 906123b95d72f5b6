"""Usage errors (unknown option, bad value, missing argument) as one line.

typer/click print a usage error as a box of four or five lines; the registry's
contract is one line, ``error: <command>: <what is wrong>``, and the exit code
of :class:`registry.errors.UsageError` in the error table (2). ``--store`` or
``--db`` given to a command that does not read the store or the index says why
it does not apply, instead of "no such option".
"""

from __future__ import annotations

from typing import Any

from registry import errors as E
from registry.cli.errors import exit_code_for


def _params(ctx: Any) -> set[str]:
    cmd = getattr(ctx, "command", None)
    return {o for p in getattr(cmd, "params", ()) for o in getattr(p, "opts", ())}


def _not_here(option: str, command: str, params: set[str]) -> str | None:
    """Why ``--store``/``--db`` does not apply to ``command`` (None: it does)."""
    if option == "--db" and "--store" in params:
        return (f"--db does not apply: {command} reads the store alone, never the "
                "index (--store names the store)")
    if option == "--store" and "--db" in params:
        return (f"--store does not apply: {command} answers from the index alone "
                "(--db names the index)")
    if option in ("--db", "--store"):
        return (f"{option} does not apply: {command} works on this host's files only, "
                "never the store or the index")
    return None


def usage_line(exc: Any) -> tuple[str, int]:
    """The one line (without ``error: ``) and the exit code for a click
    usage error ``exc`` (duck-typed: typer carries its own copy of click)."""
    ctx = getattr(exc, "ctx", None)
    command = getattr(ctx, "command_path", None) or "registry"
    option = getattr(exc, "option_name", None) if type(exc).__name__ == "NoSuchOption" else None
    name = command.removeprefix("registry ") if command != "registry" else command
    why = _not_here(option, name, _params(ctx)) if option else None
    message = why or " ".join(exc.format_message().split())
    if why is None and message:
        message = message[0].lower() + message[1:]
    code = exit_code_for(E.UsageError(message))
    hint = f" (see {command} --help)" if why is None else ""
    return f"{command}: {message.rstrip('.')}{hint}", code
