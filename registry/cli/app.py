"""The typer application and options shared by every command.

Every command and group is built with :class:`RegistryCommand` /
:class:`RegistryGroup`, which give each parameter an explicit metavar (an
argument its own name, ``MODEL_DIR``; an option the kind of value it takes,
``PATH``, ``URL``; a flag none) and write usage lines as ``ARG`` / ``[ARG]``,
so ``--help`` reads the same whatever typer/click versions render it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from registry.cli.output import echo, print_json
from registry.cli.profile import PROFILE_DEFAULTS

if TYPE_CHECKING:
    from registry.store import Store


def _fix_metavar(param: Any) -> None:
    """Give ``param`` an explicit metavar unless it has one: arguments their
    upper-case name, flags none (so they do not look like taking a value),
    other options their upper-case name."""
    if param.param_type_name == "argument" and hasattr(param, "display_type_rich"):
        # typer >= 0.16 prints a ``<str>`` type column beside the name: the
        # name already says what to give
        param.display_type_rich = lambda ctx: None
    if getattr(param, "metavar", None) is not None:
        return
    if getattr(param, "is_flag", False) or getattr(param, "is_bool_flag", False):
        param.metavar = ""
    else:
        param.metavar = (param.name or "").upper()


class RegistryContext(typer.Context):
    """A click context whose defaults come from the config file's profile
    (registry.host.config) when neither the flag nor its environment variable is
    given: click asks ``lookup_default`` only then, so the order is flag >
    environment variable > profile > built-in default."""

    def lookup_default(self, name: str, call: bool = True) -> Any:
        value = super().lookup_default(name, call)
        if value is None:
            value = self.find_root().meta.get(PROFILE_DEFAULTS, {}).get(name)
        return value


class _NamesItsCommand:
    """Parsing errors name their command: the parser raises some (an option
    missing its value) without a context, which would name only ``registry``.
    Its contexts read the profile's defaults (:class:`RegistryContext`), and its
    parameters show the metavars we chose (see module doc)."""

    context_class = RegistryContext

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            _fix_metavar(p)
        return params

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)  # type: ignore[misc]
        except Exception as exc:
            if hasattr(exc, "format_message") and getattr(exc, "ctx", ctx) is None:
                exc.ctx = ctx  # type: ignore[attr-defined]
            raise


class RegistryCommand(_NamesItsCommand, TyperCommand):
    """A typer command whose help shows the metavars we chose (see module doc)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = p.metavar or (p.name or "").upper()
                pieces.append(name if p.required else f"[{name}]")
        return pieces


class RegistryGroup(_NamesItsCommand, TyperGroup):
    """A typer group whose options (``--debug``, ``--help``) show no value."""


class RegistryTyper(typer.Typer):
    """typer.Typer whose commands and groups are RegistryCommand / RegistryGroup."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", RegistryGroup)
        super().__init__(**kw)

    def command(self, *args: Any, **kw: Any) -> Callable[..., Any]:
        kw.setdefault("cls", RegistryCommand)
        return super().command(*args, **kw)


class RootTyper(RegistryTyper):
    """The root app. Its command modules register on it when imported
    (registry.cli.commands imports only the one a command line runs); reading
    ``registered_commands`` / ``registered_groups`` from outside a registration
    (``typer.main.get_command(app)``, a test's CliRunner) imports them all
    first, so the whole tree is there."""

    _registering = 0  # > 0 while registry.cli.commands imports command modules
    _loaded = False
    #: imports every command module: registry.cli.commands.load_all, set when
    #: that module loads (``registry.cli.app`` of the package loads it)
    loader: Callable[[], None] | None = None

    def command(self, *args: Any, **kw: Any) -> Callable[..., Any]:
        decorator = super().command(*args, **kw)

        def register(f: Any) -> Any:
            self._registering += 1  # a module registering itself loads no other
            try:
                return decorator(f)
            finally:
                self._registering -= 1

        return register

    def add_typer(self, *args: Any, **kw: Any) -> None:
        self._registering += 1
        try:
            super().add_typer(*args, **kw)
        finally:
            self._registering -= 1

    def _all(self) -> None:
        if not self._registering and not RootTyper._loaded and RootTyper.loader is not None:
            RootTyper._loaded = True
            RootTyper.loader()

    @property  # type: ignore[override]
    def registered_commands(self) -> list[Any]:
        self._all()
        return self._commands

    @registered_commands.setter
    def registered_commands(self, value: list[Any]) -> None:
        self._commands = value

    @property  # type: ignore[override]
    def registered_groups(self) -> list[Any]:
        self._all()
        return self._groups

    @registered_groups.setter
    def registered_groups(self, value: list[Any]) -> None:
        self._groups = value


app = RootTyper(
    name="registry",
    help="Object-store-backed registry for model directories: checkpoints, releases, "
         "gates and pull.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from registry import __version__

        echo(f"registry {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the package version and exit.")] = False,
    log_format: Annotated[str | None, typer.Option(
        "--log-format", envvar="REGISTRY_LOG_FORMAT", metavar="FORMAT",
        help="text (default) or json: errors, and serve's request log, as one JSON "
             "object per line.")] = None,
    metrics_file: Annotated[str | None, typer.Option(
        "--metrics-file", envvar="REGISTRY_METRICS_FILE", metavar="PATH",
        help="Write the command's Prometheus metrics to this node-exporter textfile "
             "(*.prom) when it ends.")] = None,
    metrics_push: Annotated[str | None, typer.Option(
        "--metrics-push", envvar="REGISTRY_METRICS_PUSH", metavar="URL",
        help="Push the command's Prometheus metrics to this Pushgateway when it ends.")
    ] = None,
    profile: Annotated[str | None, typer.Option(
        "--profile", envvar="REGISTRY_PROFILE", metavar="NAME",
        help="Profile of the config file to take settings from (flags and environment "
             "variables still win; docs/configuration.md).")] = None,
) -> None:
    """Object-store-backed registry for model directories."""
    if debug:
        os.environ["REGISTRY_DEBUG"] = "1"
    from registry.cli.errors import error_boundary
    from registry.cli.observe import start
    from registry.cli.profile import apply_profile

    # the command's --json is not parsed yet: the console script's argv says it
    with error_boundary(log_format == "json" or "--json" in sys.argv[1:]):
        apply_profile(ctx, profile)
    with error_boundary(log_format == "json"):
        start(ctx, log_format=log_format, metrics_file=metrics_file, metrics_push=metrics_push)
    # memory:// stores live only inside one process: a command line cannot use them
    from registry.store import refuse_memory_stores

    ctx.call_on_close(refuse_memory_stores())


StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="REGISTRY_STORE", metavar="URL",
                 help="Store URL: a folder, file:// or s3://bucket/prefix "
                      "(default: ./artifacts)."),
]
DbOpt = Annotated[
    str | None,
    typer.Option("--db", envvar="REGISTRY_DB", metavar="URL",
                 help="Index database URL: sqlite:///path.db or "
                      "postgresql+psycopg://user@host/db (default: sqlite:///registry.db)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of "
                                                      "text (errors: one on stderr).")]


def nothing_stored(store: Store, key: str) -> bool:
    """True when nothing is stored at ``key``: an unknown run, tree, directory or
    model. On local disk a missing folder answers at once (and a store folder
    that is itself missing is left to the store's own error, unless ``key`` is
    the store itself: a directory given as an argument); elsewhere an empty
    listing does."""
    path, root = store.local_path(key), store.local_path("")
    if path is not None and root is not None:
        if not os.path.isdir(path) and (key == "" or os.path.isdir(root)):
            return True
    return not store.list_dir(key)


