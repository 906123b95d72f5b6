"""The root command, loading each subcommand's module only when it is run.

A command line call starts a fresh interpreter, so ``registry --version``,
``registry --help`` and ``registry ls`` should not import the modules of
``publish``, ``pull`` or ``serve`` (fsspec, rich, cryptography, SQLAlchemy...).
:data:`COMMANDS` names, for each top-level command or group, the command
modules that register it on :data:`registry.cli.app.app` and the first
paragraph of its help (what ``registry --help`` lists); :class:`LazyRoot`
imports those modules and builds the click command on first use. The table
lives in :mod:`registry.cli.table` (no typer), which also writes the root's
plain ``--help``; a test (tests/test_cli_startup.py) checks it against the
commands themselves.

May import: typer, registry.cli.app, registry.cli.table; the command modules
only by name, on use.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from registry.cli.app import RegistryGroup, RootTyper, app
from registry.cli.table import COMMANDS, MODULES, first_paragraph

def load_all() -> None:
    """Import every command module (each registers its commands on ``app``):
    what ``typer.main.get_command(app)`` needs to see the whole command tree."""
    app._registering += 1
    try:
        for module in MODULES:
            importlib.import_module(module)
    finally:
        app._registering -= 1


def _stub(name: str) -> Any:
    """A placeholder carrying ``name``'s listed help: what the root's
    ``--help`` renders without importing the command's module."""
    _, group, text = COMMANDS[name]
    return (TyperGroup if group else TyperCommand)(name=name, help=text)


class LazyRoot(RegistryGroup):
    """The ``registry`` group: :data:`COMMANDS` lists its commands; a command
    is built (its modules imported) when it is looked up to run."""

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in COMMANDS:
            return None
        if self._listing:
            return _stub(name)
        if name not in self.commands:
            self.commands[name] = build(name)
        return self.commands[name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def build(name: str) -> Any:
    """The click command (or group) ``name`` of :data:`COMMANDS`, its modules
    imported.

    Raises:
        LookupError: no module of the table registers ``name`` (a table out of date).
    """
    app._registering += 1
    try:
        for module in COMMANDS[name][0]:
            importlib.import_module(module)
    finally:
        app._registering -= 1
    short = app.pretty_exceptions_short
    for info in app._commands:
        callback_name = info.callback.__name__ if info.callback else ""
        if (info.name or typer.main.get_command_name(callback_name)) == name:
            return typer.main.get_command_from_info(
                info, pretty_exceptions_short=short, rich_markup_mode=app.rich_markup_mode)
    for group in app._groups:
        if group.name == name:
            return typer.main.get_group_from_info(
                group, pretty_exceptions_short=short, rich_markup_mode=app.rich_markup_mode,
                suggest_commands=app.suggest_commands)
    raise LookupError(f"registry.cli.commands: no module of {COMMANDS[name][0]} "
                      f"registers {name!r}")


def root() -> Any:
    """The root click group: the root options and callback of ``app``, with
    :data:`COMMANDS` loaded on use."""
    bare = typer.Typer(**{k: getattr(app.info, k) for k in ("name", "help", "no_args_is_help")},
                       cls=LazyRoot, pretty_exceptions_enable=False, add_completion=False)
    bare.registered_callback = app.registered_callback
    return typer.main.get_command(bare)


__all__ = ["COMMANDS", "MODULES", "LazyRoot", "build", "first_paragraph", "load_all", "root"]

RootTyper.loader = load_all  # reading the whole app's commands loads them all
