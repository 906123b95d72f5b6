"""The root command, loading each subcommand's module only when it is run.

A command line call starts a fresh interpreter, so ``registry --version``,
``registry --help`` and ``registry ls`` should not import the modules of
``publish``, ``pull`` or ``serve`` (fsspec, rich, cryptography, SQLAlchemy...).
:data:`COMMANDS` names, for each top-level command or group, the command
modules that register it on :data:`registry.cli.app.app` and the first
paragraph of its help (what ``registry --help`` lists); :class:`LazyRoot`
imports those modules and builds the click command on first use. A test
(tests/test_cli_startup.py) checks the table against the commands themselves.

May import: typer, registry.cli.app; the command modules only by name, on use.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from registry.cli.app import RegistryGroup, RootTyper, app

_I, _R, _L = "registry.cli.index", "registry.cli.release", "registry.cli.lifecycle"

#: name -> (command modules, whether a group, first paragraph of its help), in
#: the order ``registry --help`` lists them
COMMANDS: dict[str, tuple[tuple[str, ...], bool, str]] = {
    "query": ((_I,), False,
              "Ask the index: MODEL_ID --passing [--require M>=V] [--latest], --source ID, or a\n"
              "search: [MODEL_ID] with any of --tag, --since, --dtype, --source (all must match)."),
    "show": ((_I,), False,
             "Manifest summary, each gate with its reason, evals and sources of a release."),
    "ls": ((_I,), False,
           "List models (or those of ORG/), or the releases of MODEL_ID (newest first, passing "
           "or not)."),
    "diff": ((_I,), False,
             "Files added, removed and changed (sha256) between two releases; eval deltas."),
    "publish": ((_R,), False,
                "Release an existing model directory (e.g. a Hugging Face one) as "
                "MODEL_ID@VERSION."),
    "gc": (("registry.cli.gc",), False,
           "Remove abandoned claims, staging dirs, uncommitted leftovers and the\n"
           "temporary files of killed event appends (events/.tmp-*); never a commit."),
    "yank": ((_L,), False,
             "Take a release out of service, its files kept (`registry unyank` undoes it)."),
    "unyank": ((_L,), False,
               "Put a yanked release back in service (recorded, with who and when)."),
    "load": (("registry.cli.load",), False,
             "Stream every tensor of a release into memory, verified piece by piece; "
             "write nothing."),
    "push": (("registry.cli.oci",), False,
             "Push a release to an OCI registry as a ModelPack artifact (signature as a "
             "referrer)."),
    "import": (("registry.cli.oci",), False,
               "Release an OCI model artifact (ours or another tool's ModelPack) through "
               "the gates."),
    "pull": (("registry.cli.pull",), False,
             "Download, verify and place a release where the engine reads it (needs no "
             "index)."),
    "quickstart": (("registry.cli.quickstart",), False,
                   "Run the whole workflow on STORE and DB, printing each step (a few "
                   "minutes at most)."),
    "serve": (("registry.cli.serve",), False,
              "Serve web pages, a JSON API (/api/v1) and the Hugging Face Hub download API, "
              "read-only."),
    "verify": (("registry.cli.verify",), False,
               "Check that DIRECTORY is committed and every file matches its MANIFEST.json."),
    "cache": (("registry.cli.cache",), True, "The pull cache of this host: list, prune, verify."),
    "ckpt": (("registry.cli.ckpt", "registry.cli.loongsage"), True,
             "Checkpoints of training runs (seed 000 and LoongSage trees)."),
    "db": ((_I,), True, "The index database schema."),
    "index": ((_I,), True, "The SQL index derived from the store."),
    "ledger": ((_I,), True, "The live data ledger (revocations)."),
    "snapshot": (("registry.cli.snapshot",), True,
                 "Signed snapshots and timestamps of a model's trust records (yanks, "
                 "tombstones, aliases, revocations, policy)."),
    "keys": (("registry.cli.keys",), True,
             "Signing keys (elliptic curve, PEM) and a local CA for signed releases."),
    "release": ((_R, _L), True, "Releases from checkpoints."),
    "gate": ((_R,), True, "Release gates."),
    "alias": ((_R, "registry.cli.aliases"), True, "Mutable aliases (refs/<alias>) of releases."),
    "policy": ((_R,), True, "Per-model gate thresholds."),
    "tag": ((_L,), True, "Mutable tags of releases (KEY=VALUE)."),
    "events": (("registry.cli.events",), True,
               "The store's event log (events/) and webhook delivery."),
    "config": (("registry.cli.config",), True,
               "The config file and its profiles (store, index, trusted keys, token file)."),
}

#: every command module, in the order that registers the commands as
#: ``docs/cli.md`` lists them (release before aliases, oci and lifecycle's
#: additions to its groups)
MODULES: tuple[str, ...] = tuple(f"registry.cli.{m}" for m in (
    "cache", "ckpt", "index", "keys", "lifecycle", "load", "loongsage", "pull", "quickstart",
    "release", "gc", "serve", "snapshot", "verify", "aliases", "events", "oci", "config"))


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


def first_paragraph(text: str | None) -> str:
    """The first paragraph of a help text, as :data:`COMMANDS` records it."""
    return inspect.cleandoc(text or "").split("\n\n")[0]


RootTyper.loader = load_all  # reading the whole app's commands loads them all
