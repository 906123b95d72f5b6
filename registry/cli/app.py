"""The typer application and options shared by every command."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

app = typer.Typer(
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

        typer.echo(f"registry {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print the package version and exit.")] = False,
) -> None:
    """Object-store-backed registry for model directories."""
    if debug:
        os.environ["REGISTRY_DEBUG"] = "1"


StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="REGISTRY_STORE",
                 help="Store URL: a folder, s3://bucket/prefix or memory://x "
                      "(default: ./artifacts)."),
]
DbOpt = Annotated[
    str | None,
    typer.Option("--db", envvar="REGISTRY_DB",
                 help="Index database URL: sqlite:///path.db or "
                      "postgresql+psycopg://user@host/db (default: sqlite:///registry.db)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, sort_keys=True, default=str))
